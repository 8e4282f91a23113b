"""The benchmark scripts keep working: each runs with ``--quick``, prints its table and
writes its JSON; the plot script turns that JSON into PNG files. No timing is asserted."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from interpreters import run_python

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
                      "fiberlite Pool, bytes", "mp spawn Pool, bytes", "10 workers", "100 workers"],
    "bench_kubernetes.py": ["16 at a time", "one at a time", "until every pod is created",
                            "until the first result", "until every worker has run a task",
                            "pods/s"],
    "bench_dashboard.py": ["page closed", "page open", "queue.put seen by a reader"],
    "bench_scale.py": ["mp spawn Pool", "fiberlite Pool", "Pool(4) until every worker", "Pool(8)",
                       "chunksize=1, 8 workers", "default chunksize", "master CPU per task",
                       "workers' CPU per task", "unique memory (USS) per worker", "master RSS",
                       "master CPU per task with simulated workers"],
}

# smaller sizes than --quick, for the scripts whose quick run is still long; enough tasks
# that CPU times, read in clock ticks of 10 ms, are not zero
OPTIONS = {
    "bench_kubernetes.py": ["--workers", "4", "--pods", "2"],
    "bench_scale.py": ["--workers", "4,8", "--tasks", "200", "--cpu-tasks", "1000"],
}


def run_quick(script: str, json_path: str) -> subprocess.CompletedProcess:
    return run_python(os.path.join(BENCHMARKS, script), "--quick", "--json", json_path,
                      *OPTIONS.get(script, []), cwd=ROOT, timeout=120)


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
    assert all(r["ratio"] is not None for r in measured)

    if script in ("bench_queue_latency.py", "bench_scale.py"):  # times; times and memory
        out = tmp_path / "png"
        plotted = run_python(os.path.join(BENCHMARKS, "plot.py"), tmp_path, out, timeout=120)
        assert plotted.returncode == 0, plotted.stderr
        png = out / f"{document['benchmark']}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
