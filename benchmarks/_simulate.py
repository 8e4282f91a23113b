"""A pool's master driven by simulated workers, for sizes no machine here can start.

The simulated workers are hosted (as a pool's workers are, :mod:`fiberlite.pool.job.host`):
each host posts its workers' requests to the master's real ``HostRelay`` and
``Dispatcher`` and polls for the answers, in this process, without sockets. Each worker
asks for one chunk at a time and returns its result with its next request, at once.
What is measured is the master's CPU time per task in the relay and the dispatcher,
which a real master pays on top of its sockets.
"""
from __future__ import annotations

import time

from fiberlite.pool.chunks import pack
from fiberlite.pool.job.upstream import dump_message, load_message
from fiberlite.pool.master.dispatch import Dispatcher
from fiberlite.pool.master.relay import HostRelay
from fiberlite.wire.codec import Payload

WORKERS_PER_HOST = 100


class _Request:
    """Stands for a host's connection to the relay: keeps the answer."""

    __slots__ = ("peer", "value")

    def __init__(self, peer: int) -> None:
        self.peer, self.value = peer, None

    def reply(self, value=None) -> None:
        self.value = value

    def fail(self, exc: BaseException) -> None:
        raise exc


def _square(x: int) -> int:
    return x * x


def _hosts(dispatcher: Dispatcher, relay: HostRelay, workers: int) -> dict[int, list[int]]:
    hosts: dict[int, list[int]] = {}
    for first in range(0, workers, WORKERS_PER_HOST):
        wids = list(range(first + 1, min(first + WORKERS_PER_HOST, workers) + 1))
        for wid in wids:
            dispatcher.add_worker(wid)
        relay.add_host(len(hosts) + 1, wids)
        hosts[len(hosts) + 1] = wids
    return hosts


def master_cpu_per_task(workers: int, tasks: int) -> float:
    """CPU seconds of the master per task, with ``workers`` simulated workers."""
    delivered = [0]

    def deliver(results) -> None:
        delivered[0] += sum(len(entries) for _, entries in results)

    dispatcher = Dispatcher(deliver)
    relay = HostRelay(dispatcher, lambda hid: None, lambda: None)
    hosts = _hosts(dispatcher, relay, workers)
    group = dispatcher.new_group("map", Payload.pack(("map", _square)), "square", sink=None)
    chunks = [dispatcher.make_chunk(group, i, 1, pack([i])) for i in range(tasks)]
    result = pack([0])
    started = time.process_time()
    dispatcher.submit(group, chunks, seal=True, new=True)
    inbox = {hid: [(wid, dump_message((1, "next", (wid, [], None, 1, False)))) for wid in wids]
             for hid, wids in hosts.items()}
    while delivered[0] < tasks:
        for hid in hosts:
            answers = []
            if inbox[hid]:
                post = _Request(-hid)
                relay.op_post(post, hid, inbox[hid])
                answers = post.value or []
            if not answers:
                poll = _Request(-hid)
                relay.op_poll(poll, hid)
                answers = poll.value or []
            inbox[hid] = []
            for _, wid, frame in answers:  # each answer as the host passes it on
                _, _, value = load_message(frame)
                if value:
                    inbox[hid].append((wid, dump_message((1, "next", (
                        wid, [(cid, None) for cid, _, _ in value[0]], result, 1, False)))))
    return (time.process_time() - started) / tasks
