"""Helpers every backend shares (fiberlite.backends.base)."""
from __future__ import annotations

from fiberlite.backends.base import decode_stream, exit_code


def test_job_output_decoding_keeps_characters_cut_between_chunks():
    data = "héllo → wörld".encode()
    chunks = [data[i:i + 1] for i in range(len(data))] + [b"\xff"]
    assert "".join(decode_stream(chunks)) == "héllo → wörld\ufffd"


def test_exit_statuses_of_signalled_processes_become_negative():
    statuses = (0, 1, 3, 127, 128, 129, 137, 143, 192, 193, 255)
    assert [exit_code(s) for s in statuses] == [0, 1, 3, 127, 128, -1, -9, -15, -64, 193, 255]


# -- the optional hooks of the seam ----------------------------------------------------------
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from fiberlite.backends import get_backend  # noqa: E402
from fiberlite.backends.base import Backend, Job, JobSpec, lazy_exports  # noqa: E402
from fiberlite.errors import ConfigError  # noqa: E402


class Minimal(Backend):
    """A backend with the required methods only."""

    name = "minimal"
    create_job = status = wait = terminate = logs = listen_host = lambda *a, **k: None


def test_what_a_backend_says_by_default():
    backend = Minimal()
    job = Job(backend, "1", JobSpec(command=["true"]))
    assert backend.sample(job, [1, 2]) is None and backend.location(job) is None
    assert [backend.workers_per_job(100, cpu) for cpu in (None, 0.5, 1, 4, 16.0)] == [1, 1, 1, 4, 16]
    backend.check_options(JobSpec(command=["true"]))  # none given: nothing to refuse


def test_a_job_option_a_backend_does_not_take_is_a_one_line_error():
    spec = JobSpec(command=["true"], options={"service_account": "runner"})
    with pytest.raises(ConfigError) as raised:
        Minimal().check_options(spec)
    assert str(raised.value) == ("the minimal backend does not take the job option 'service_account' "
                                 "(the options it takes: none)")
    get_backend("kubernetes").check_options(spec)  # kubernetes takes it
    with pytest.raises(ConfigError, match="'colour' .*takes: service_account"):
        get_backend("kubernetes").check_options(JobSpec(command=["true"], options={"colour": "red"}))
    for name in ("local", "docker", "slurm"):
        with pytest.raises(ConfigError, match=f"the {name} backend does not take"):
            get_backend(name).create_job(spec)  # refused before anything is started


def test_each_built_in_backend_says_how_its_pools_pack():
    cpus = os.cpu_count() or 1
    assert get_backend("local").workers_per_job(10 * cpus, None) == 10
    assert get_backend("local").workers_per_job(1, None) == 1
    for name in ("docker", "kubernetes"):
        assert get_backend(name).workers_per_job(1000, None) == 1
        assert get_backend(name).workers_per_job(1000, 16) == 16
    assert get_backend("slurm").workers_per_job(1000, 4) == 4  # a cpu request says (the rest: tests/slurm)


def test_a_backend_package_imports_its_class_when_asked():
    getter = lazy_exports("fiberlite.backends.local", {"LocalBackend": ".backend"})
    from fiberlite.backends.local.backend import LocalBackend
    assert getter("LocalBackend") is LocalBackend
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        getter("Nothing")


def test_the_local_backend_measures_a_job_and_its_forked_workers():
    from fiberlite.backends.local.backend import LocalBackend
    backend = LocalBackend()
    busy = [subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [proc.stdout.readline() for proc in busy] == ["ready\n"] * 2  # their memory settled
        job = Job(backend, "job-1", JobSpec(command=["python"]), pid=busy[0].pid)
        alone = backend.sample(job)
        both = backend.sample(job, [busy[1].pid])
        assert alone is not None and both is not None and both[1] > alone[1] > 0
        assert backend.location(job) == socket.gethostname()
        busy[1].kill()
        busy[1].wait()
        after = backend.sample(job, [busy[1].pid])  # a worker gone counts no more
        assert after is not None and after[1] < both[1]
        assert list(backend._usage._files["job-1"]) == [busy[0].pid]  # its file closed
        backend.cleanup(job)
        assert "job-1" not in backend._usage._files
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    backend.close()
