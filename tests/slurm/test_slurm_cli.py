"""``fiberlite run|ps|logs|clean --backend slurm``: the master as a Slurm batch job."""
from __future__ import annotations

import subprocess
import textwrap

import pytest

from fiberlite.backends.slurm import commands
from interpreters import run_python, start_python
from waiting import eventually

pytestmark = pytest.mark.timeout(90)

SCRIPT = textwrap.dedent("""
    import os, signal, sys, fiberlite

    def square(q, x):
        sys.stdout.write(f"child {x}\\n")
        sys.stdout.flush()
        q.put(x * x)

    if __name__ == "__main__":
        print("run", os.environ["FIBERLITE_RUN_ID"], os.environ["FIBERLITE_BACKEND"],
              os.environ.get("SLURM_JOB_ID") is not None, flush=True)
        q = fiberlite.Queue()
        ps = [fiberlite.Process(target=square, args=(q, x)) for x in (2, 3)]
        for p in ps:
            p.start()
        print("squares", sorted(q.get(timeout=30) for _ in ps), flush=True)
        for p in ps:
            p.join()
        print("to stderr", file=sys.stderr, flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(sys.argv[1]))
""")


def fiberlite_cli(*args, tmp_path, **kw):
    return run_python("-m", "fiberlite.cli", *args, cwd=tmp_path, timeout=80,
                      env={"FIBERLITE_SLURM_DIR": str(tmp_path / "slurm")}, **kw)


@pytest.mark.parametrize("ending, status", [("0", 0), ("3", 3), ("kill", 128 + 9)])
def test_run_streams_the_master_batch_job_and_exits_with_its_code(slurm_cluster, tmp_path, ending, status):
    (tmp_path / "script.py").write_text(SCRIPT)
    done = fiberlite_cli("run", "--backend", "slurm", "script.py", ending, tmp_path=tmp_path)
    assert done.returncode == status, done.stderr
    lines = done.stdout.splitlines()
    run_line = next(line for line in lines if line.startswith("run "))
    assert run_line.endswith(" slurm True")  # the master ran as a Slurm job
    assert "squares [4, 9]" in lines and "child 2" in lines and "child 3" in lines, done.stdout
    assert "to stderr" in lines  # the batch job's one output file holds both streams
    run_id = run_line.split()[1]
    rows = [r for r in commands.squeue() if r.labels.get("fiberlite/run") == run_id]
    assert len(rows) == 3 and all(r.ended for r in rows), rows
    assert not (tmp_path / "slurm" / run_id).exists()  # the run's files are gone


def test_ps_logs_and_clean_know_slurm_runs(slurm_cluster, tmp_path):
    (tmp_path / "wait.py").write_text("import time\nprint('waiting', flush=True)\ntime.sleep(600)\n")
    runner = start_python("-m", "fiberlite.cli", "run", "--backend", "slurm", "wait.py", cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={"FIBERLITE_SLURM_DIR": str(tmp_path / "slurm")})
    try:
        assert runner.stdout.readline() == "waiting\n"
        ps = fiberlite_cli("ps", "--backend", "slurm", tmp_path=tmp_path)
        running = [line.split() for line in ps.stdout.splitlines() if line.endswith(" running")]
        backend, run_id, job, state = running[-1]
        assert backend == "slurm" and job == f"fl-{run_id}-master", ps.stdout
        logs = fiberlite_cli("logs", "--backend", "slurm", job, tmp_path=tmp_path)
        assert logs.stdout == "waiting\n", logs.stderr
        clean = fiberlite_cli("clean", "--backend", "slurm", "--run", run_id, tmp_path=tmp_path)
        assert clean.stdout == f"slurm: removed 1 job of run {run_id}\n", clean.stderr
        assert runner.wait(30) == 128 + 15  # the master was cancelled: SIGTERM
        eventually(lambda: all(r.ended for r in commands.squeue() if r.labels.get("fiberlite/run") == run_id),
                   10, "the run's jobs ending")
    finally:
        runner.kill()
        runner.wait(10)
