"""Looking awake before sleeping (fiberlite.wire.link.awake) only while the machine has a
CPU to spare: a look on a busy machine takes the CPU from the peer it waits for."""
from __future__ import annotations

import os

import pytest

from fiberlite.wire.link import awake


def _load_reading(tmp_path, text: str) -> awake._Load:
    path = tmp_path / "loadavg"
    path.write_text(text)
    load = awake._Load()
    if load._fd is not None:
        os.close(load._fd)
    load._fd = os.open(path, os.O_RDONLY)
    return load


def test_the_machine_has_a_cpu_to_spare_while_no_more_threads_are_ready_than_cpus(tmp_path, monkeypatch):
    monkeypatch.setattr(awake, "_CPUS", 2)
    load = _load_reading(tmp_path, "0.50 0.40 0.30 2/345 6789\n")
    try:
        assert load.spare()
        (tmp_path / "loadavg").write_text("9.50 8.40 7.30 5/345 6789\n")
        assert load.spare()   # (as read a moment ago: read again once BUSY_CHECK_SECONDS passed)
        load._until = 0.0
        assert not load.spare()
    finally:
        os.close(load._fd)


def test_a_look_on_a_busy_machine_sleeps_at_once_and_keeps_its_pace(monkeypatch):
    if not awake.SPIN_SECONDS:
        pytest.skip("one CPU: nothing ever looks awake")
    tries: list = []

    def attempt() -> bytes:
        tries.append(1)
        raise BlockingIOError
    looking = awake.Awake()
    monkeypatch.setattr(awake, "spare_cpu", lambda: False)
    assert looking.look(attempt) is None
    assert tries == [] and (looking._skip, looking._misses) == (0, 0)
    monkeypatch.setattr(awake, "spare_cpu", lambda: True)
    assert looking.look(lambda: b"frame") == b"frame"
    assert looking.look(attempt) is None and tries   # looked, found nothing: rarer from now
    assert looking._skip == 1
