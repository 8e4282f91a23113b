"""Length-prefixed frames on a stream socket (fiberlite.wire.frames), as a pool host and
its workers exchange them."""
import os
import random
import socket
import threading
from multiprocessing.connection import Connection

import pytest

from fiberlite.wire.frames import FrameSocket


def _pair() -> tuple[Connection, FrameSocket]:
    a, b = socket.socketpair()
    return Connection(a.detach()), FrameSocket(b.detach())


def test_frames_of_every_size_arrive_whole_and_in_order():
    writer, reader = _pair()
    sizes = [0, 1, 3, 4, 16383, 16384, 16385, 100_000, 20_000_000, 7] + [
        random.randrange(0, 50_000) for _ in range(200)]
    frames = [os.urandom(min(n, 64)) + bytes(max(0, n - 64)) for n in sizes]
    sender = threading.Thread(target=lambda: [writer.send_bytes(f) for f in frames])
    sender.start()
    received = [reader.recv_bytes() for _ in frames]
    sender.join()
    assert received == frames


def test_a_frame_cut_anywhere_is_put_back_together():
    a, b = socket.socketpair()
    reader = FrameSocket(b.detach())
    frames = [os.urandom(n) for n in (10, 0, 300, 5)]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    got = []
    for i in range(len(stream)):  # one byte at a time: every cut point
        a.sendall(stream[i:i + 1])
        got.extend(reader.read_frames())
    assert got == frames


def test_what_the_reader_sends_a_connection_reads():
    writer, reader = _pair()
    for n in (0, 5, 16385, 3_000_000):
        data = os.urandom(n)
        sender = threading.Thread(target=reader.send_bytes, args=(data,))
        sender.start()
        assert writer.recv_bytes() == data
        sender.join()


def test_a_closed_end_is_eof():
    writer, reader = _pair()
    writer.send_bytes(b"last")
    writer.close()
    assert reader.recv_bytes() == b"last"
    with pytest.raises(EOFError):
        reader.read_frames()
