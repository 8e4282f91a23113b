"""``Queue``, ``SimpleQueue`` and ``JoinableQueue`` shared by every job of a run.

The queue's state lives in the hub of the process that created it; other jobs reach
it over their authenticated connection to that hub. Items are pickled by the putter
and unpickled only by the getter. A put to an unbounded queue does not wait for the
hub's answer (like ``multiprocessing``'s feeder thread); a job waits for all its puts
to land before it exits, and ``join_thread()`` waits for them too.

An unbounded queue that one job alone gets from, or (but for a JoinableQueue) that
one job alone puts into while its creator gets, is linked to that job
(:mod:`fiberlite.runtime.links`): items then travel straight between the two processes.
Puts and gets take the route a ``Pipe`` takes (:mod:`fiberlite.runtime.links.route`).
"""
from __future__ import annotations

import queue
import weakref
from typing import Any, Callable

from . import observe
from .queue_lane import QueueLane
from .queue_lane_ops import LaneOps
from .runtime import handles
from .runtime.hub import LOCAL_PEER, ObjectRef, get_hub
from .runtime.links import route
from .runtime.links.channel import Channel
from .runtime.lanes import shared as lanes
from .runtime.lanes import lending
from .runtime.lanes.feeder import batches
from .runtime.links.frames import EOF
from .runtime.links.servant import LinkingServant
from .units import check_timeout
from .wire.codec import Payload

__all__ = ["Queue", "SimpleQueue", "JoinableQueue"]

Empty = queue.Empty
Full = queue.Full


GET, PUT = "get", "put"  # link slots: a job that only gets, a job that only puts


