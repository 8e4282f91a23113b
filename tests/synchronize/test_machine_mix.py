"""One Value under one lock, used at once by jobs that map the creator's memory and jobs
that reach it through its hub: a local job, a Docker container on the host's network
(which maps the memory through the creator's door), and a container with
``share_machine`` off (as a job of another machine would): the total is exact."""
from __future__ import annotations

import ctypes
import sys

import cloudpickle
import pytest

import fiberlite
from docker_env import ensure_docker
from fiberlite import config
from fiberlite.runtime.shm import sync

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the containers lack this file
COUNT = 300
WAIT = 120


def add_under_lock(value, event, count, out):
    mapped = isinstance(value.get_obj(), ctypes.c_long)
    for _ in range(count):
        with value.get_lock():
            value.value += 1
    if not event.wait(WAIT):  # an Event works on every path too
        raise RuntimeError("the event was never set")
    out.put(mapped)


def test_local_and_docker_jobs_share_one_value_under_one_lock(monkeypatch):
    image = ensure_docker()
    monkeypatch.setattr(config, "_overrides", dict(config._overrides, image=image))
    monkeypatch.setattr(config, "_resolved", None)
    docker = fiberlite.get_context("docker")
    value, event, out = fiberlite.Value("l", 0), fiberlite.Event(), fiberlite.Queue()
    jobs = [fiberlite.Process(target=add_under_lock, args=(value, event, COUNT, out)),
            docker.Process(target=add_under_lock, args=(value, event, COUNT, out))]
    for job in jobs:
        job.start()
    config.init(share_machine=False)  # handed to the next job only: it goes through the hub
    try:
        remote = docker.Process(target=add_under_lock, args=(value, event, COUNT, out))
        remote.start()
    finally:
        config._overrides.pop("share_machine")
        config.init()
    jobs.append(remote)
    event.set()
    mapped = sorted(out.get(timeout=WAIT) for _ in jobs)
    for job in jobs:
        job.join(WAIT)
        assert job.exitcode == 0
    # the container on the host's network maps it too; on the portable path it cannot open
    # the named semaphores (a /dev/shm of its own) and goes through the hub as well
    assert mapped == ([False, False, True] if sync.PORTABLE else [False, True, True])
    assert value.value == 3 * COUNT
