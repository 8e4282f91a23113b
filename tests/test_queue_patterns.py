"""Queues and pipes with several writers and readers on one machine: every item once, in
order (each producer's for a Queue; the order sends returned, machine-wide, for a Pipe
and a SimpleQueue), whoever the producers and consumers are (children, grandchildren,
pool workers, processes that come and go, a process that reaches them through the
creator's hub), and nothing but the item in hand lost when one is killed."""
from __future__ import annotations

import collections
import os
from fiberlite.wire.pickling import dumps_bytes
import random
import signal
import time

import pytest

import fiberlite
import pattern_jobs

pytestmark = pytest.mark.timeout(120)


def _check_per_producer_order(items: list, producers: int, count: int) -> None:
    assert sorted(items) == sorted((tag, i) for tag in range(producers) for i in range(count)), \
        "items lost or duplicated"
    last = collections.defaultdict(lambda: -1)
    for tag, i in items:
        assert i == last[tag] + 1, f"producer {tag}: {i} after {last[tag]}"
        last[tag] = i


@pytest.mark.parametrize("kind", ["Queue", "SimpleQueue", "JoinableQueue"])
def test_n_producers_to_m_consumers_every_item_once_in_each_producers_order(kind):
    q, out = getattr(fiberlite, kind)(), fiberlite.Queue()
    producers = [fiberlite.Process(target=pattern_jobs.put_tagged, args=(q, tag, 400)) for tag in range(4)]
    consumers = [fiberlite.Process(target=pattern_jobs.get_until_none,
                                   args=(q, out, kind == "JoinableQueue")) for _ in range(3)]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join(60)
    for _ in consumers:
        q.put(None)
    parts = [out.get(timeout=60) for _ in consumers]
    for p in consumers:
        p.join(60)
    for part in parts:  # each consumer sees each producer's items in order
        last = collections.defaultdict(lambda: -1)
        for tag, i in part:
            assert i > last[tag]
            last[tag] = i
    items = [item for part in parts for item in part]
    assert sorted(items) == sorted((tag, i) for tag in range(4) for i in range(400))
    if kind == "JoinableQueue":
        q.join()  # every item (and every None) was marked done


def test_producers_that_come_and_go_on_one_queue():
    q = fiberlite.Queue()
    for tag in range(4):  # each producer has exited before the next starts
        p = fiberlite.Process(target=pattern_jobs.put_tagged, args=(q, tag, 300))
        p.start()
        p.join(60)
        assert p.exitcode == 0
    items = [q.get(timeout=30) for _ in range(1200)]
    assert items == [(tag, i) for tag in range(4) for i in range(300)]
    assert q.empty() and q.qsize() == 0


def test_a_producer_that_exits_with_items_the_lane_had_no_room_for_hands_them_over():
    q = fiberlite.Queue()  # nobody reads until the producer has gone
    p = fiberlite.Process(target=pattern_jobs.put_large, args=(q, 300, 30_000))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.qsize() == 300
    got = [q.get(timeout=30) for _ in range(300)]
    assert [item[0] for item in got] == [i % 256 for i in range(300)]
    assert all(len(item) == 30_000 for item in got)


def test_grandchildren_produce_and_consume():
    q, out, done = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Queue()
    middles = [fiberlite.Process(target=pattern_jobs.start_grandchild,
                                 args=(pattern_jobs.put_tagged, (q, tag, 200), done)) for tag in range(2)]
    reader = fiberlite.Process(target=pattern_jobs.start_grandchild,
                               args=(pattern_jobs.get_until_none, (q, out), done))
    for p in middles + [reader]:
        p.start()
    for p in middles:
        p.join(120)
    q.put(None)
    items = out.get(timeout=60)
    reader.join(120)
    assert sorted(done.get(timeout=10) for _ in range(3)) == [0, 0, 0]
    _check_per_producer_order(items, 2, 200)


def test_pool_workers_put_into_a_queue_given_to_their_initializer():
    q = fiberlite.Queue()
    with fiberlite.Pool(3, initializer=pattern_jobs.init_queue, initargs=(q,)) as pool:
        assert sorted(pool.map(pattern_jobs.put_square, range(200), chunksize=5)) == list(range(200))
    assert sorted(q.get(timeout=30) for _ in range(200)) == [x * x for x in range(200)]


@pytest.mark.parametrize("kind", ["Pipe", "SimpleQueue", "Queue"])
def test_a_send_that_returned_is_ahead_of_every_later_send_machine_wide(kind):
    """Several writers take a ticket and send it under one lock: the reader gets the
    tickets in order (the stdlib's one pipe gives the same)."""
    got = pattern_jobs.ticketed_run(fiberlite, kind, 4, 300)
    assert got == list(range(1, 1201))