class _Within:
    """The request of one put among those a gathered call carries: answered by the call."""

    __slots__ = ("peer", "error")

    def __init__(self, peer: int) -> None:
        self.peer, self.error = peer, None

    def reply(self, value: Any = None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc


class QueueServant(LaneOps, LinkingServant):
    """The state of one queue, in its creator's hub: its channel, or (``lane``) the
    queue's lane, on which it acts for the processes that cannot reach it."""

    look_awake = False  # a get reads what arrived while it slept in one call

    def __init__(self, maxsize: int, joinable: bool = False, lane: QueueLane | None = None) -> None:
        super().__init__()
        if lane is not None:
            self._use_lane(lane)
        self.channel = Channel(maxsize)
        self.done = 0
        self.joiners: list = []
        if maxsize:  # a put must wait for room: it cannot go ahead over a link
            self.never_link.update((GET, PUT))
        if joinable:  # join() must count what is on its way over a link (items taken
            self.never_link.add(PUT)  # from a PUT link are not counted in `enqueued`)

    @property
    def unfinished(self) -> int:
        return self.channel.enqueued - self.done

    # -- links: GET forwards items to a job, PUT brings a job's items to this process --------
    def _forward_channel(self, slot: str) -> Channel | None:
        return self.channel if slot == GET else None

    def _return_channel(self, slot: str) -> Channel | None:
        return self.channel if slot == PUT else None

    def _may_link(self, slot: str, peer: int) -> bool:
        waiting = [w for w in self.channel.getters if not w.done]
        if slot == GET:  # the job is the only one getting
            return PUT not in self.links and not waiting and not self.channel.held and not self.channel.lent
        # this process is the only one getting
        return GET not in self.links and all(w.request.peer == LOCAL_PEER for w in waiting)

    # -- the route's operations (fiberlite.runtime.links.route) ---------------------------------
    def op_send(self, request, slot: str, payload: Payload) -> None:
        self.op_put(request, payload)

    def op_send_many(self, request, slot: str, payloads: list) -> None:
        """A job's puts gathered into one call (an unbounded queue's), in their order."""
        each = _Within(request.peer)
        for payload in payloads:
            self.op_put(each, payload)
        if each.error is not None:
            request.fail(each.error)
        else:
            request.reply()

    def op_receive(self, request, slot: str, block: bool = True, timeout: float | None = None) -> None:
        self.op_get(request, block, timeout)

    def send_local(self, slot: str, payload: Payload) -> bool:
        """A put of this process, straight over the link of the job that alone gets."""
        return self.forward_local(GET, payload)

    def receive_local(self, slot: str, timeout: float | None = None, peek: bool = False) -> Any:
        """A get of this process, straight from the link of the job that alone puts."""
        return self.receive_returned(PUT, timeout, peek)

    def op_put(self, request, payload: Payload, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            self._used(PUT, request.peer)
            # another producer than the job linked to PUT (it puts over its link): unlink
            actions = self._unlink(PUT) if PUT in self.links else []
            sent = self._forward(GET, payload)
            if sent:
                actions.append(request.reply)
            else:
                if sent is False:  # the job leaves them unread until the link is full
                    actions += self._unlink(GET)
                actions += self.channel.put(request, payload, block, timeout, self.schedule_expiry)
        self.run_actions(actions)

    def op_get(self, request, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            self._used(GET, request.peer)
            actions = self._unlink(GET)  # another getter: the linked job hands back first
            if request.peer != LOCAL_PEER:
                actions += self._unlink(PUT)
            actions += self._read_returned(request, PUT, block, timeout)
        self.run_actions(actions)

    def op_qsize(self, request) -> None:
        with self._lock:  # counted here: what a link holds comes back first
            actions = self._unlink(GET) + self._unlink(PUT)
        request.reply(len(self.channel.items))
        self.run_actions(actions)

    def op_task_done(self, request) -> None:
        with self._lock:
            if self.unfinished <= 0:
                request.fail(ValueError("task_done() called too many times"))
                return
            self.done += 1
            joiners = self.joiners if self.unfinished == 0 else []
            if joiners:
                self.joiners = []
        request.reply()
        for joiner in joiners:
            joiner.reply()

    def op_join(self, request) -> None:
        with self._lock:
            if self.unfinished:
                self.joiners.append(request)
                return
        request.reply()

    def peer_lost(self, peer: int) -> None:
        if self.lane is not None:
            self._lane_peer_lost(peer)
            return
        for slot, link in self.links_of(peer):
            self._link_lost(slot, link)
        with self._lock:
            actions = self.channel.drop_peer(peer)
            self.joiners = [r for r in self.joiners if r.peer != peer]
        self.run_actions(actions)


class QueueView:
    """What a queue shows the run's page, read afresh at each look, in the process that
    created it (:meth:`Queue.view`)."""

    def __init__(self, queue: Any, servant: QueueServant) -> None:
        self.name = f"{type(queue).__name__} {queue._ref.oid}"
        self._channel = servant.channel
        self._servant = servant
        self._state = servant.lane.state if servant.lane is not None else None

    # (a queue with a lane: its counts; who waits on a lane is the kernel's to know)
    size = property(lambda self: self._state.qsize() if self._state else len(self._channel.items),
                    doc="items in the queue")
    maxsize = property(lambda self: self._channel.maxsize, doc="0: unbounded")
    readers = property(lambda self: 0 if self._state else len(self._channel.getters),
                       doc="gets waiting for an item")
    writers = property(lambda self: 0 if self._state else len(self._channel.putters),
                       doc="puts waiting for room")
    total = property(lambda self: self._state.total() if self._state else self._channel.enqueued,
                     doc="items ever put")

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` after each change of the queue's state, on the thread of the
        change (it must return at once): of this process's puts and gets, for a queue with
        a lane (what others do there is seen at the next look)."""
        self._servant.watcher = changed
        if self._servant.lane is not None:
            self._servant.lane.watcher = changed


def _view(queue: Any) -> QueueView | None:
    """A read-only view of the queue for the run's page; None in another process."""
    servant = queue._servant
    return None if servant is None else QueueView(queue, servant)


class Queue:
    """A process-shared FIFO queue (``multiprocessing.Queue``)."""

    _joinable = False
    _servant: QueueServant | None = None  # when it lives in this process
    _used = False  # put into from this process: close() then closes it for empty() too

    _lane: QueueLane | None = None  # the queue's lane, when this process can reach it
    _place: Any = None  # (where the lane is, the queue's state) when it has one

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if maxsize < 0:
            maxsize = 0
        self._maxsize = maxsize
        self._servant, self._lane = _new_servant(maxsize, self._joinable)
        if self._lane is not None:
            self._place = (self._lane.place, self._lane.state)
        self._ref = handles.register(self, self._servant)
        self._closed = False
        observe.notice("queue", self)

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, self._maxsize, self._place))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Put ``obj``; when the queue is full wait up to ``timeout`` (``queue.Full`` after)."""
        self._check_open()
        if timeout is not None:
            check_timeout(timeout)  # (refused whether it would wait or not, as by the stdlib)
        self._used = True
        if self._lane is not None:
            self._lane.put(Payload.pack(obj), block, timeout)
        elif self._place is not None:  # an unbounded queue's put does not wait for the answer
            if self._maxsize:
                _raised(self._ref.call("lane_put", Payload.pack(obj), block, timeout))
            else:
                batches(self._ref, "lane_put_many").add(Payload.pack(obj))
        elif self._maxsize:
            self._ref.call("put", Payload.pack(obj), block, timeout)
        else:  # an unbounded queue never makes a put wait (through a hub: gathered)
            route.send(self._ref, PUT, self._servant, Payload.pack(obj), gathered=True)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return an item; wait up to ``timeout`` (``queue.Empty`` after)."""
        self._check_open()
        if timeout is not None:
            check_timeout(timeout)
        if self._lane is not None:
            return self._lane.get_object(block, timeout)
        if self._place is not None:
            return lending.reader(self._ref).get(block, timeout).unpack()
        return route.receive(self._ref, GET, self._servant, block, timeout).unpack()

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        if self._lane is not None:
            return self._lane.state.qsize()
        return self._ref.call("lane_qsize" if self._place is not None else "qsize")

    def empty(self) -> bool:
        if self._closed and self._used:  # as multiprocessing's, whose close() takes effect
            raise OSError("handle is closed")  # once a put started its feeder thread
        if self._lane is not None:
            return self._lane.empty()
        if self._place is not None:
            return self._ref.call("lane_empty")
        return self.qsize() == 0

    def full(self) -> bool:
        return 0 < self._maxsize <= self.qsize()

    def close(self) -> None:
        """No more data will be put on or taken from this queue by this process."""
        self._closed = True

    def join_thread(self) -> None:
        """Wait until everything put by this process is in the queue."""
        assert self._closed, f"Queue {self!r} not closed"
        if self._lane is not None:
            self._lane.flush()
        elif self._place is not None:
            batches(self._ref, "lane_put_many").flush()
        from .runtime.dialed import flush
        flush()

    def cancel_join_thread(self) -> None:
        """Accepted for compatibility: puts are never left behind, so there is nothing to cancel."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._ref.oid}@{self._ref.address}>"


class JoinableQueue(Queue):
    """A Queue with ``task_done()`` and ``join()``."""

    _joinable = True

    def task_done(self) -> None:
        """Mark one item taken with get() as processed."""
        if self._lane is not None:
            self._lane.state.task_done()
        else:
            self._ref.call("lane_task_done" if self._place is not None else "task_done")

    def join(self) -> None:
        """Wait until every item put has been marked done."""
        if self._lane is not None:
            self._lane.state.join()
        else:
            self._ref.call("lane_join" if self._place is not None else "join")


class SimpleQueue:
    """An unbounded queue with ``get``, ``put``, ``empty`` and ``close``."""

    _servant: QueueServant | None = None

    _lane: QueueLane | None = None
    _place: Any = None

    def __init__(self, *, ctx: Any = None) -> None:
        self._servant, self._lane = _new_servant(0, False)
        if self._lane is not None:
            self._place = (self._lane.place, self._lane.state)
        self._ref = handles.register(self, self._servant)
        self._closed = False
        observe.notice("queue", self)

    def __reduce__(self):
        handles.exported(self._ref)
        return (_rebuild, (type(self), self._ref, 0, self._place))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"SimpleQueue {self!r} is closed")

    def put(self, obj: Any) -> None:
        self._check_open()
        if self._lane is not None:  # as multiprocessing's: the put is in the queue when it returns
            self._lane.state.reserve(True, None)
            self._lane.lane.send(Payload.pack(obj))
        elif self._place is not None:
            batches(self._ref, "lane_put_many").add(Payload.pack(obj))
        else:
            route.send(self._ref, PUT, self._servant, Payload.pack(obj))

    def get(self) -> Any:
        self._check_open()
        if self._lane is not None:
            return self._lane.get_object()
        if self._place is not None:
            return lending.reader(self._ref).get().unpack()
        return route.receive(self._ref, GET, self._servant).unpack()

    def empty(self) -> bool:
        if self._closed:
            raise OSError("handle is closed")
        if self._lane is not None:
            return self._lane.empty()
        if self._place is not None:
            return self._ref.call("lane_empty")
        return self._ref.call("qsize") == 0

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"<SimpleQueue {self._ref.oid}@{self._ref.address}>"


def _new_servant(maxsize: int, joinable: bool) -> tuple[QueueServant, QueueLane | None]:
    """A new queue's servant, and its lane when this machine's processes share one."""
    if not lanes.enabled():
        return QueueServant(maxsize, joinable), None
    lane, forget = QueueLane.new(maxsize, joinable)
    servant = QueueServant(maxsize, joinable, lane)
    weakref.finalize(servant, forget)
    return servant, lane


def _raised(answer: Any) -> Any:
    """A lane call's answer from the hub: ``queue.Empty``/``queue.Full`` are raised."""
    if isinstance(answer, (queue.Empty, queue.Full)):
        raise type(answer)
    return answer


def _rebuild(cls: type, ref: ObjectRef, maxsize: int, place: Any = None) -> Any:
    obj = cls.__new__(cls)
    obj._ref = ref
    obj._maxsize = maxsize
    obj._closed = False
    obj._place = place
    if ref.is_local:  # back in the process that serves it
        obj._servant = get_hub().servant(ref.oid)
        obj._lane = obj._servant.lane
    elif place is not None:
        lane = QueueLane.at(*place)
        if lane.lane is not None:
            lane.feeder.ref = ref
            lane.take_front = lambda most: ref.call("lane_front", most)
            obj._lane = lane
    handles.loaded(obj, ref)
    return obj



observe.provides_view(Queue, _view)
observe.provides_view(SimpleQueue, _view)
