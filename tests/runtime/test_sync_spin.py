"""A wait on a shared word looks at it awake for a moment before it sleeps, and stops
doing so for a word that keeps not changing in that moment (its partner answers in
hundreds of microseconds, through a hub), so that such waits cost next to no CPU."""
from __future__ import annotations

import ctypes
import os

import pytest

from fiberlite.runtime.shm import _sync

pytestmark = pytest.mark.timeout(60)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: waits never look awake")
def test_waits_on_a_word_that_never_changes_in_time_soon_stop_looking_awake():
    word = ctypes.c_uint32(5)
    address, waits = ctypes.addressof(word), 400
    before = _sync.looks_awake()
    for _ in range(waits):
        assert _sync.wait(address, 5, 0.001) is False  # times out: nothing changes it
    looked = _sync.looks_awake() - before
    # backing off 1, 2, 4 ... 64 waits after each miss looks about 12 times in 400 (the
    # count is the process's: other threads' waits may add a few)
    assert 1 <= looked <= 60, f"{looked} of {waits} waits looked awake"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: waits never look awake")
def test_a_word_that_changes_while_looked_at_is_looked_at_again():
    word = ctypes.c_uint32(5)
    address = ctypes.addressof(word)
    for _ in range(100):  # backed off
        _sync.wait(address, 5, 0.0005)
    word.value = 6
    assert _sync.wait(address, 5, 5.0) is True  # differs already: at once
    before = _sync.looks_awake()
    for _ in range(70):  # the back-off runs out (64 at most), then a look that finds 6
        assert _sync.wait(address, 5, 5.0) is True
    assert _sync.looks_awake() - before >= 1
    before = _sync.looks_awake()
    for _ in range(20):  # found a change: each wait looks again
        _sync.wait(address, 5, 5.0)
    assert _sync.looks_awake() - before >= 20
