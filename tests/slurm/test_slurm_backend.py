"""The slurm backend on a real one-node Slurm cluster: every job an sbatch job."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import textwrap

import pytest

import jobs
from fiberlite.backends import get_backend
from fiberlite.backends.slurm import commands
from fiberlite.errors import BackendError
from fiberlite.runtime import identity
from waiting import eventually

pytestmark = pytest.mark.timeout(90)


def run_jobs(run_id: str | None = None) -> list[commands.Row]:
    """This run's Slurm jobs as squeue shows them."""
    run_id = run_id or identity.run_id()
    return [r for r in commands.squeue() if r.labels.get("fiberlite/run") == run_id]


def test_process_queue_and_pipe_give_exact_results(slurm):
    q = slurm.Queue()
    children = [slurm.Process(target=jobs.put_value, args=(q, i)) for i in range(3)]
    for child in children:
        child.start()
    here, there = slurm.Pipe()
    echo = slurm.Process(target=jobs.echo, args=(there,))
    echo.start()
    there.close()
    items = [b"x" * 100_000, {"nested": [1, 2.5, None]}, "text"]
    for item in items:
        here.send(item)
        assert here.recv() == item
    here.close()
    assert sorted(q.get(timeout=60) for _ in children) == [0, 1, 2]
    for child in children + [echo]:
        child.join(60)
        assert child.exitcode == 0
    # each is a Slurm job named after it, its labels in the comment
    names = {r.name: r for r in run_jobs()}
    for child in children:
        row = names[child._popen.job.spec.name]
        assert row.labels["fiberlite/job"] == row.name and row.state == "COMPLETED"


def test_exit_codes_and_signals(slurm):
    codes = {}
    for name, target, args in (("exit 3", jobs.exit_with, (3,)), ("SIGKILL itself", jobs.kill_self, ())):
        p = slurm.Process(target=target, args=args)
        p.start()
        p.join(60)
        codes[name] = p.exitcode
    ready = slurm.Queue()
    stopped = [slurm.Process(target=jobs.wait_forever, args=(ready,)) for _ in range(2)]
    for p in stopped:
        p.start()
    for _ in stopped:
        ready.get(timeout=60)
    stopped[0].terminate()
    stopped[1].kill()
    for p in stopped:
        p.join(60)
    assert codes == {"exit 3": 3, "SIGKILL itself": -9}
    assert [p.exitcode for p in stopped] == [-15, -9]


def test_pool_packs_workers_into_jobs_and_maps_exactly(slurm):
    slurm.settings(cpu=4)
    with slurm.Pool(8) as pool:
        assert pool.map(jobs.slow_square, range(200), chunksize=5) == [(x, x * x) for x in range(200)]
        # 8 workers, 4 per job: two Slurm jobs of 4 CPUs, not eight
        hosts = [r for r in run_jobs() if not r.ended]
        assert len(hosts) == 2, hosts
        assert all(r.state == "RUNNING" for r in hosts)


def job_cpus(rows: list[commands.Row]) -> list[int]:
    """The CPUs Slurm gave each of ``rows``' jobs, largest first."""
    out = commands.run(["squeue", "--noheader", "--states=all", "--format=%C",
                        "--jobs=" + ",".join(r.id for r in rows)], "squeue")
    return sorted((int(n) for n in out.split()), reverse=True)


def test_a_pool_fills_nodes_by_default_not_a_job_per_worker(slurm):
    node_cpus = commands.node_cpus(None)
    assert node_cpus == commands.node_cpus("debug") == 8  # .ci/slurm_setup.sh's node
    assert commands.node_cpus("no-such-partition") is None
    workers = node_cpus + 4
    before = {r.id for r in run_jobs()}  # this run's earlier tests' jobs
    with slurm.Pool(workers) as pool:  # no cpu, no workers_per_job
        assert pool.map(jobs.slow_square, range(60), chunksize=2) == [(x, x * x) for x in range(60)]
        hosts = [r for r in run_jobs() if r.id not in before]
        # 12 workers: a job of 8 (a whole node, 8 CPUs) and one of 4, not 12 jobs; the
        # second waits for room while the pool works with the first
        assert len(hosts) == 2 and job_cpus(hosts) == [node_cpus, 4], hosts
        running = [p for p in pool._core.procs.values() if p._popen.backend.status(p._popen.job).value == "running"]
        assert {p._popen.backend.location(p._popen.job) for p in running} == {socket.gethostname().split(".")[0]}


