"""Direct calls (``fiberlite/wire/direct.py``, ``fiberlite/runtime/direct.py``): a job of
another machine calls its creator's primitives on plain TCP connections that speak for
its nng connection, and a lock's acquire can carry a small ``Value`` to it
(``fiberlite/synchronize/carry.py``)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from interpreters import run_python

import fiberlite
from fiberlite.errors import AuthenticationError
from fiberlite.runtime import identity
from fiberlite.wire import oneway
from fiberlite.wire.direct import DirectConnection, DirectServer

pytestmark = pytest.mark.timeout(120)
WAIT = 30


@pytest.fixture
def server():
    seen: list = []

    def handler(request, message):
        seen.append((request.peer, message))
        request.reply(("echo", message))
    direct = DirectServer(identity.key(), "127.0.0.1", handler)
    yield direct, seen
    direct.close()


def test_a_connection_with_the_ticket_of_a_peer_speaks_for_that_peer(server):
    direct, seen = server
    address, ticket = direct.offer(7)
    conn = DirectConnection(address, ticket, identity.key())
    assert conn.call((1, "ping", (2,))) == (True, ("echo", (1, "ping", (2,))))
    assert seen == [(7, (1, "ping", (2,)))]
    assert direct.offer(7) == (address, ticket)  # one ticket per peer
    conn.close()


def test_a_forged_ticket_or_a_wrong_key_gets_no_connection(server):
    direct, seen = server
    address, _ = direct.offer(7)
    with pytest.raises((ConnectionError, OSError)):
        DirectConnection(address, b"x" * 16, identity.key())
    with pytest.raises(AuthenticationError):
        DirectConnection(address, direct.offer(7)[1], b"not the key" * 3)
    assert seen == []


def test_the_end_of_a_peer_closes_its_connections_before_it_is_reported(server):
    direct, seen = server
    address, ticket = direct.offer(3)
    conn = DirectConnection(address, ticket, identity.key())
    conn.call((1, "first", ()))
    reported = threading.Event()
    closed_first: list = []

    def then():
        closed_first.append(not direct._conns.get(3))
        reported.set()
    assert direct.end_peer(3, then)
    assert reported.wait(WAIT)
    assert closed_first == [True]
    with pytest.raises((ConnectionError, OSError)):
        conn.call((1, "after", ()))
    with pytest.raises((ConnectionError, OSError)):  # its ticket is no longer taken
        DirectConnection(address, ticket, identity.key())
    assert not direct.end_peer(3, then)  # (told once)


# -- through jobs, with share_machine off -------------------------------------------------------
@pytest.fixture
def across_machines(monkeypatch):
    from fiberlite import config
    monkeypatch.setattr(config, "_overrides", dict(config._overrides, share_machine=False))
    monkeypatch.setattr(config, "_resolved", None)


def report_paths(lock, value, results):
    """Use the lock and the value, and say which path the calls took."""
    from fiberlite.runtime import direct
    with lock:
        value.value += 1
        value.get_obj().value += 1  # a raw access of the holder sees what it wrote
        results.put(value.value)
    results.put(sorted(type(channel).__name__ for channel in direct._channels.values()))


def test_a_job_of_another_machine_calls_directly_and_counts_right(across_machines):
    value = fiberlite.Value("i", 5)
    results = fiberlite.Queue()
    job = fiberlite.Process(target=report_paths, args=(value.get_lock(), value, results))
    job.start()
    assert results.get(timeout=WAIT) == 7
    assert results.get(timeout=WAIT) == ["_Channel"]
    job.join(WAIT)
    assert job.exitcode == 0
    assert value.value == 7


def hold_and_write(value, holding):
    with value.get_lock():
        value.value = 999  # in the copy the acquire brought: lost with this job
        holding.set()
        threading.Event().wait()  # until killed


def add(value, times):
    for _ in range(times):
        with value.get_lock():
            value.value += 1


def test_a_holder_killed_across_machines_leaves_the_lock_free_and_the_others_count_on(across_machines):
    value = fiberlite.Value("i", 10)
    holding = fiberlite.Event()
    holder = fiberlite.Process(target=hold_and_write, args=(value, holding))
    holder.start()
    assert holding.wait(WAIT)
    others = [fiberlite.Process(target=add, args=(value, 50)) for _ in range(2)]
    for job in others:
        job.start()
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(WAIT)
    assert holder.exitcode == -signal.SIGKILL
    for job in others:
        job.join(WAIT)
        assert job.exitcode == 0
    assert value.get_lock().acquire(timeout=WAIT)
    value.get_lock().release()
    assert value.value == 10 + 100  # the killed holder's write never reached the memory


def wait_and_answer(ping, pong, rounds):
    for _ in range(rounds):
        assert ping.wait(WAIT)
        ping.clear()
        pong.set()


def test_events_across_machines_ping_pong(across_machines):
    ping, pong = fiberlite.Event(), fiberlite.Event()
    job = fiberlite.Process(target=wait_and_answer, args=(ping, pong, 20))
    job.start()
    for _ in range(20):
        ping.set()
        assert pong.wait(WAIT)
        pong.clear()
    job.join(WAIT)
    assert job.exitcode == 0


def test_with_tls_a_job_calls_through_nng(monkeypatch):
    from fiberlite.runtime.direct import _channel
    from fiberlite.runtime import direct
    monkeypatch.setattr(direct, "_channels", {})
    assert _channel("tls+tcp://127.0.0.1:1") is None  # decided without dialing anything
    assert direct._channels == {"tls+tcp://127.0.0.1:1": direct.UNAVAILABLE}


def test_a_direct_connection_refuses_a_non_tcp_address():
    with pytest.raises(ValueError):
        DirectConnection("ipc:///nowhere", b"t" * 16, identity.key())


TLS_SCRIPT = '''
import fiberlite

def work(value, done, paths):
    from fiberlite.runtime import direct
    for _ in range(20):
        with value.get_lock():
            value.value += 1
    done.set()
    paths.put(sorted(set(map(str, direct._channels.values()))))

if __name__ == "__main__":
    value, done, paths = fiberlite.Value("i", 0), fiberlite.Event(), fiberlite.Queue()
    job = fiberlite.Process(target=work, args=(value, done, paths))
    job.start()
    print(done.wait(60), paths.get(timeout=60), flush=True)
    job.join(60)
    print(value.value, job.exitcode, flush=True)
'''


def test_with_tls_on_a_job_of_another_machine_calls_through_nng_and_counts_right(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(TLS_SCRIPT)
    out = run_python(script, env={"FIBERLITE_TLS": "1", "FIBERLITE_SHARE_MACHINE": "0"}, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True ['unavailable']", "20 0"]


# -- one-way requests: not answered, handled in the order their process sent them, before
# -- any later call of it on any connection, and settled before it says anything elsewhere
def connect(direct, peer=7):
    address, ticket = direct.offer(peer)
    return DirectConnection(address, ticket, identity.key())


def until(predicate, what):
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_one_way_requests_get_no_answer_and_a_later_call_sees_them(server):
    direct, seen = server
    conn = connect(direct)
    assert conn.post("first", 1) and conn.post("second", 2)
    # the call's answer is the first frame to come back: the one-way requests had none
    assert conn.call("third", 2) == (True, ("echo", "third"))
    assert seen == [(7, "first"), (7, "second"), (7, "third")]
    conn.close()


def test_a_call_on_another_connection_waits_for_the_one_way_requests_sent_before_it(server):
    direct, seen = server
    posting, calling = connect(direct), connect(direct)
    answers: list = []
    caller = threading.Thread(target=lambda: answers.append(calling.call("after", 1)))
    caller.start()
    until(lambda: 7 in direct._holding, "the call was not held back")
    assert seen == [] and not answers
    assert posting.post("before", 1)
    caller.join(WAIT)
    assert answers == [(True, ("echo", "after"))]
    assert seen == [(7, "before"), (7, "after")]
    posting.close()
    calling.close()


def test_one_way_requests_are_handled_in_their_order_whatever_their_connection(server):
    direct, seen = server
    first, second = connect(direct), connect(direct)
    assert second.post("two", 2)  # arrives first: kept until one comes
    until(lambda: 7 in direct._holding, "the second one-way request was not held back")
    assert first.post("one", 1)
    assert first.call(None, 2) == (True, None)  # (an empty call: its turn has come)
    assert seen == [(7, "one"), (7, "two")]
    first.close()
    second.close()


def test_a_one_way_request_sent_again_is_handled_once(server):
    direct, seen = server
    conn, again = connect(direct), connect(direct)
    assert conn.post("once", 1)
    assert again.post("once", 1)  # (its sender did not know whether the first went)
    assert again.call("next", 1) == (True, ("echo", "next"))
    assert conn.call(None, 1) == (True, None)
    assert seen == [(7, "once"), (7, "next")]
    conn.close()
    again.close()


def test_the_end_of_a_peer_forgets_its_held_requests(server):
    direct, seen = server
    conn = connect(direct, peer=3)
    threading.Thread(target=lambda: _quietly(conn.call, "never", 5), daemon=True).start()
    until(lambda: 3 in direct._holding, "the call was not held back")
    done = threading.Event()
    assert direct.end_peer(3, done.set)
    assert done.wait(WAIT)
    assert 3 not in direct._holding and 3 not in direct._one_way_done
    assert seen == []


def _quietly(call, *args):
    try:
        call(*args)
    except (ConnectionError, OSError):
        pass


def set_then_tell(event, conn, rounds):
    """Set the event (one-way), then say so on a pipe: the pipe's message must not be
    seen before the set."""
    for i in range(rounds):
        event.set()
        conn.send(i)
        assert conn.recv() == "cleared"


def test_what_a_job_sends_on_a_pipe_after_a_set_comes_after_it(across_machines):
    event = fiberlite.Event()
    mine, theirs = fiberlite.Pipe()
    job = fiberlite.Process(target=set_then_tell, args=(event, theirs, 30))
    job.start()
    for i in range(30):
        assert mine.poll(WAIT)
        assert mine.recv() == i
        assert event.is_set()  # (read in the creator's memory)
        event.clear()
        mine.send("cleared")
    job.join(WAIT)
    assert job.exitcode == 0


def write_and_leave(value, rounds):
    for _ in range(rounds):
        with value.get_lock():
            value.value += 1


def test_what_a_job_released_last_is_in_the_value_once_it_has_exited(across_machines):
    value = fiberlite.Value("i", 0)
    jobs = [fiberlite.Process(target=write_and_leave, args=(value, 40)) for _ in range(2)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(WAIT)
        assert job.exitcode == 0
    assert value.value == 80  # read at once, without the lock


def release_and_report(value, event, results):
    from fiberlite.runtime import direct
    with value.get_lock():
        value.value = 41
    event.set()
    owed = bool(oneway.unsettled)
    results.put((owed, sorted(type(c).__name__ for c in direct._channels.values())))
    # (the puts themselves may be on their way, gathered: the direct calls are not)
    results.put(any(isinstance(key, direct._Channel) for key in oneway.unsettled))


def test_a_jobs_release_and_set_are_one_way_and_settled_by_its_next_message(across_machines):
    value, event, results = fiberlite.Value("i", 0), fiberlite.Event(), fiberlite.Queue()
    job = fiberlite.Process(target=release_and_report, args=(value, event, results))
    job.start()
    owed, channels = results.get(timeout=WAIT)
    assert channels == ["_Channel"] and owed  # (not settled before the put began)
    assert results.get(timeout=WAIT) is False  # the first put settled them
    assert event.is_set() and value.value == 41
    job.join(WAIT)
    assert job.exitcode == 0


def test_a_send_on_a_lane_settles_the_one_way_calls_first():
    """A lane (a queue of this machine) tells the processes of the machine: what they are
    told must come after the one-way calls made before it."""
    q = fiberlite.SimpleQueue()
    assert q._lane is not None, "a queue of this machine has a lane"
    seen: list = []

    def settle_one() -> None:
        seen.append(q.empty())  # settled before the item is in the lane
        oneway.paid("hub")
    oneway.owe("hub", settle_one)
    try:
        q.put("told")
        assert seen == [True] and not oneway.unsettled
        assert q.get() == "told"
    finally:
        oneway.paid("hub")


def test_an_interrupted_call_s_own_answer_reaches_the_withdrawal_s_keeper():
    """A queue's read made directly and interrupted (Ctrl-C) is withdrawn on its own
    connection; an answer it was given before the withdrawal (an item lent to it) is
    handed to ``kept`` (which gives the item back), not dropped."""
    from fiberlite.runtime import direct as direct_calls

    held: list = []

    def handler(request, message):
        oid, method, args = message
        if method == "receive":
            held.append(request)  # (answered when withdrawn: as an item that came meanwhile)
            return
        while held:
            held.pop().reply((41, "item"))
        request.reply(method)
    server = DirectServer(identity.key(), "127.0.0.1", handler)
    try:
        address, ticket = server.offer(5)
        conn = DirectConnection(address, ticket, identity.key())

        class Channel:
            given_back, discarded = [], []

            def give_back(self, c):
                self.given_back.append(c)

            def discard(self, c):
                self.discarded.append(c)

        class Ref:
            oid = 9
        kept: list = []
        conn.request((9, "receive", ("get",)))  # (its wait interrupted: nothing read)
        channel = Channel()
        direct_calls._withdraw(channel, conn, Ref(), ("withdraw", "get"),
                               lambda ok, value: kept.append((ok, value)))
        assert kept == [(True, (41, "item"))]
        assert channel.given_back == [conn] and not channel.discarded
        assert conn.call((9, "other", ())) == (True, "other")  # (the connection reads on)
        conn.close()
    finally:
        server.close()
