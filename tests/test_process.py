"""Process: the multiprocessing.Process contract on the local backend."""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import pytest

import fiberlite
import jobs

pytestmark = pytest.mark.timeout(60)


def test_start_join_exitcode_and_repr():
    p = fiberlite.Process(target=jobs.noop, name="worker")
    assert p.exitcode is None and "initial" in repr(p)
    p.start()
    assert p.pid and p.ident == p.pid
    p.join()
    assert p.exitcode == 0 and not p.is_alive()
    assert "stopped" in repr(p) and "exitcode=0" in repr(p)
    assert p.name == "worker"


def test_names_follow_multiprocessing():
    p = fiberlite.Process(target=jobs.noop)
    assert p.name.startswith("Process-")
    c = jobs.Counter(None, 1)
    assert c.name.startswith("Counter-")


@pytest.mark.parametrize("code", [0, 3, 255])
def test_sys_exit_codes(code):
    p = fiberlite.Process(target=jobs.exit_with, args=(code,))
    p.start()
    p.join()
    assert p.exitcode == code


def test_sys_exit_with_message_gives_1(capfd):
    p = fiberlite.Process(target=jobs.exit_with, args=("bye now",))
    p.start()
    p.join()
    assert p.exitcode == 1
    assert "bye now" in capfd.readouterr().err


def test_uncaught_exception_prints_traceback_and_exitcode_1(capfd):
    p = fiberlite.Process(target=jobs.raise_value_error)
    p.start()
    p.join()
    assert p.exitcode == 1
    err = capfd.readouterr().err
    assert f"Process {p.name}:" in err
    assert "ValueError: boom from the child" in err and "Traceback" in err


def test_traceback_of_a_function_sent_by_value_names_its_file(tmp_path, capfd):
    script = tmp_path / "user_script.py"
    fails = jobs.load_script(script, "def fails():\n    raise KeyError('from the script')\n")["fails"]
    p = fiberlite.Process(target=fails)
    p.start()
    p.join()
    assert p.exitcode == 1
    err = capfd.readouterr().err
    assert f'File "{script}", line 2, in fails' in err
    assert "raise KeyError('from the script')" in err


def test_subclass_run_and_lambda_target():
    q = fiberlite.Queue()
    c = jobs.Counter(q, 10)
    c.start()
    assert q.get(timeout=30) == 45
    c.join()
    factor = 7
    p = fiberlite.Process(target=lambda: q.put(6 * factor))  # a closure travels by value
    p.start()
    assert q.get(timeout=30) == 42
    p.join()


def test_terminate_and_kill_give_negative_signal(waiting_jobs):
    p, p2 = waiting_jobs(2)
    assert p.is_alive()
    p.terminate()
    p.join(10)
    assert p.exitcode == -signal.SIGTERM
    p2.kill()
    p2.join(10)
    assert p2.exitcode == -signal.SIGKILL
    assert "exitcode=-SIGKILL" in repr(p2)  # as the standard library writes it


def test_join_timeout_returns_while_running(waiting_jobs):
    p, = waiting_jobs()
    t0 = time.monotonic()
    p.join(0.2)
    assert p.is_alive() and p.exitcode is None
    assert time.monotonic() - t0 < 5
    p.kill()
    p.join()


def test_close_rules(waiting_jobs):
    p, = waiting_jobs()
    with pytest.raises(ValueError, match="still running"):
        p.close()
    p.kill()
    p.join()
    p.close()
    with pytest.raises(ValueError, match="closed"):
        p.is_alive()
    with pytest.raises(ValueError):
        p.exitcode


def test_misuse_assertions():
    p = fiberlite.Process(target=jobs.noop)
    with pytest.raises(AssertionError, match="started process"):
        p.join()
    p.start()
    with pytest.raises(AssertionError, match="twice"):
        p.start()
    with pytest.raises(AssertionError):
        p.daemon = True
    p.join()


def test_identity_in_child_and_key_not_in_environment():
    q = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.report_identity, args=(q,), daemon=True, name="ident")
    p.start()
    name, pid, daemon, parent_name, parent_pid, cwd, key_env = q.get(timeout=30)
    p.join()
    assert (name, pid, daemon) == ("ident", p.pid, True)
    assert parent_name == "MainProcess" and parent_pid == os.getpid()
    assert cwd == os.getcwd()
    assert key_env is None  # the key is taken out of the job's environment
    assert fiberlite.current_process().name == "MainProcess"
    assert fiberlite.parent_process() is None


def test_sentinel_becomes_ready():
    from multiprocessing.connection import wait
    p = fiberlite.Process(target=jobs.noop)
    p.start()
    assert wait([p.sentinel], timeout=30) == [p.sentinel]
    p.join()


