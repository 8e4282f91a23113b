"""Queues linked to the one job that gets from them, or that puts into them for their
creator (fiberlite.runtime.links): the fast path must keep every guarantee of a queue."""
from __future__ import annotations

import pytest

import fiberlite
import link_jobs
from waiting import eventually
from fiberlite.runtime.links import forwarder
from fiberlite.runtime.links import reader as pipelink
from fiberlite.runtime.hub import get_hub

# queues without a lane: their links are what is tested
pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("without_lanes")]
ENOUGH = pipelink.LINK_AFTER + 12  # uses after which a job's queue is linked


def _links(q) -> dict:
    """The creator's view of the links of ``q``: slot -> state."""
    return {slot: link.state for slot, link in get_hub().servant(q._ref.oid).links.items()}


def test_a_consuming_job_is_linked_and_gets_everything_in_order():
    q, out, stay = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.get_then_idle, args=(q, 300, out, stay))
    p.start()
    for i in range(300):
        q.put(i)
    assert out.get(timeout=60) == (list(range(300)), ["get"])
    assert _links(q) == {"get": forwarder.LINKED}
    stay.set()
    p.join()


def test_a_producing_job_is_linked_and_its_items_arrive_in_order():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.put_many, args=(q, "a", 300, out))
    p.start()
    assert [q.get(timeout=60) for _ in range(300)] == [("a", i) for i in range(300)]
    assert out.get(timeout=60) == ["put"]
    p.join()


def test_the_creator_gets_from_a_link_made_between_its_look_and_its_wait():
    """The creator found no link, then the producer's link came up before its get
    reached its hub: the get goes to the link, where the producer's item comes (and not
    only once the producer ends, handing its link back)."""
    q, out = fiberlite.Queue(), fiberlite.Queue()
    go, stay = fiberlite.Event(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.put_then_put_when_told, args=(q, ENOUGH, out, go, stay))
    p.start()
    assert [q.get(timeout=60) for _ in range(ENOUGH)] == list(range(ENOUGH))
    assert out.get(timeout=60) == ["put"]
    link_jobs.looks_before_the_link_is_made(get_hub().servant(q._ref.oid))
    go.set()
    try:
        assert q.get(timeout=20) == "last"
        assert _links(q) == {"put": forwarder.LINKED}
    finally:
        stay.set()
    p.join()


def _idle_linked_consumer(q, left: int):
    """A job that gets ENOUGH items over its link, then keeps still with ``left`` more
    put after them: ``(job, out, stay)``."""
    out, stay = fiberlite.Queue(), fiberlite.Event()
    job = fiberlite.Process(target=link_jobs.get_then_idle, args=(q, ENOUGH, out, stay))
    job.start()
    for i in range(ENOUGH + left):
        q.put(i)
    assert out.get(timeout=60) == (list(range(ENOUGH)), ["get"])
    return job, out, stay


def test_a_second_consumer_gets_exactly_what_the_linked_one_left():
    q = fiberlite.Queue()
    first, out, stay = _idle_linked_consumer(q, 30)
    second = fiberlite.Process(target=link_jobs.get_then_idle, args=(q, 30, out, stay))
    second.start()
    items, _ = out.get(timeout=60)
    assert items == list(range(ENOUGH, ENOUGH + 30))
    stay.set()
    first.join()
    second.join()


def test_the_creator_gets_what_an_idle_linked_consumer_left():
    q = fiberlite.Queue()
    p, _, stay = _idle_linked_consumer(q, 10)
    assert [q.get(timeout=60) for _ in range(10)] == list(range(ENOUGH, ENOUGH + 10))
    stay.set()
    p.join()


def test_a_consumer_that_returns_early_leaves_the_rest_in_the_queue():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.get_then_return, args=(q, ENOUGH, out))
    p.start()
    for i in range(ENOUGH + 10):
        q.put(i)
    assert out.get(timeout=60) == (list(range(ENOUGH)), ["get"])
    p.join()
    assert q.qsize() == 10
    assert [q.get(timeout=60) for _ in range(10)] == list(range(ENOUGH, ENOUGH + 10))


def test_items_of_a_linked_producer_and_of_another_one_all_arrive():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    first = fiberlite.Process(target=link_jobs.put_many, args=(q, "a", 200, out))
    first.start()
    got = [q.get(timeout=60) for _ in range(ENOUGH)]
    second = fiberlite.Process(target=link_jobs.put_many, args=(q, "b", 200))
    second.start()
    got += [q.get(timeout=60) for _ in range(400 - ENOUGH)]
    for tag in "ab":  # nothing lost or twice, each producer's items in its order
        assert [i for t, i in got if t == tag] == list(range(200))
    first.join()
    second.join()
    assert out.get(timeout=60) == ["put"]


