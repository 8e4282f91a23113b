"""Containers that go silent, on a Docker bridge network of the test's own: cut off with
``docker network disconnect --force`` (no FIN, no RST ever arrives) or frozen with
``docker pause`` (their kernel still acknowledges, their processes answer nothing).

Each scenario runs a master script on this machine (its hub listens on the network's
gateway, as a master outside the network's containers does) with ``peer_timeout`` =
:data:`TIMEOUT`. One master run per script; each test reads its part of the report.
The network is created with a unique name and removed at the end; all traffic stays on
this machine's bridge."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from docker_env import ensure_docker
from paths import ROOT, TESTS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TIMEOUT = 3.0
# a connection is given up 3 to 4 ticks (of a quarter of the timeout) after the last thing
# heard on it, which an idle one heard up to a tick before it fell silent: no sooner than
EARLIEST = TIMEOUT / 2

COMMON = textwrap.dedent("""
    import json, os, subprocess, sys, time
    import fiberlite
    from fiberlite.runtime import launcher

    NETWORK, TIMEOUT = sys.argv[1], float(sys.argv[2])
    given_up = []   # names of the jobs the master gave up as silent
    _real_given_up = launcher.Launch._given_up

    def _record(self):
        given_up.append(self.name)
        _real_given_up(self)
    launcher.Launch._given_up = _record

    def docker(*args):
        subprocess.run(["docker", *args], check=True, capture_output=True, timeout=60)

    def cut(container):
        docker("network", "disconnect", "--force", NETWORK, container)

    def report(name, **values):
        print(json.dumps({"scenario": name, **values}), flush=True)

    def until(check, seconds):
        deadline = time.monotonic() + seconds
        while not check() and time.monotonic() < deadline:
            time.sleep(0.05)
        return check()

    def where():
        return os.environ["FIBERLITE_DOCKER_CONTAINER"]
""")

POOL = COMMON + textwrap.dedent("""
    TASKS = 600

    def work(x):
        time.sleep(0.02)
        return x * x, where(), time.time()

    def run_map(pool, disturb):
        # a map of TASKS, disturbed (disturb(victim) -> when) once 100 results are in (in
        # any order: an ordered imap would hold the pool up behind the victim's tasks)
        victim = sorted({c for _, c, _ in pool.map(work, range(40), chunksize=1)})[0]
        del given_up[:]
        results, when = [], None
        for item in pool.imap_unordered(work, range(TASKS), chunksize=1):
            results.append(item)
            if len(results) == 100:
                when = disturb(victim)
        exact = sorted(v for v, _, _ in results) == [x * x for x in range(TASKS)]
        later = sum(1 for _, c, t in results if c == victim and t > when)
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", victim],
                               capture_output=True, text=True, timeout=60).stdout.strip()
        return dict(exact=exact, given_up=list(given_up), victim_results_after=later,
                    seconds_after=round(time.time() - when, 1), victim_running=state == "true")

    def cut_now(victim):
        cut(victim)
        return time.time()

    def pause_briefly(victim):
        docker("pause", victim)
        time.sleep(TIMEOUT / 3)   # the pause itself
        docker("unpause", victim)
        return time.time()

    def pause_past_the_timeout(victim):
        docker("pause", victim)
        lost = until(lambda: given_up, TIMEOUT + 30)
        docker("unpause", victim)
        resumed = time.time()
        exited = subprocess.run(["docker", "wait", victim], capture_output=True, text=True, timeout=30)
        # a container that ended and was removed before the wait began has ended too
        gone = "No such container" in exited.stderr
        report("fenced_exit", lost=lost, exit=exited.stdout.strip() or ("removed" if gone else ""),
               wait_error=exited.stderr.strip())
        return resumed

    if __name__ == "__main__":
        with fiberlite.Pool(3) as pool:
            report("cut", **run_map(pool, cut_now))
            report("short_pause", **run_map(pool, pause_briefly))
            launcher.Launch._kill_lost = lambda self: None   # the node cannot be reached
            report("fenced", **run_map(pool, pause_past_the_timeout))
""")

WAITERS = COMMON + textwrap.dedent("""
    from fiberlite.errors import ConnectionLost, RingError

    def own_queue(back):
        back.put((fiberlite.Queue(), where()))
        time.sleep(600)

    def ring_member(ring, out):
        import numpy as np
        out.put(("where", ring.rank, where()))
        ring.barrier()
        if ring.rank == 1:
            time.sleep(600)
        try:
            ring.all_reduce(np.ones(4))
        except RingError as exc:
            out.put(("error", ring.rank, str(exc)))
            raise

    def failure(call):
        started = time.monotonic()
        try:
            call()
        except Exception as exc:
            return dict(error=type(exc).__name__, message=str(exc),
                        seconds=round(time.monotonic() - started, 1))
        return dict(error=None)

    if __name__ == "__main__":
        back = fiberlite.Queue()
        creator = fiberlite.Process(target=own_queue, args=(back,))
        creator.start()
        q, container = back.get(timeout=120)
        q.put("first")
        assert q.get(timeout=60) == "first"
        cut(container)
        report("queue", **failure(lambda: q.get(timeout=120)))
        creator.join(60)

        with fiberlite.Manager() as manager:
            shared = manager.dict()
            shared["a"] = 1
            cut(manager._process._popen.job.id)
            report("manager", **failure(lambda: shared.update(b=2)))

        out = fiberlite.Queue()
        ring = fiberlite.Ring(3, ring_member, args=(out,), timeout=120)
        ring.start()
        places = {}
        while len(places) < 3:
            _, rank, place = out.get(timeout=120)
            places[rank] = place
        cut(places[1])
        joined = failure(lambda: ring.join(TIMEOUT + 60))
        others = sorted(out.get(timeout=30)[1:] for _ in range(2))
        report("ring", others=others, exitcodes=ring.exitcodes, **joined)
