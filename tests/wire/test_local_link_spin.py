"""A local link's receive looks for bytes awake for a few microseconds before it sleeps
(fiberlite.wire.link.local): replies that come at once are taken without a wake-up, and a
reader whose peer is quiet soon stops looking."""
from __future__ import annotations

import os
import threading

import pytest

from fiberlite.wire.link import awake, stream
from fiberlite.wire.link.local import LocalLink, available

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not available(), reason="local links are Linux's")]


def _pair() -> tuple[LocalLink, LocalLink]:
    """(reader, writer): a listening end and the end that dialed it."""
    key = os.urandom(32)
    reader = LocalLink.listen(key)
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(reader.accept(key)))
    thread.start()
    writer = LocalLink.dial(reader.address, key)
    thread.join()
    assert accepted == [True]
    return reader, writer


class _CountingSocket:
    """A socket whose non-blocking reads are counted."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.looks = 0

    def recv_into(self, into, room, flags=0):
        self.looks += 1
        return self.sock.recv_into(into, room, flags)


@pytest.mark.skipif(not awake.SPIN_SECONDS, reason="one CPU: receives never spin")
def test_a_reader_with_nothing_to_read_looks_ever_more_rarely_and_again_once_a_frame_came(monkeypatch):
    monkeypatch.setattr(awake, "spare_cpu", lambda: True)  # (whatever else runs meanwhile)
    reader, writer = _pair()
    try:
        counting = _CountingSocket(reader._sock)
        gaps, skipped = [], 0  # calls that did not look, between two that did
        for _ in range(400):
            before = counting.looks
            assert reader._spin(counting, reader._view, stream.CHUNK) is None  # nothing came
            if counting.looks == before:
                skipped += 1
            else:
                gaps.append(skipped)
                skipped = 0
        # each look that found nothing makes the next calls skip 1, 2, 4, ... up to 64
        assert gaps[:7] == [0, 1, 2, 4, 8, 16, 32]
        assert set(gaps[7:]) == {awake.SPIN_SKIP_MAX}

        assert writer.send(b"frame", timeout_ms=-1)
        while reader._awake._skip:  # the calls it still skips from the last miss
            assert reader._spin(counting, reader._view, stream.CHUNK) is None
        got = reader._spin(counting, reader._view, stream.CHUNK)
        assert got == stream.HEADER.size + len(b"frame")
        reader._end += got
        assert reader._buffered() == b"frame"
        # a hit: the next looks are half as rare as they were
        assert (reader._awake._skip, reader._awake._misses) == (0, awake.SPIN_SKIP_MAX // 2)
    finally:
        reader.close()
        writer.close()


def test_frames_sent_back_and_forth_arrive_whole_and_in_order_whether_awake_or_asleep():
    there, back_writer = _pair()   # main -> echo
    back, there_writer = _pair()   # echo -> main
    rounds = 3000

    def echo() -> None:
        for _ in range(rounds):
            frame = there.recv()
            assert there_writer.send(frame, timeout_ms=-1)

    thread = threading.Thread(target=echo)
    thread.start()
    try:
        for i in range(rounds):
            payload = i.to_bytes(4, "little") * (1 + i % 50)
            assert back_writer.send(payload, timeout_ms=-1)
            assert back.recv() == payload
    finally:
        thread.join(30)
        for link in (there, back_writer, back, there_writer):
            link.close()
    assert not thread.is_alive()