def test_large_items_travel_whole_and_writable():
    np = pytest.importorskip("numpy")
    q = fiberlite.Queue()
    a, b = fiberlite.Pipe()
    arrays = [np.arange(100_000, dtype=np.int64) + i for i in range(3)]
    for array in arrays:
        q.put(array)
        b.send(array)
    for array in arrays:
        for got in (q.get(timeout=30), a.recv()):
            assert (got == array).all()
            got += 1  # writable, as with multiprocessing


@pytest.mark.parametrize("kind", ["Queue", "SimpleQueue"])
def test_items_of_every_kind_in_one_lane_come_out_whole_and_in_order(kind):
    """Small pickles are read the short way, the others as before: one order for all."""
    np = pytest.importorskip("numpy")
    q = getattr(fiberlite, kind)()
    p = fiberlite.Process(target=pattern_jobs.put_mixed, args=(q, 3))
    p.start()
    for _ in range(3):
        for expected in pattern_jobs.mixed_items():
            got = q.get()
            if isinstance(expected, np.ndarray):
                assert got.dtype == expected.dtype and (got == expected).all()
            else:
                assert got == expected
    p.join(60)
    assert p.exitcode == 0


def test_join_returns_once_every_consumer_marked_every_item_done():
    q, done = fiberlite.JoinableQueue(), fiberlite.Value("i", 0)
    consumers = [fiberlite.Process(target=pattern_jobs.count_and_mark_done, args=(q, done)) for _ in range(3)]
    for p in consumers:
        p.start()
    for i in range(600):
        q.put(i)
    for _ in consumers:
        q.put(None)
    q.join()
    assert done.value == 600  # each consumer counts an item before it marks it done
    for p in consumers:
        p.join(60)
        assert p.exitcode == 0


def test_a_task_done_too_many_leaves_the_count_right():
    import threading
    q = fiberlite.JoinableQueue()
    q.put(1)
    q.get()
    q.task_done()
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()
    q.put(2)
    joiner = threading.Thread(target=q.join, daemon=True)
    joiner.start()
    joiner.join(0.3)
    assert joiner.is_alive(), "join() returned with an item not yet marked done"
    q.get()
    q.task_done()
    joiner.join(30)
    assert not joiner.is_alive()


def test_a_process_that_cannot_reach_the_lane_uses_the_queue_through_its_creators_hub():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    for i in range(3):
        q.put(i)
    p = fiberlite.Process(target=pattern_jobs.through_the_hub, args=(dumps_bytes(q), "queue", out))
    p.start()
    assert out.get(timeout=60) == [0, 1, 2]
    assert out.get(timeout=60) == 300  # what it put, less the three it got, plus ours
    p.join(60)
    assert p.exitcode == 0
    assert [q.get(timeout=30) for _ in range(300)] == list(range(300))
    assert q.empty()


@pytest.mark.parametrize("how", ["killed", "stalled"])
def test_a_reader_of_another_machine_gets_batches_and_what_it_did_not_take_comes_back(how):
    """A sole consumer of another machine gets items in batches through the creator's hub;
    what it holds and has not taken goes back to the queue when it is killed, or to the
    queue's head when it stops getting: every item is got once, by it or by the parent."""
    total, taken = 2000, 300
    q, out, ready = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Event()
    for i in range(total):
        q.put(i)
    p = fiberlite.Process(target=pattern_jobs.remote_batch_reader,
                          args=(dumps_bytes(q), taken, out, ready, how == "stalled"))
    p.start()
    got, held = out.get(timeout=60)
    assert got == list(range(taken))
    assert held > 0, "the reader got no batch: nothing was tested"
    assert ready.wait(60)
    if how == "killed":  # (only its death gives back what it holds)
        os.kill(p.pid, signal.SIGKILL)
    rest = [q.get(timeout=30) for _ in range(total - taken)]
    assert sorted(got + rest) == list(range(total)), "items lost or got twice"
    if how == "stalled":
        assert rest == list(range(taken, total))
    assert q.empty()
    p.kill()
    p.join(30)


