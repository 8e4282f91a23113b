"""The benchmark scripts keep working: each runs with ``--quick``, prints its table and
writes its JSON; the plot script turns that JSON into PNG files. No timing is asserted."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from interpreters import run_python, start_python

pytestmark = pytest.mark.timeout(150)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")

EXPECTED = {
    "bench_queue_latency.py": ["pynng Pair0", "pynng Req0/Rep0", "mp Queue (spawn)", "mp Pipe (spawn)",
                               "fiberlite Queue", "fiberlite Pipe"],
    "bench_queue_compete.py": ["mp Queue (spawn)", "fiberlite Queue", "time per item, 3 consumers",
                               "CPU time of the queues' owner"],
    "bench_process_start.py": ["start() to first message", "start 4 processes", "mp spawn", "fiberlite",
                               'Popen python -c "import pynng"'],
    "bench_pool.py": ["fiberlite Pool", "mp spawn Pool", "sleep(10 ms)", "sleep(1 ms)", "ideal",
                      "fiberlite Pool, 1 ms tasks", "chunksize=1", "default chunksize", "pynng Pair0",
                      "fiberlite Pool, bytes", "mp spawn Pool, bytes", "10 workers", "100 workers",
                      "imap(noop, same, chunksize=", "imap_unordered(noop, same, chunksize=",
                      "imap(pow3, range("],
    "bench_kubernetes.py": ["16 at a time", "one at a time", "until every pod is created",
                            "until the first result", "until every worker has run a task",
                            "pods/s"],
    "bench_dashboard.py": ["page closed", "page open", "queue.put seen by a reader"],
    "bench_futures.py": ["fiberlite Pool.map", "fiberlite executor.map", "mp spawn executor.map",
                         "mp spawn executor", "fiberlite executor"],
    "bench_managers.py": ["mp spawn Manager", "fiberlite Manager", "manager Queue", "manager list[5]",
                          "manager Lock", "manager Condition"],
    "bench_scale.py": ["mp spawn Pool", "fiberlite Pool", "Pool(4) until every worker",
                       "chunksize=1, 4 workers", "default chunksize", "master CPU per task",
                       "workers' CPU per task", "unique memory (USS) per worker", "master RSS",
                       "master CPU per task with simulated workers", "idle connections",
                       "peer_timeout 10 s (default)"],
    "bench_lane_remote.py": ["fiberlite (lanes)", "creator without lanes", "gets, the parent puts",
                             "puts, the parent gets", "four jobs of another machine get until None"],
    "bench_patterns.py": ["mp spawn items/s", "fiberlite items/s", "2 producers -> parent",
                          "parent -> 2 consumers", "2 -> 2, all children", "one after another",
                          "2 -> 2, all grandchildren", "Pool(2) workers", "SimpleQueue", "JoinableQueue"],
    "bench_primitives.py": ["mp spawn", "FIBERLITE_SHARE_MACHINE=0", "target",
                            "raw TCP round trip parent <-> child (the floor)", "Across machines",
                            "TCP round trips (target <= 5:",
                            "Value += 1 under its lock, 2 children", "Lock acquire+release, creating process",
                            "RLock acquire+release, creating process", "Value.value read, creating process",
                            "Event ping-pong parent <-> child", "Pipe round trip, small object",
                            "Queue child -> parent, small items", "Queue child -> parent, 256-byte str",
                            "numpy.frombuffer(arr.get_obj()) in a child", "Array('i', lock=False)[5] read",
                            "Array('i', lock=True)[5] read", "Condition notify/wait parent <-> child"],
}

# smaller sizes than --quick, for the scripts whose quick run is still long; enough tasks
# that CPU times, read in clock ticks of 10 ms, are not zero
OPTIONS = {
    "bench_kubernetes.py": ["--workers", "4", "--pods", "2"],
    "bench_scale.py": ["--workers", "4", "--tasks", "200", "--cpu-tasks", "1000"],
    # GridSearchCV and DataLoader start interpreters that import scikit-learn and torch
    "bench_futures.py": ["--only", "map", "--only", "roundtrip"],
    # the third column too; a side that hangs prints its stacks and is killed before the
    # run times out, so its cell says so
    "bench_primitives.py": ["--share-machine", "both", "--timeout", "40"],
}


def run_quick(script: str, json_path: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The script's quick run. One that does not end in time is made to print where each
    of its threads is (faulthandler, on SIGABRT) before the test fails with that."""
    args = (os.path.join(BENCHMARKS, script), "--quick", "--json", json_path, *OPTIONS.get(script, []))
    child = start_python(*args, cwd=ROOT, env={"PYTHONFAULTHANDLER": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        out, err = child.communicate()
        pytest.fail(f"{script} --quick did not end within {timeout:g} s; its threads then:\n"
                    f"{err[-12000:]}\n{out[-3000:]}")
    return subprocess.CompletedProcess(args, child.returncode, out, err)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_benchmark_runs_quick(script, tmp_path):
    json_path = str(tmp_path / (script[:-3] + ".json"))
    done = run_quick(script, json_path)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    for name in EXPECTED[script]:
        assert name in done.stdout, f"{script} printed no row {name!r}:\n{done.stdout}"
    assert "ratio" in done.stdout
    document = json.loads(open(json_path).read())
    assert document["machine"]["cores_logical"] >= 1
    measured = [r for r in document["results"] if "seconds" in r or "bytes" in r]
    assert measured and all(r.get("seconds", r.get("bytes")) > 0 for r in measured)
    # every section has its reference row measured, so every ratio is known
    assert all(r["ratio"] is not None for r in measured), f"{done.stdout}\n{done.stderr[-6000:]}"
    if script in ("bench_primitives.py", "bench_patterns.py"):  # every row measured: none failed or hung
        skipped = [r for r in document["results"] if r.get("skipped")]
        failed = "\n".join(f"{r['section']}: {r['name']}: {r['skipped']}" for r in skipped)
        assert not skipped, failed + f"\n{done.stdout}\n{done.stderr[-12000:]}"

    if script in ("bench_queue_latency.py", "bench_scale.py"):  # times; times and memory
        out = tmp_path / "png"
        plotted = run_python(os.path.join(BENCHMARKS, "plot.py"), tmp_path, out, timeout=120)
        assert plotted.returncode == 0, plotted.stderr
        png = out / f"{document['benchmark']}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# a fiberlite whose Lock never comes back and whose RLock cannot be made; the rest is the
# standard library's (spawn), so those rows work
BROKEN_FIBERLITE = """
import multiprocessing, time
_spawn = multiprocessing.get_context("spawn")
Pipe, Process, Value = _spawn.Pipe, _spawn.Process, _spawn.Value

class Lock:
    def acquire(self):
        time.sleep(3600)

    def release(self):
        pass

def RLock():
    raise OSError("no semaphores here")
"""


def test_primitives_table_goes_on_past_failures(tmp_path):
    """A side that fails a row prints the one-line error in its cell; one that hangs is
    killed after --timeout and started anew for the next row; every row is printed."""
    package = tmp_path / "broken" / "fiberlite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BROKEN_FIBERLITE)
    done = run_python(os.path.join(BENCHMARKS, "bench_primitives.py"), "--quick", "--timeout", "8",
                      "--rows", "lock,rlock,value_read", "--before", tmp_path / "broken",
                      cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[0].strip(): line for line in done.stdout.splitlines() if "|" in line}
    assert "fails: timed out: no answer within 8 s" in rows["Lock acquire+release, creating process"]
    assert "fails: OSError: no semaphores here" in rows["RLock acquire+release, creating process"]
    # after the kill the side runs again: its Value row is measured, with a ratio
    read = [cell.strip() for cell in rows["Value.value read, creating process"].split("|")]
    assert "fails" not in rows["Value.value read, creating process"]
    assert read[-3].endswith(("ns", "us")) and read[-2].endswith("x"), read  # its figure and ratio


@pytest.mark.docker
@pytest.mark.kubernetes
def test_workdir_benchmark_runs_quick(tmp_path):
    """bench_workdir.py needs the project's image (its pods are Docker containers)."""
    from docker_env import ensure_docker
    image = ensure_docker()
    json_path = str(tmp_path / "workdir.json")
    done = run_python(os.path.join(BENCHMARKS, "bench_workdir.py"), "--quick", "--json", json_path,
                      "--image", image, cwd=ROOT, timeout=140)
    assert done.returncode == 0, f"bench_workdir.py failed:\n{done.stdout}\n{done.stderr}"
    for name in ("code in the image", "1 MiB tree", "20 MiB tree", "until the first result"):
        assert name in done.stdout, done.stdout
    document = json.loads(open(json_path).read())
    measured = [r for r in document["results"] if "seconds" in r]
    assert len(measured) == 3 and all(r["seconds"] > 0 and r["ratio"] for r in measured)


@pytest.mark.docker
def test_docker_benchmark_compares_a_packed_pool_with_local_jobs(tmp_path):
    """bench_docker.py's scale section: the same pool in containers and in local host jobs."""
    from docker_env import ensure_docker
    image = ensure_docker()
    json_path = str(tmp_path / "docker.json")
    done = run_python(os.path.join(BENCHMARKS, "bench_docker.py"), "--quick", "--only", "scale",
                      "--scale-per-job", "4", "--json", json_path, "--image", image, cwd=ROOT,
                      timeout=140)
    assert done.returncode == 0, f"bench_docker.py failed:\n{done.stdout}\n{done.stderr}"
    for name in ("fiberlite local, 2 host jobs of 4", "fiberlite docker, 2 containers of 4",
                 "Pool(8) until every worker has run a task", "chunksize=1", "default chunksize"):
        assert name in done.stdout, done.stdout
    document = json.loads(open(json_path).read())
    measured = [r for r in document["results"] if "seconds" in r]
    assert len(measured) == 6 and all(r["seconds"] > 0 and r["ratio"] for r in measured)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing processes apart needs two CPUs")
def test_primitives_placed_apart(tmp_path):
    """``--place apart`` runs each side on one CPU and its children on another, for the
    floor and every row, and says so in the table and the JSON."""
    json_path = tmp_path / "primitives.json"
    done = run_python(os.path.join(BENCHMARKS, "bench_primitives.py"), "--quick", "--share-machine", "off",
                      "--rows", "tcp,pipe,value_increment", "--json", json_path, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = sorted(os.sched_getaffinity(0))[:2]
    assert f"the side on CPU {first}, its children on CPU {second}" in done.stdout, done.stdout
    document = json.loads(json_path.read_text())
    assert document["params"]["place"] == "apart"  # the default with --share-machine off
    placement = document["placement"]
    assert set(placement) == {"tcp", "pipe", "value_increment"}
    for row, sides in placement.items():
        assert len(sides) == 2, (row, sides)  # mp spawn and fiberlite, each placed
        for where in sides.values():
            assert where == {"side": [first], "children": [second]}, (row, sides)


def test_placement_choices():
    """Which CPUs each placement takes, and a clear refusal where it cannot be done."""
    import sys
    sys.path.insert(0, BENCHMARKS)
    try:
        from _primitive_rows import cpus_for
    finally:
        sys.path.remove(BENCHMARKS)
    assert cpus_for("apart", {3, 1, 2}) == ({1}, {2})
    assert cpus_for("together", {3, 1, 2}) == ({1}, {1})
    assert cpus_for("free", {0, 1}) == ({0, 1}, {0, 1})
    with pytest.raises(RuntimeError, match="--place apart needs two CPUs.*use --place together"):
        cpus_for("apart", {5})