def test_producers_through_the_hub_send_their_puts_in_batches_each_in_its_order():
    """Four producers: one may be linked, the others put through the creator's hub, their
    puts gathered into calls (far fewer than the items); nothing is lost or comes twice,
    and each producer's items come in its order."""
    q = fiberlite.Queue()
    servant = get_hub().servant(q._ref.oid)
    calls, carried = [], []
    gathered = servant.op_send_many

    def counting(request, slot, payloads):
        calls.append(slot)
        carried.append(len(payloads))
        gathered(request, slot, payloads)
    servant.op_send_many = counting
    tags = "abcd"
    producers = [fiberlite.Process(target=link_jobs.put_many, args=(q, tag, 500)) for tag in tags]
    for p in producers:
        p.start()
    got = [q.get(timeout=60) for _ in range(500 * len(tags))]
    for tag in tags:
        assert [i for t, i in got if t == tag] == list(range(500))
    for p in producers:
        p.join()
    assert set(calls) == {"put"}
    assert sum(carried) >= 500  # at least a producer's worth went through the hub, gathered
    assert len(calls) < sum(carried) / 4, (len(calls), sum(carried))


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_puts_gathered_through_the_hub_are_counted_before_an_event_set_after_them(kind, monkeypatch):
    """A job of another machine: its puts, which go through the hub in batches, are in the
    queue before what it sends after them is seen (an event's set, one-way through the
    hub too): its count and unfinished tasks as well."""
    from fiberlite import config
    monkeypatch.setattr(config, "_overrides", dict(config._overrides, share_machine=False))
    monkeypatch.setattr(config, "_resolved", None)  # (handed down to the job)
    for _ in range(5):
        q, done = getattr(fiberlite, kind)(), fiberlite.Event()
        p = fiberlite.Process(target=link_jobs.put_then_set, args=(q, 5, done))
        p.start()
        assert done.wait(60)
        assert q.qsize() == 5
        if kind == "JoinableQueue":
            assert get_hub().servant(q._ref.oid).unfinished == 5
        assert [q.get(timeout=60) for _ in range(5)] == list(range(5))
        p.join()


def test_what_a_killed_linked_producer_put_still_arrives():
    q, out, stay = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.put_then_stall, args=(q, ENOUGH, out, stay))
    p.start()
    assert out.get(timeout=60) == ["put"]
    p.kill()
    p.join()
    assert [q.get(timeout=60) for _ in range(ENOUGH)] == list(range(ENOUGH))


def test_a_linked_consumer_times_out_and_keeps_going():
    q, out = fiberlite.Queue(), fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.get_with_timeouts, args=(q, ENOUGH, out))
    p.start()
    for i in range(ENOUGH):
        q.put(i)
    assert out.get(timeout=60) == (list(range(ENOUGH)), ["get"], ["empty", "empty"])
    q.put("after")
    assert out.get(timeout=60) == "after"
    p.join()


def test_joinable_queue_counts_what_its_link_carries():
    q, leave = fiberlite.JoinableQueue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.work_and_mark_done, args=(q, 200, leave))
    p.start()
    for i in range(200):
        q.put(i)
    q.join()  # returns once the job marked every item done, linked or not
    assert _links(q) == {"get": forwarder.LINKED}  # (a job that leaves takes its link down)
    leave.set()
    p.join()


def test_a_bounded_queue_is_never_linked():
    q, out = fiberlite.Queue(maxsize=5), fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.get_then_return, args=(q, 100, out))
    p.start()
    for i in range(100):
        q.put(i)
    assert out.get(timeout=60) == (list(range(100)), [])
    assert _links(q) == {}
    p.join()


def test_a_consumer_is_linked_again_once_the_competition_is_gone(monkeypatch):
    from fiberlite.runtime.links import servant as linkhost
    monkeypatch.setattr(linkhost, "RELINK_QUIET", 0.2)  # (in this process, the queue's owner)
    q, out = fiberlite.Queue(), fiberlite.Queue()
    p = fiberlite.Process(target=link_jobs.report_links_while_getting, args=(q, out))
    p.start()
    reports: list = []

    def feed(items) -> None:
        for i in items:
            q.put(i)
        reports.extend(out.get(timeout=60) for _ in items)

    feed(range(ENOUGH))
    assert reports[-1][1], "the only consumer is linked"
    with pytest.raises(fiberlite.queues.Empty):  # this process gets too: the link ends
        q.get(timeout=0.1)
    feed(range(ENOUGH, ENOUGH + 600))
    q.put(None)
    p.join(30)
    assert [item for item, _ in reports] == list(range(ENOUGH + 600))
    after = [is_linked for _, is_linked in reports[ENOUGH:]]
    assert not after[0], "the link ended when this process got from the queue"
    assert after[-1], "linked again once nobody else got for a while"


def test_the_creators_gets_from_a_linked_producer_sleep_at_once_and_a_pipes_reads_look_awake():
    """A queue's get reads in one call what arrived while it slept; looking awake would
    take the items one by one as they come (and the CPU from the producer)."""
    q, out, stay = fiberlite.Queue(), fiberlite.Queue(), fiberlite.Event()
    p = fiberlite.Process(target=link_jobs.put_then_stall, args=(q, ENOUGH, out, stay))
    p.start()
    assert out.get(timeout=60) == ["put"]
    put_link = get_hub().servant(q._ref.oid).links["put"]
    # the job counts its link once it read this process's READY frame; this process's
    # link thread records the connection just after sending it (a loaded machine may
    # run the job's puts and report first)
    eventually(lambda: put_link.link is not None, what="the producer's link")
    assert put_link.link.awake is False
    stay.set()
    assert [q.get(timeout=60) for _ in range(ENOUGH)] == list(range(ENOUGH))
    p.join()
    assert get_hub().servant(q._ref.oid).look_awake is False
    a, _ = fiberlite.Pipe()
    assert get_hub().servant(a._ref.oid).look_awake is True