def test_a_reader_that_comes_while_another_machine_s_reader_holds_a_batch_gets_the_oldest_item():
    """The parent's first get, while the queue's one reader (of another machine) holds
    items it was lent, waits for them to come back and returns the oldest of them, not
    an item from behind them."""
    total, taken = 2000, 300
    q, out, done = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Event()
    for i in range(total):
        q.put(i)
    p = fiberlite.Process(target=pattern_jobs.remote_reader_holding, args=(dumps_bytes(q), taken, out, done))
    p.start()
    got, held = out.get(timeout=60)
    assert got == list(range(taken))
    assert held > 0, "the reader got no batch: nothing was tested"
    rest = [q.get(timeout=30) for _ in range(total - taken)]
    assert rest == list(range(taken, total)), "an item got from behind a held batch"
    done.set()
    p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize("local", [0, 1])
def test_readers_of_another_machine_that_stop_at_a_marker_leave_no_item_behind(local):
    """Four consumers (``local`` of them on the queue's machine, the others as processes
    of another machine) get until None, four of which are in the queue among the items.
    As with ``multiprocessing`` (a get returns the oldest item) every item is got: a
    reader of another machine holds back no item that a reader which stops after it
    should have got first."""
    readers, runs = 4, (3000, 3000, 100, 100)  # items before each None
    for _ in range(4):
        q, out = fiberlite.Queue(), fiberlite.Queue()
        for run in runs:
            for i in range(run):
                q.put(i)
            q.put(None)
        blob = dumps_bytes(q)
        jobs = [fiberlite.Process(target=pattern_jobs.count_until_none, args=(blob, out, k >= local))
                for k in range(readers)]
        for p in jobs:
            p.start()
        got = [out.get(timeout=60) for _ in range(readers)]
        for p in jobs:
            p.join(60)
            assert p.exitcode == 0
        left = q.qsize()
        assert (sum(got), left) == (sum(runs), 0), f"{left} items left behind"


def test_a_joinable_queue_through_the_hub_counts_task_done():
    q, out = fiberlite.JoinableQueue(), fiberlite.Queue()
    for i in range(5):
        q.put(i)
    p = fiberlite.Process(target=pattern_jobs.through_the_hub, args=(dumps_bytes(q), "joinable", out))
    p.start()
    assert out.get(timeout=60) == list(range(5))
    q.join()  # the job's task_done calls reached the shared count
    p.join(60)
    assert p.exitcode == 0


def test_a_pipe_end_through_the_hub_sends_receives_polls_and_reads_eof():
    a, b = fiberlite.Pipe()
    out = fiberlite.Queue()
    p = fiberlite.Process(target=pattern_jobs.through_the_hub, args=(dumps_bytes(b), "pipe", out))
    p.start()
    b.close()
    for i in (1, 2, 3):
        a.send(i)
    assert out.get(timeout=60) is True  # polled
    assert out.get(timeout=60) == [1, 2, 3]
    assert a.recv_bytes() == b"raw"
    assert [a.recv() for _ in range(3)] == [10, 20, 30]
    a.close()
    assert out.get(timeout=60) == "EOF"
    p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize("victim", ["writer", "reader"])
def test_a_writer_or_reader_killed_at_random_leaves_whole_items_and_loses_at_most_one(victim):
    """SIGKILL at random moments, many times: the others get only whole items, each once;
    a killed reader may take the item in its hands with it, a killed writer nothing that
    it had finished sending."""
    rng = random.Random(1234)
    size = 40_000  # larger than a message inlined in the lane: the memfd path too
    for _ in range(6):
        q, out = fiberlite.Queue(), fiberlite.Queue()
        if victim == "writer":
            p = fiberlite.Process(target=pattern_jobs.put_large, args=(q, 100_000, size))
            p.start()
            got = [q.get(timeout=60)]  # it is writing
            time.sleep(rng.uniform(0.0, 0.2))  # a random moment to kill, not a synchronisation
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            while True:
                try:
                    got.append(q.get(timeout=0.5))
                except Exception:
                    break
            assert all(len(item) == size for item in got)
            assert [item[0] for item in got] == [i % 256 for i in range(len(got))]
        else:
            for i in range(400):
                q.put((0, i))
            p = fiberlite.Process(target=pattern_jobs.get_until_none, args=(q, out))
            p.start()
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
            q.put(None)
            rest = fiberlite.Process(target=pattern_jobs.get_until_none, args=(q, out))
            rest.start()
            left = out.get(timeout=60)
            rest.join(30)
            taken = {i for _, i in left}
            assert len(taken) == len(left), "an item came twice"
            assert [i for _, i in left] == sorted(taken), "order"
            # what the killed reader took is a prefix of the items (at most one of it lost)
            first = left[0][1] if left else 400
            assert taken == set(range(first, 400))
