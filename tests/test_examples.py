"""Every example runs, and computes what it says."""
from __future__ import annotations

import os
import re

import pytest
from interpreters import run_python

pytestmark = pytest.mark.timeout(180)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run_example(name: str, *args: str) -> str:
    done = run_python(os.path.join(EXAMPLES, name), *args, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # nothing said at exit either
    return done.stdout


def test_quickstart():
    out = run_example("quickstart.py")
    assert "squares: [0, 1, 4, 9, 16, 25" in out and "361]" in out
    assert "pipe: pong from Process-" in out and "exit codes: [0, 0, 0, 0, 0]" in out


def test_pi_estimation():
    out = run_example("pi_estimation.py", "20", "20000")
    estimate = float(re.search(r"pi is about ([0-9.]+)", out).group(1))
    assert abs(estimate - 3.14159) < 0.02


def test_evolution_strategies_improves_fitness():
    out = run_example("evolution_strategies.py", "30")
    start, final = map(float, re.search(r"fitness: (-?[0-9.]+) -> (-?[0-9.]+)", out).groups())
    assert final > start / 20  # at least a twentyfold smaller distance to the target


def test_producer_consumer():
    out = run_example("producer_consumer.py")
    assert out.startswith("100 results") and str(sum(i * i for i in range(99))) in out


def test_shared_state():
    out = run_example("shared_state.py")
    assert "33 words seen" in out and "'the' counted 9 times" in out


def test_cluster_run_on_the_local_backend():
    out = run_example("cluster_run.py", "5")
    assert "backend local: squares [0, 1, 4, 9, 16]" in out


@pytest.mark.docker
def test_cluster_run_with_fiberlite_run_on_docker():
    from docker_env import ensure_docker
    import docker
    image = ensure_docker()
    script = os.path.join(EXAMPLES, "cluster_run.py")
    done = run_python("-m", "fiberlite.cli", "run", "--backend", "docker", "--image", image, script, "6",
                      timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backend docker: squares [0, 1, 4, 9, 16, 25]" in done.stdout
    run_id = re.search(r"run ([0-9a-f]+) \[docker\]", done.stderr).group(1)
    client = docker.from_env()
    try:
        left = client.containers.list(all=True, filters={"label": f"fiberlite/run={run_id}"})
        assert left == [], left
    finally:
        client.close()


def test_futures_executor():
    out = run_example("futures_executor.py")
    assert "longest chain below 10000 starts at 6171" in out
    assert "collatz_steps(27) = 111" in out and "collatz_steps(871) = 178" in out
    assert "raised in a worker: -1 is not positive | remote traceback attached: True" in out


def test_joblib_sklearn():
    pytest.importorskip("sklearn")
    out = run_example("joblib_sklearn.py")
    assert "squares: [0, 1, 4, 9, 16, 25, 36, 49]" in out
    assert "the scores of n_jobs=1: True" in out  # GridSearchCV with the fiberlite backend


def test_dask_processes():
    pytest.importorskip("dask")
    out = run_example("dask_processes.py")
    assert f"sum of squares: {sum(i * i for i in range(1_000_000))}" in out
    assert "trace of y @ y.T: 4000000.0" in out


def test_torch_dataloader():
    pytest.importorskip("torch")
    out = run_example("torch_dataloader.py")
    assert "4 batches from 2 fiberlite workers, the same as num_workers=0: True" in out