def test_parent_process_in_a_grandchild_outlived_by_it():
    """A grandchild sees its parent (the middle job) through ``parent_process()`` and the
    standard library's: pid, name, a sentinel ready and ``is_alive()`` False once the
    middle job is gone."""
    q = fiberlite.Queue()
    middle = fiberlite.Process(target=jobs.start_reporting_child, args=(q,))
    middle.start()
    reports = [q.get(timeout=60), q.get(timeout=60)]
    told = next(r for r in reports if r[0] == "middle")
    pid, name, stdlib_agrees, ready_early, alive_early = next(r for r in reports if r[0] != "middle")
    assert (pid, name) == (told[1], told[2]) == (middle.pid, middle.name)
    assert stdlib_agrees and ready_early == [] and alive_early
    middle.terminate()
    middle.join(30)
    assert q.get(timeout=60) == (True, False)  # sentinel ready, not alive


def test_active_children_and_cpu_count(waiting_jobs):
    p, = waiting_jobs()
    assert p in fiberlite.active_children()
    p.kill()
    p.join()
    assert p not in fiberlite.active_children()
    assert fiberlite.cpu_count() >= 1


def test_unpicklable_target_fails_at_start_naming_it():
    lock = threading.Lock()
    p = fiberlite.Process(target=jobs.put_value, args=(None, lock))
    with pytest.raises(TypeError) as info:
        p.start()
    message = str(info.value)
    assert "argument 1" in message and "lock" in message and "pickle" in message
    assert fiberlite.active_children() == []


def test_nested_children():
    q = fiberlite.Queue()
    p = fiberlite.Process(target=jobs.spawn_grandchild, args=(q,))
    p.start()
    first, second = q.get(timeout=30), q.get(timeout=30)
    assert {first, second} - {p.pid}  # the grandchild reported its own pid
    p.kill()
    p.join()


def test_contexts_and_start_methods():
    ctx = fiberlite.get_context("spawn")
    assert ctx.get_start_method() == "spawn"
    local = fiberlite.get_context("local")
    assert issubclass(local.Process, fiberlite.Process)
    q = local.Queue()
    p = local.Process(target=jobs.put_value, args=(q, "hi"))
    p.start()
    assert q.get(timeout=30) == "hi"
    p.join()
    with pytest.raises(ValueError, match="backend"):
        fiberlite.get_context("nonsense")
    fiberlite.set_start_method("spawn", force=True)


def test_launch_options_travel_with_the_process_into_its_job_spec():
    """A context's backend and a pool's marks are public launch options that a Process
    carries to its job (pickled with it) and that become its JobSpec."""
    from dataclasses import replace
    from fiberlite.runtime.launch_options import LaunchOptions
    from fiberlite.runtime.launcher import job_spec, pack_process
    assert fiberlite.Process.launch_options == LaunchOptions()  # the configured backend
    local = fiberlite.get_context("local")
    p = local.Process(target=jobs.noop)
    assert p.launch_options == LaunchOptions(backend="local") and p.launch is None
    clone = pack_process(p).unpack()  # as it travels to its job: its class's options with it
    assert type(clone).launch_options == LaunchOptions(backend="local")
    p.launch_options = replace(p.launch_options, waits_for_capacity=True, workers=3)
    spec = job_spec(p, "local", "tcp://127.0.0.1:1", 1)
    assert spec.waits_for_capacity and spec.workers == 3
    assert job_spec(local.Process(target=jobs.noop), "local", "tcp://127.0.0.1:1", 1).workers == 1
    q = local.Queue()
    child = local.Process(target=jobs.report_launch_options, args=(q,))
    child.launch_options = replace(child.launch_options, workers=2)
    child.start()
    assert child.launch is not None and child.launch.job.spec.workers == 2
    assert q.get(timeout=30) == LaunchOptions(backend="local", workers=2)
    child.join()


def test_exceptions_exported():
    import multiprocessing
    assert fiberlite.ProcessError is multiprocessing.ProcessError
    assert fiberlite.TimeoutError is multiprocessing.TimeoutError
    assert issubclass(fiberlite.AuthenticationError, fiberlite.ProcessError)
    assert issubclass(fiberlite.BufferTooShort, fiberlite.ProcessError)


def test_process_object_pickles_without_its_job():
    p = fiberlite.Process(target=jobs.noop, name="x")
    clone = pickle.loads(pickle.dumps(p))
    assert clone.name == "x" and clone._popen is None


def test_loopback_hub_refuses_a_backend_that_cannot_reach_it(monkeypatch):
    from fiberlite.runtime import hub
    from fiberlite.errors import BackendError
    fiberlite.Queue()  # the hub now listens on loopback
    monkeypatch.setattr(hub, "listen_host", lambda backend=None: "192.0.2.10" if backend == "far" else "127.0.0.1")
    with pytest.raises(BackendError, match="'far' backend cannot reach"):
        hub.get_hub("far")
    assert hub.get_hub("local") is hub.get_hub()
