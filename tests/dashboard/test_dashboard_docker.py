"""Docker jobs on the page: the engine's CPU and memory figures, the container's log."""
from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

import fiberlite
from dashboard.run_driver import read
from docker_env import ensure_docker
from waiting import eventually
from fiberlite import config

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def spin(ready, seconds):
    print("spinning in a container", flush=True)
    ready.put(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.fixture
def docker_ctx(monkeypatch):
    """The docker context with the test image; the settings are restored after."""
    monkeypatch.setattr(config, "_overrides", dict(config._overrides))
    monkeypatch.setattr(config, "_resolved", None)
    fiberlite.init(image=ensure_docker())
    return fiberlite.get_context("docker")


def test_engine_stats_and_log_of_a_container(docker_ctx, page):
    ready = docker_ctx.Queue()
    job = docker_ctx.Process(target=spin, args=(ready, 60))
    job.start()
    try:
        ready.get(timeout=120)
        name = job._popen.job.spec.name
        def row() -> dict | None:
            rows = [r for r in read(page + "api/state")["jobs"] if r["name"] == name]
            return rows[0] if rows else None
        # a core spinning, measured by the engine
        eventually(lambda: (row() or {}).get("cpu") is not None and row()["cpu"] > 30, 30,
                   what=lambda: f"the container's CPU on the page ({row()})")
        row = row()
        assert row["backend"] == "docker" and row["state"] == "running"
        assert "container" in row["host"] and row["memory"] > 1 << 20
        log = read(page + "api/logs?job=" + name)
        assert "spinning in a container" in log["text"]
    finally:
        job.kill()
        job.join(30)
    state = [r for r in read(page + "api/state")["jobs"] if r["name"] == name][0]
    assert (state["state"], state["exitcode"]) == ("exited", -9)
