"""The portable path's mutex (POSIX semaphores, no C extension): a thread takes it with
one C call and a write of its process's token, gives it back with one C call that
leaves the token in place, and the creator still tells whether a dead process holds it.

Several handles stand for several processes here (each with a slot of its own), on
memory of this process; the semaphores are real named ones, removed at the end."""
from __future__ import annotations

import mmap
import os
import threading
import time

import pytest

from fiberlite.runtime.shm import portable
from fiberlite.runtime.shm.portable import Mutex, NotOwnedError

pytestmark = pytest.mark.timeout(60)
CREATOR, DEAD, OTHER = 1, 5, 7
UNCLAIMED = 0.3


@pytest.fixture
def memory(monkeypatch):
    """A fresh mapping with a random header (the semaphores' names come from it), and a
    lock and an RLock laid out in it; their semaphores are removed afterwards."""
    monkeypatch.setattr(portable, "UNCLAIMED", UNCLAIMED)
    buffer = mmap.mmap(-1, 4096)
    buffer[:portable.HEADER_BYTES] = os.urandom(portable.HEADER_BYTES)
    for offset in (64, 128):
        portable.setup_mutex(buffer, offset)
    yield buffer
    portable.teardown(buffer, 0, 4096)


def test_handles_of_one_process_share_its_hold_of_an_rlock(memory):
    first, second = Mutex(memory, 128, OTHER, True), Mutex(memory, 128, OTHER, True)
    assert first.acquire() and second.acquire(False)  # the same thread: recursion
    assert first.is_mine() and second.is_mine() and second.depth() == 2
    taken: list[bool] = []
    thread = threading.Thread(target=lambda: taken.append(first.acquire(timeout=0.05)))
    thread.start()
    thread.join()
    assert taken == [False]
    second.release()
    first.release()
    with pytest.raises(NotOwnedError, match="not owned by thread"):
        first.release()
    assert not second.is_mine() and second.depth() == 0 and first.owner() == 0


def test_a_lock_released_by_another_process_is_no_longer_its_holders(memory):
    holder, other = Mutex(memory, 64, OTHER), Mutex(memory, 64, CREATOR)
    assert holder.acquire() and holder.is_mine()
    assert other.owner() == OTHER << portable.THREAD_BITS
    other.release()  # a Lock may be released by anyone; the holder's token stays written
    assert not holder.is_mine() and other.owner() == 0
    with pytest.raises(ValueError, match="released too many times"):
        other.release()


def test_a_dead_holders_lock_is_recovered_once_it_stayed_named_for_a_while(memory):
    dead, creator = Mutex(memory, 64, DEAD), Mutex(memory, 64, CREATOR)
    assert dead.acquire()
    start = time.monotonic()
    assert creator.recover(DEAD) is True
    assert time.monotonic() - start >= UNCLAIMED
    assert creator.acquire(False)
    creator.release()


def test_a_lock_taken_after_the_dead_one_released_it_is_left_alone(memory):
    dead, other, creator = Mutex(memory, 64, DEAD), Mutex(memory, 64, OTHER), Mutex(memory, 64, CREATOR)
    dead.acquire()
    dead.release()  # its token stays in the word
    # another process has taken the semaphore and not written its token yet
    assert other._own.acquire(False)
    writer = threading.Timer(UNCLAIMED / 3, lambda: other._words.__setitem__(0, OTHER << portable.THREAD_BITS))
    writer.start()
    try:
        assert creator.recover(DEAD) is False
    finally:
        writer.join()
    assert creator.owner() == OTHER << portable.THREAD_BITS
    assert not creator.acquire(False)  # still the other's
    other.release()


def test_a_lock_another_process_holds_is_left_alone_at_once(memory):
    other, creator = Mutex(memory, 64, OTHER), Mutex(memory, 64, CREATOR)
    assert other.acquire()
    start = time.monotonic()
    assert creator.recover(DEAD) is False
    assert time.monotonic() - start < UNCLAIMED
    other.release()
    assert creator.recover(DEAD) is False  # free


def test_the_creator_acts_for_a_thread_of_another_process_with_its_token(memory):
    creator, local = Mutex(memory, 128, CREATOR, True), Mutex(memory, 128, OTHER, True)
    token = (DEAD << portable.THREAD_BITS) | 3
    assert creator.acquire_as(token) and creator.acquire_as(token, False)
    assert creator.owner() == token and creator.depth() == 2
    assert not local.acquire(False)
    with pytest.raises(NotOwnedError):
        creator.release_as(token + 1)
    assert creator.release_save(token) == 2 and creator.owner() == 0
    creator.acquire_restore(2, token)
    creator.release_as(token)
    creator.release_as(token)
    assert local.acquire(False) and local.owner() == OTHER << portable.THREAD_BITS
    local.release()
