"""Jobs SIGKILLed at random moments while they take and give back a lock or a semaphore,
many times over: nothing stays held, and every increment is accounted for.

Accounting: each job increments the shared counter and its own count in the same
critical section. A job killed inside it may have done one of the two: the counter
and the sum of the counts differ by at most one per kill, never more."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

import fiberlite
from waiting import eventually

pytestmark = pytest.mark.timeout(120)
ROUNDS = int(os.environ.get("FIBERLITE_KILL_ROUNDS", "12"))
WAIT = 30


def count_under_lock(lock, counter, mine, index, started, go):
    started.set()
    go.wait()
    while True:
        with lock:
            counter.value += 1
            mine[index] += 1


def count_under_semaphore(sem, guard, counter, mine, index, started, go):
    started.set()
    go.wait()
    while True:
        with sem:
            with guard:  # (the semaphore lets two in at once: the counter has a lock of its own)
                counter.value += 1
                mine[index] += 1


def _run(target, args_of, jobs_per_round: int, kills: int, counted=None) -> int:
    """Start every job at once, each waiting for its go; let ``jobs_per_round`` of them
    work, then ``kills`` times kill one of those at work at a random moment and let a
    waiting one work in its place; stop the rest once ``counted()`` (the work done) is
    above 0. The number of kills made. (The jobs that wait sleep: none spends the
    machine's CPUs while the others start.)"""
    jobs = []
    for index in range(jobs_per_round + kills):
        started, go = fiberlite.Event(), fiberlite.Event()
        job = fiberlite.Process(target=target, args=args_of(index, started, go), daemon=True)
        job.start()
        jobs.append((job, started, go))
    for _, started, _ in jobs:
        assert started.wait(WAIT)
    at_work = []
    for job, _, go in jobs:
        go.set()
        at_work.append(job)
        if len(at_work) > jobs_per_round:
            time.sleep(random.uniform(0.0, 0.05))  # a random moment of the work, not a synchronisation
            victim = random.choice(at_work)
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(WAIT)
            assert victim.exitcode == -signal.SIGKILL
            at_work.remove(victim)
    if counted is not None:  # on a loaded machine every kill may land before any work
        eventually(lambda: counted() > 0, WAIT, lambda: f"the work counted by the jobs at work ({counted()})")
    for job, _, _ in jobs:
        job.kill()
        job.join(WAIT)
    return kills


def test_lock_holders_killed_at_random_never_leave_it_held(machine_path):
    lock = fiberlite.Lock()
    counter = fiberlite.Value("q", 0, lock=False)
    mine = fiberlite.Array("q", 64, lock=False)
    kills = _run(count_under_lock, lambda i, started, go: (lock, counter, mine, i, started, go), 2, ROUNDS,
                 lambda: sum(mine[:]))
    assert lock.acquire(timeout=WAIT), "a killed job's lock was not given back"
    try:
        total, counted = counter.value, sum(mine[:])
        assert counted > 0
        # a job killed between its two increments leaves them one apart
        assert 0 <= total - counted <= kills + 2, (total, counted)
    finally:
        lock.release()


def test_semaphore_units_of_killed_jobs_come_back(machine_path):
    sem, guard = fiberlite.BoundedSemaphore(2), fiberlite.Lock()
    counter = fiberlite.Value("q", 0, lock=False)
    mine = fiberlite.Array("q", 64, lock=False)
    _run(count_under_semaphore, lambda i, started, go: (sem, guard, counter, mine, i, started, go), 3, ROUNDS,
         lambda: sum(mine[:]))
    eventually(lambda: sem.get_value() == 2, WAIT,  # (recovery runs as each job's end is heard)
               lambda: f"units of killed jobs given back: the value is {sem.get_value()}, not 2")
    assert sem.acquire(False) and sem.acquire(False) and not sem.acquire(False)
    sem.release()
    sem.release()
    assert guard.acquire(timeout=WAIT)
    guard.release()
