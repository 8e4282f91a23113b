"""The run's key reaches a job without staying where others can read it: not in the
job's start environment (/proc/PID/environ) nor in os.environ (which its children
inherit), nor in ``docker inspect``; only the job's memory holds it."""
from __future__ import annotations

import json

import pytest

import fiberlite
import jobs
from fiberlite.runtime import identity


def exposure(ctx, go=None) -> dict:
    q = ctx.Queue()
    process = ctx.Process(target=jobs.report_key_exposure, args=(q, go))
    process.start()
    report = q.get(timeout=60)
    report["process"] = process
    return report


def assert_not_exposed(report: dict) -> None:
    key = identity.key().hex()
    assert key not in report["start_environ"]
    assert key not in json.dumps(report["environ"])
    assert not {"FIBERLITE_AUTHKEY", "FIBERLITE_SECRETS_FD", "FIBERLITE_SECRETS_FILE"} & set(report["environ"])
    assert not report["secrets_file"]


def test_local_job_reads_the_key_from_a_pipe_it_closes():
    report = exposure(fiberlite.get_context("local"))
    report["process"].join(30)
    assert report["process"].exitcode == 0
    assert_not_exposed(report)
    assert "FIBERLITE_SECRETS_FD" in report["start_environ"]  # it came on a descriptor ...
    assert report["pipes"] == []                              # ... which the job closed
    # (stdin, stdout and stderr are not counted: they may be pipes of the test's runner)


@pytest.mark.docker
def test_docker_job_key_is_not_in_docker_inspect():
    import docker
    from docker_env import ensure_docker
    image = ensure_docker()
    from fiberlite import config
    saved = dict(config._overrides)
    fiberlite.init(image=image)
    try:
        ctx = fiberlite.get_context("docker")
        go = ctx.Queue()
        report = exposure(ctx, go)
        client = docker.APIClient(version="auto")
        try:
            inspected = json.dumps(client.inspect_container(report["container"]))
        finally:
            client.close()
        go.put("done")
        report["process"].join(60)
    finally:
        config._overrides.clear()
        config._overrides.update(saved)
        config.init()
    assert report["process"].exitcode == 0
    assert_not_exposed(report)
    assert identity.key().hex() not in inspected and "FIBERLITE_SECRETS_FILE" in inspected
