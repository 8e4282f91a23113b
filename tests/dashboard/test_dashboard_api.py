"""The page's data, read over HTTP from a live run: counts of tasks, failures, lost
workers, queues; read-only; off by default; bad addresses rejected clearly."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest

from dashboard.run_driver import Events, LiveRun, read
from waiting import eventually
from interpreters import run_python

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def live_run():
    run = LiveRun()
    yield run
    assert run.close() == 0, "".join(run.stderr)


def pool_of(state: dict) -> dict:
    assert len(state["pools"]) == 1, state["pools"]
    return state["pools"][0]


def test_counts_a_map_its_failures_and_a_lost_worker(live_run):
    assert live_run.ask("map") == "map exact"
    state = live_run.get("api/state")
    pool = pool_of(state)
    assert (pool["size"], pool["workers"]) == (4, 4)
    assert set(pool["jobs"]) <= {job["name"] for job in state["jobs"]}
    assert all(job["state"] == "running" and job["backend"] == "local" for job in state["jobs"])
    [batch] = pool["batches"]
    assert (batch["call"], batch["function"], batch["done"], batch["total"], batch["failed"]) == \
        ("map", "slow_square", 1000, 1000, 0)
    assert batch["finished"] and batch["rate"] > 0

    assert live_run.ask("fail") == "failed"
    pool = pool_of(live_run.get("api/state"))
    failing = pool["batches"][0]
    assert (failing["function"], failing["done"], failing["total"], failing["failed"]) == \
        ("fails_on_threes", 20, 20, 2)  # 3 and 13, one task a chunk
    assert len(pool["errors"]) == 2
    error = pool["errors"][0]
    assert error["error"].startswith("KeyError") and "fails_on_threes" in error["traceback"]
    assert "live_run.py" in error["traceback"]  # the worker's own frames

    assert live_run.ask("kill") == "kill exact"
    pool = pool_of(live_run.get("api/state"))
    assert pool["losses"] == 1 and pool["retries"] >= 1
    assert pool["batches"][0]["done"] == 80 == pool["batches"][0]["total"]
    assert pool["done"] == 1000 + 20 + 80


def test_every_job_of_a_page_started_by_the_first_object():
    """The page asked for by the environment starts with the run's first object, the pool,
    whose host jobs start at once on threads of their own: it lists every one."""
    run = LiveRun(page_from_environment=True)
    try:
        answer, *jobs = run.ask("jobs").split()
        assert answer == "jobs" and len(jobs) >= 1
        state = run.get("api/state")
        assert sorted(job["name"] for job in state["jobs"]) == jobs
        assert sorted(pool_of(state)["jobs"]) == jobs
    finally:
        assert run.close() == 0, "".join(run.stderr)


def test_an_imap_over_a_sized_input_shows_its_total(live_run):
    assert live_run.ask("imap") == "imap started 0"
    # its input is read only as far as its consumer allows: the total is the range's length
    [batch] = pool_of(live_run.get("api/state"))["batches"]
    assert (batch["call"], batch["total"]) == ("imap", 400) and batch["done"] < 400
    assert live_run.ask("imap-finish") == "imap exact"
    [batch] = pool_of(live_run.get("api/state"))["batches"]
    assert (batch["done"], batch["total"]) == (400, 400)


def test_queue_size_and_job_usage(live_run):
    state = live_run.get("api/state")
    assert [q["size"] for q in state["queues"]] == [0]
    assert live_run.ask("put") == "put"
    state = live_run.get("api/state")
    assert [(q["size"], q["total"]) for q in state["queues"]] == [(1, 1)]
    assert live_run.ask("map") == "map exact"
    state = live_run.get("api/state")  # the meter samples every 2 s while the page is read
    assert all(job["memory"] and job["memory"] > 10 << 20 for job in state["jobs"]), state["jobs"]
    answer, name = live_run.ask("talk").split()
    assert answer == "talked"
    log = live_run.get("api/logs?job=" + name)["text"].splitlines()
    # the last 200 of the 300 lines it printed, which also went to the run's own output
    assert log == [f"line {i} of a job" for i in range(100, 300)]
    assert live_run.stderr_lines("line ", 300) == [f"line {i} of a job" for i in range(300)]


def test_ring_members_and_their_collectives(live_run):
    assert live_run.ask("ring") == "ring started"
    def ring() -> dict:
        [ring] = live_run.get("api/state")["rings"]
        return ring
    eventually(lambda: all(m["collectives_per_s"] for m in ring()["members"]), 60,
               what=lambda: f"both ranks' collectives on the page ({ring()})")
    running = ring()
    assert [(m["rank"], m["exitcode"]) for m in running["members"]] == [(0, None), (1, None)]
    answer, *counts = live_run.ask("ring-stop").split()
    assert answer == "ring-stopped" and counts[0] == counts[1]
    count = int(counts[0])
    state = live_run.get("api/state")
    [ring] = state["rings"]
    hosts = {job["name"]: job["host"] for job in state["jobs"]}
    for rank, member in enumerate(ring["members"]):
        # every collective counted once, with its 8 KiB, reported before the member left
        assert (member["rank"], member["exitcode"]) == (rank, 0)
        assert (member["collectives"], member["bytes"]) == (count, count * 8192)
        assert member["host"] == hosts[member["job"]]
        assert 0 < member["collectives_per_s"] <= 100  # each pauses 10 ms
        assert member["bytes_per_s"] == pytest.approx(member["collectives_per_s"] * 8192)


def test_changes_are_pushed_once_each(live_run):
    events = Events(live_run.url)
    try:
        first = events.next()  # the whole data, at once
        assert [q["size"] for q in first["queues"]] == [0]
        assert live_run.ask("put") == "put"
        states = [events.state]
        while [q["size"] for q in events.state["queues"]] != [1]:
            events.next()  # bounded by the test's timeout
            states.append(events.state)
    finally:
        events.close()
    # nothing pushed twice: each state differs from the one before
    for before, after in zip(states, states[1:]):
        assert {**before, "time": 0} != {**after, "time": 0}


def test_a_running_map_is_sent_as_its_counts_alone(live_run):
    events = Events(live_run.url)
    try:
        events.next()
        live_run.send("map")
        counts, whole = [], 0  # the map's tasks done, in the messages of counts alone
        while True:  # bounded by the test's timeout
            message = events.next()
            pool = pool_of(events.state)
            if "progress" in message:
                assert set(message) == {"time", "progress"}
                [row] = message["progress"]["pools"][pool["name"]]["batches"] or [None]
                if row is not None:
                    counts.append(row["done"])
                    assert row["total"] == 1000 and row["function"] == "slow_square"
            else:
                whole += 1
            if pool["batches"] and pool["batches"][0]["done"] == 1000:
                break
        assert live_run.answer() == "map exact"
    finally:
        events.close()
    assert pool["batches"][0]["finished"] and pool["done"] == 1000
    assert events.state["tasks_done"] == 1000
    assert any(0 < done < 1000 for done in counts), counts  # seen part done
    assert counts == sorted(counts), counts
    assert whole >= 1  # the call's start and end come as whole data


def test_read_only_and_unknown_paths(live_run):
    request = urllib.request.Request(live_run.url + "api/state", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(live_run.url + "api/logs?job=nope", timeout=10)
    assert missing.value.code == 404
    assert live_run.url.startswith("http://127.0.0.1:")


def test_the_data_is_strict_json_whatever_it_holds():
    from fiberlite.dashboard.push import encode

    class Odd:
        def __str__(self) -> str:
            return "odd one"
    data = {"rate": float("inf"), "none": float("nan"), 7: (1, 2.5), "what": Odd()}
    # what a browser's JSON.parse takes: no Infinity or NaN, keys as text
    decoded = json.loads(encode(data), parse_constant=lambda name: pytest.fail(name))
    assert decoded == {"rate": None, "none": None, "7": [1, 2.5], "what": "odd one"}


def run_snippet(code: str, **env: str) -> subprocess.CompletedProcess:
    return run_python("-c", code, env=env, timeout=60)


OFF = """
import fiberlite as mp, fiberlite.observe as observe, sys
q = mp.Queue()
import fiberlite.dashboard as d
print(observe.watchers, d.url())
"""


def test_off_by_default_no_watcher_left():
    done = run_snippet(OFF, FIBERLITE_DASHBOARD="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "None"]
    assert "dashboard" not in done.stderr


def test_bad_address_is_one_clear_error():
    done = run_snippet("import fiberlite as mp; mp.Queue()", FIBERLITE_DASHBOARD="here:port")
    assert done.returncode == 1
    assert "invalid value 'here:port' for setting 'dashboard'" in done.stderr
    assert "host:port" in done.stderr


def test_a_busy_port_is_one_clear_error():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_snippet(f"import fiberlite as mp; mp.init(dashboard='127.0.0.1:{port}')")
    assert done.returncode == 1
    assert f"cannot serve the dashboard at 127.0.0.1:{port}" in done.stderr
    assert "port 0 for any free port" in done.stderr


def ring_member(ring, release):
    total = ring.all_reduce(ring.rank + 1)
    release.wait(60)
    return total


def test_managers_and_rings(page):
    import fiberlite
    with fiberlite.Manager() as manager:
        release = manager.Event()
        ring = fiberlite.Ring(2, ring_member, args=(release,), timeout=60)
        ring.start()
        try:
            eventually(lambda: [r["joined"] for r in read(page + "api/state")["rings"]] == [2], 60,
                       what="both ranks joined on the page")
            state = read(page + "api/state")
            [ring_row] = state["rings"]
            assert ring_row["world_size"] == 2
            assert [m["rank"] for m in ring_row["members"]] == [0, 1]
            assert all(m["host"] and m["exitcode"] is None for m in ring_row["members"])
            jobs = {j["name"] for j in state["jobs"]}
            assert {m["job"] for m in ring_row["members"]} <= jobs
            [manager_row] = state["managers"]
            assert manager_row["state"] == "started" and manager_row["job"] in jobs
        finally:
            release.set()
            ring.join(60)
    assert ring.results == [3, 3]
    state = read(page + "api/state")
    assert [m["exitcode"] for m in state["rings"][0]["members"]] == [0, 0]
    assert state["managers"][0]["state"] == "shutdown"
