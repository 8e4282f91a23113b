"""The ``fiberlite`` command on the local backend, run for real as a subprocess."""
from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import textwrap

import psutil
import pytest

from fiberlite.cli import main
from fiberlite.cli.progress import Progress
from waiting import eventually
from interpreters import run_python, start_python

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, sys, fiberlite

    def square(q, x):
        # one write per line: with PYTHONUNBUFFERED, print() writes its pieces one by
        # one and two children's lines can interleave
        sys.stdout.write(f"child {x}\\n")
        sys.stdout.flush()
        q.put(x * x)

    if __name__ == "__main__":
        print("run", os.environ["FIBERLITE_RUN_ID"], os.environ["FIBERLITE_BACKEND"], flush=True)
        q = fiberlite.Queue()
        ps = [fiberlite.Process(target=square, args=(q, x)) for x in (2, 3)]
        for p in ps:
            p.start()
        print("squares", sorted(q.get(timeout=30) for _ in ps), flush=True)
        for p in ps:
            p.join()
        print("to stderr", file=sys.stderr)
        if len(sys.argv) > 1 and sys.argv[1] == "kill":
            os.kill(os.getpid(), 9)
        sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")

# starts two children that wait forever, prints every pid, then waits
HANG = textwrap.dedent("""
    import os, time, fiberlite

    def wait(q):
        q.put(os.getpid())
        time.sleep(600)

    if __name__ == "__main__":
        q = fiberlite.Queue()
        ps = [fiberlite.Process(target=wait, args=(q,)) for _ in range(2)]
        for p in ps:
            p.start()
        pids = [q.get(timeout=30) for _ in ps]
        print("pids", os.environ["FIBERLITE_RUN_ID"], os.getpid(), *pids, flush=True)
        time.sleep(600)
""")


@pytest.fixture
def cli(tmp_path):
    """Run ``fiberlite ARGS`` in tmp_path with its own state directory."""
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "hang.py").write_text(HANG)

    def run(*args, **kwargs):
        return run_python("-m", "fiberlite.cli", *args, cwd=tmp_path, env=state, clean=True,
                          timeout=45, **kwargs)

    def start(*args):
        return start_python("-m", "fiberlite.cli", *args, cwd=tmp_path, env=state, clean=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    run.start = start
    return run


def test_version_and_help(cli):
    import fiberlite
    assert cli("--version").stdout.strip() == f"fiberlite {fiberlite.__version__}"
    for command in ("run", "ps", "logs", "clean"):
        done = cli(command, "--help")
        assert done.returncode == 0 and "usage: fiberlite " + command in done.stdout
    assert "--backend" in cli("run", "--help").stdout
    bare = cli()
    assert bare.returncode == 2 and "run" in bare.stderr


def test_run_streams_output_and_exits_with_the_code(cli):
    done = cli("run", "script.py", "3")
    assert done.returncode == 3
    out = done.stdout
    assert "child 2" in out and "child 3" in out and "squares [4, 9]" in out
    assert "to stderr" in done.stderr
    run_id = next(line.split()[1] for line in out.splitlines() if line.startswith("run "))
    assert f"run {run_id} local" in out
    # the master's output is kept: `fiberlite logs` shows it again
    logs = cli("logs", f"fl-{run_id}-master")
    assert logs.returncode == 0 and "squares [4, 9]" in logs.stdout and "to stderr" in logs.stdout
    assert cli("logs", "fl-nosuchrun-master", "--backend", "local").returncode == 1


def test_run_keeps_its_logs_readable_by_the_user_only(cli, tmp_path):
    logs = tmp_path / "state" / "fiberlite" / "logs"
    logs.mkdir(parents=True, mode=0o755)  # as an older version left it
    logs.chmod(0o755)
    done = cli("run", "script.py", preexec_fn=lambda: os.umask(0))  # modes do not come from umask
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    files = sorted(logs.iterdir())
    assert [p.suffix for p in files] == [".exit", ".log"]
    assert [stat.S_IMODE(p.stat().st_mode) for p in files] == [0o600, 0o600]
    assert "squares [4, 9]" in files[1].read_text()


def test_run_reports_a_signal_death_as_128_plus_n(cli):
    killed = cli("run", "script.py", "kill")
    assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-4000:]
    done = cli("run", "script.py")
    assert done.returncode == 0, done.stderr[-4000:]


