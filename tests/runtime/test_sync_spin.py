"""A wait on a shared word looks at it awake for a moment before it sleeps, and stops
doing so for a word that keeps not changing in that moment (its partner answers in
hundreds of microseconds, through a hub): such waits cost next to no CPU."""
from __future__ import annotations

import ctypes
import os
import time

import pytest

from fiberlite.runtime.shm import _sync

pytestmark = pytest.mark.timeout(60)
SPIN_SECONDS = 50e-6  # how long a wait looks awake (SPIN_NS in _sync.c)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: waits never look awake")
def test_waits_on_a_word_that_never_changes_in_time_soon_stop_looking_awake():
    word = ctypes.c_uint32(5)
    address, waits = ctypes.addressof(word), 400
    start = time.thread_time()
    for _ in range(waits):
        assert _sync.wait(address, 5, 0.001) is False  # times out: nothing changes it
    per_wait = (time.thread_time() - start) / waits
    # looking awake each time would cost at least SPIN_SECONDS per wait
    assert per_wait < SPIN_SECONDS * 0.6, f"{per_wait * 1e6:.1f} us of CPU per wait"


def test_a_wait_still_sees_a_change_made_meanwhile():
    word = ctypes.c_uint32(5)
    address = ctypes.addressof(word)
    for _ in range(100):  # (its looks backed off)
        _sync.wait(address, 5, 0.0005)
    word.value = 6
    assert _sync.wait(address, 5, 5.0) is True  # differs already: at once