def test_pool_host_cancelled_mid_map_loses_nothing(slurm):
    slurm.settings(cpu=2)
    count = 600
    with slurm.Pool(4) as pool:
        results = pool.imap_unordered(jobs.slow_square, range(count), chunksize=2)
        seen = [next(results) for _ in range(20)]
        victim = next(r for r in run_jobs() if r.state == "RUNNING")
        subprocess.run(["scancel", victim.id], check=True)
        seen += list(results)
    assert len(seen) == count
    assert sorted(seen) == [(x, x * x) for x in range(count)]
    assert next(r for r in run_jobs() if r.id == victim.id).state == "CANCELLED"


def test_pending_for_resources_fails_at_start_timeout_with_slurms_reason(slurm, caplog):
    ready = slurm.Queue()
    blocker = slurm.Process(target=jobs.wait_forever, args=(ready,))
    blocker.start()
    ready.get(timeout=60)
    node_cpus = int(commands.run(["sinfo", "--noheader", "-o", "%c"], "sinfo").split()[0])
    slurm.settings(cpu=node_cpus, start_timeout=3)  # the whole node, while the blocker holds a CPU
    late = slurm.Process(target=jobs.noop)
    with caplog.at_level(logging.ERROR, logger="fiberlite"):
        late.start()
        late.join(60)
    assert late.exitcode == 1
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "did not start within 3 s" in message and "reason Resources" in message, message
    assert run_jobs() and next(r for r in run_jobs() if r.name == late._popen.job.spec.name).state == "CANCELLED"
    # with room, a job that waited runs
    slurm.settings(start_timeout=300)
    waiting = slurm.Process(target=jobs.put_value, args=(ready, "ran"))
    waiting.start()
    backend = get_backend("slurm")
    eventually(lambda: backend.status(waiting._popen.job).value == "pending", 30, "the job's pending state")
    blocker.kill()
    assert ready.get(timeout=60) == "ran"
    waiting.join(60)
    blocker.join(60)
    assert waiting.exitcode == 0


def test_a_partition_that_does_not_exist_is_a_one_line_error(slurm):
    slurm.settings(slurm_partition="no-such-partition")
    with pytest.raises(BackendError) as raised:
        slurm.Process(target=jobs.noop).start()
    message = str(raised.value)
    assert "\n" not in message and "invalid partition" in message.lower(), message


def test_master_sigkilled_leaves_no_job(slurm_cluster, tmp_path):
    from interpreters import start_python
    script = tmp_path / "master.py"
    script.write_text(textwrap.dedent("""
        import sys, fiberlite, jobs
        if __name__ == "__main__":
            ready = fiberlite.Queue()
            for _ in range(3):
                fiberlite.Process(target=jobs.wait_forever, args=(ready,)).start()
            pids = [ready.get(timeout=60) for _ in range(3)]
            print(fiberlite.runtime.identity.run_id(), flush=True)
            sys.stdin.read()
    """))
    master = start_python(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={"FIBERLITE_BACKEND": "slurm", "FIBERLITE_SLURM_DIR": str(tmp_path / "slurm")})
    try:
        run_id = master.stdout.readline().strip()
        assert len([r for r in run_jobs(run_id) if r.state == "RUNNING"]) == 3
        master.kill()
        master.wait(10)
        eventually(lambda: all(r.ended for r in run_jobs(run_id)), 20,
                   lambda: f"the jobs of the killed master: {run_jobs(run_id)}")
    finally:
        master.kill()
        master.wait(10)


def test_master_sigkilled_leaves_no_queued_job(slurm_cluster, tmp_path):
    from interpreters import start_python
    script = tmp_path / "master.py"
    script.write_text(textwrap.dedent("""
        import sys, fiberlite, jobs
        from fiberlite.backends.slurm import commands
        if __name__ == "__main__":
            run = fiberlite.runtime.identity.run_id()
            queued = fiberlite.Process(target=jobs.noop)
            fiberlite.init(slurm_options="--begin=now+1hour")  # queued, reason BeginTime
            queued.start()
            print(run, flush=True)
            sys.stdin.read()
    """))
    master = start_python(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env={"FIBERLITE_BACKEND": "slurm", "FIBERLITE_SLURM_DIR": str(tmp_path / "slurm")})
    try:
        run_id = master.stdout.readline().strip()
        assert [r.reason for r in run_jobs(run_id)] == ["BeginTime"]
        master.kill()
        master.wait(10)
        eventually(lambda: all(r.ended for r in run_jobs(run_id)), 20,
                   lambda: f"the queued job of the killed master: {run_jobs(run_id)}")
    finally:
        master.kill()
        master.wait(10)