def test_run_usage_errors(cli):
    done = cli("run", "--cpu", "lots", "script.py")
    assert done.returncode == 2 and "invalid cpu" in done.stderr
    done = cli("run", "--backend", "nowhere", "script.py")
    assert done.returncode == 2 and "invalid choice" in done.stderr
    done = cli("run", "--build", "script.py")
    assert done.returncode == 2 and "--build needs --image" in done.stderr
    # a backend option the backend does not take: one line, before anything starts
    for option in (["--service-account", "runner"], ["--option", "service_account=runner"]):
        done = cli("run", *option, "script.py")
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr == ("fiberlite: error: the local backend does not take the job option "
                               "'service_account' (the options it takes: none)\n")


def _wait_for_pids(proc) -> tuple[str, list[int]]:
    line = proc.stdout.readline()
    assert line.startswith("pids "), line + proc.stderr.read()
    run_id, *pids = line.split()[1:]
    return run_id, [int(p) for p in pids]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_removes_every_job_of_the_run(cli, sig, status):
    proc = cli.start("run", "hang.py")
    try:
        run_id, pids = _wait_for_pids(proc)
        procs = [psutil.Process(pid) for pid in pids]
        proc.send_signal(sig)
        assert proc.wait(30) == status
        _, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, f"jobs of run {run_id} survived: {alive}"
        assert f"removing the jobs of run {run_id}" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_ps_and_clean(cli):
    proc = cli.start("run", "hang.py")
    try:
        run_id, pids = _wait_for_pids(proc)
        children = [psutil.Process(p) for p in pids[1:]]
        listed = cli("ps", "--run", run_id, "--backend", "local").stdout
        lines = [line.split() for line in listed.splitlines()[1:]]
        assert [(b, r, s) for b, r, _, s in lines] == [("local", run_id, "running")] * 3
        assert {job for _, _, job, _ in lines} >= {f"fl-{run_id}-master"}
        cleaned = cli("clean", "--run", run_id, "--backend", "local")
        assert cleaned.returncode == 0 and f"local: removed 3 jobs of run {run_id}" in cleaned.stdout
        assert proc.wait(30) == 128 + signal.SIGTERM     # its master was stopped
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
        assert cli("ps", "--run", run_id, "--backend", "local").stdout.strip() == f"no jobs of run {run_id}"
    finally:
        proc.kill()
        proc.wait()


def test_in_process_ps_with_unknown_backend():
    assert main(["ps", "--backend", "nowhere"]) == 2


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_view():
    states = [[("a", "r", "pending"), ("b", "r", "pending")],
              [("a", "r", "running"), ("b", "r", "pending (ContainerCreating)")],
              [("a", "r", "exited (code 0)"), ("b", "r", "running")]]
    for stream in (io.StringIO(), FakeTTY()):
        calls = iter(states + [states[-1]] * 1000)
        progress = Progress("run r", lambda: next(calls), stream=stream, interval=0.01).start()
        eventually(lambda: "1 done" in stream.getvalue(), 10, what="the line with 1 done")
        progress.stop()
        text = stream.getvalue()
        assert "run r: 2 pending, 0 running, 0 done" in text
        assert "run r: 1 pending, 1 running, 0 done" in text
        assert "run r: 0 pending, 1 running, 1 done" in text
        if isinstance(stream, FakeTTY):   # one line rewritten in place, erased at the end
            assert "\n" not in text and text.endswith("\r\x1b[K")
        else:                             # a few plain lines
            assert text.count("\n") == 3 and "\r" not in text


@pytest.mark.docker
@pytest.mark.timeout(150)
def test_interrupt_on_docker_removes_every_container_of_the_run(cli, tmp_path):
    """`fiberlite run --backend docker`: the master is a container, its children too;
    Ctrl-C removes them all."""
    import docker
    from docker_env import ensure_docker
    image = ensure_docker()
    proc = cli.start("run", "--backend", "docker", "--image", image, "hang.py")
    client = docker.from_env()
    try:
        run_id, _ = _wait_for_pids(proc)
        running = client.containers.list(filters={"label": f"fiberlite/run={run_id}"})
        assert len(running) == 3, running  # the master and its two children
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        def left() -> list:  # containers are removed by the engine, asynchronously
            return client.containers.list(all=True, filters={"label": f"fiberlite/run={run_id}"})
        eventually(lambda: not left(), 20, what=lambda: f"containers of run {run_id} survived: {left()}")
    finally:
        proc.kill()
        proc.wait()
        client.close()