""")


@pytest.fixture(scope="module")
def network():
    import docker
    image = ensure_docker()
    client = docker.APIClient(version="auto")
    name = f"fiberlite-liveness-{uuid.uuid4().hex[:8]}"
    client.create_network(name, driver="bridge", labels={"fiberlite/test": "liveness"})
    try:
        yield image, name
    finally:
        try:
            client.remove_network(name)
        except docker.errors.APIError:   # a container still attached: its run removes it
            pass
        client.close()


def run_master(network, tmp_path_factory, script: str) -> dict[str, dict]:
    """Run ``script`` as the master on ``network``; its reports by scenario."""
    image, name = network
    path = tmp_path_factory.mktemp("liveness") / "master.py"
    path.write_text(script)
    env = {"PYTHONPATH": f"{TESTS}:{ROOT}", "FIBERLITE_BACKEND": "docker", "FIBERLITE_IMAGE": image,
           "FIBERLITE_DOCKER_NETWORK": name, "FIBERLITE_PEER_TIMEOUT": str(TIMEOUT)}
    full = {k: v for k, v in os.environ.items()
            if k not in ("FIBERLITE_RUN_ID", "FIBERLITE_AUTHKEY", "FIBERLITE_JOB_NAME")}
    done = subprocess.run([sys.executable, str(path), name, str(TIMEOUT)], cwd=path.parent,
                          capture_output=True, text=True, timeout=280, env={**full, **env})
    reports = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            reports[item.pop("scenario")] = item
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return reports


@pytest.fixture(scope="module")
def pool_run(network, tmp_path_factory):
    return run_master(network, tmp_path_factory, POOL)


@pytest.fixture(scope="module")
def waiters_run(network, tmp_path_factory):
    return run_master(network, tmp_path_factory, WAITERS)


# -- a pool's worker ---------------------------------------------------------------------------
def test_a_pool_map_finishes_exact_when_a_worker_is_cut_off(pool_run):
    cut = pool_run["cut"]
    assert cut["exact"], pool_run
    # the master gave it up and killed it, or it gave the master up first and exited
    assert len(cut["given_up"]) <= 1 and not cut["victim_running"], pool_run
    assert cut["victim_results_after"] == 0
    # the timeout plus the work (500 tasks of 20 ms on 3 workers, ~4 s), with room for
    # a container to start: not the minutes a job's own end would take to be noticed
    assert cut["seconds_after"] < TIMEOUT + 30


def test_a_worker_paused_for_less_than_the_timeout_is_kept(pool_run):
    brief = pool_run["short_pause"]
    assert brief["exact"] and brief["given_up"] == [], pool_run
    assert brief["victim_results_after"] > 0   # it went on working


def test_a_worker_paused_past_the_timeout_is_fenced_when_it_comes_back(pool_run):
    exit_ = pool_run["fenced_exit"]
    assert exit_["lost"] and exit_["exit"] != "", exit_   # it ended by itself once unpaused
    fenced = pool_run["fenced"]
    assert fenced["exact"] and len(fenced["given_up"]) == 1 and not fenced["victim_running"], pool_run
    assert fenced["victim_results_after"] == 0   # nothing it did after coming back counts


# -- whoever waits on a silent job ---------------------------------------------------------------
def test_a_queue_reader_gets_a_clear_error_when_the_queue_creator_is_cut_off(waiters_run):
    queue = waiters_run["queue"]
    assert queue["error"] == "ConnectionLost", queue
    assert f"answered nothing for {TIMEOUT:g} s" in queue["message"]
    assert EARLIEST <= queue["seconds"] < TIMEOUT + 30


def test_a_manager_client_gets_a_clear_error_when_the_manager_is_cut_off(waiters_run):
    manager = waiters_run["manager"]
    assert manager["error"] == "ConnectionLost", manager
    assert "no longer running" in manager["message"]
    assert f"answered nothing for {TIMEOUT:g} s" in manager["message"]
    assert EARLIEST <= manager["seconds"] < TIMEOUT + 30


def test_ring_ranks_get_a_clear_error_when_one_is_cut_off(waiters_run):
    ring = waiters_run["ring"]
    assert ring["error"] == "RingError", ring
    assert f"rank 1 was given up: it answered nothing for {TIMEOUT:g} s" in ring["message"]
    assert [rank for rank, _ in ring["others"]] == [0, 2]
    for _, message in ring["others"]:
        assert message.startswith("rank 1 left the ring") and "answered nothing" in message
    # killed by the master, or (cut off, it gave the master up at the same moment) exited itself
    assert ring["exitcodes"][1] in (-9, 1) and ring["exitcodes"][0] == ring["exitcodes"][2] == 1
