"""Targets for the pipe-link tests: jobs that read a pipe end long enough to be linked."""
from __future__ import annotations

from fiberlite.runtime.links import reader as pipelink
from fiberlite.connection import wait

LINKING_READS = pipelink.LINK_AFTER + 2  # reads after which a job's end is linked


def is_linked(conn) -> bool:
    """Whether this process reads ``conn``'s end over a link."""
    return pipelink.reader_of(conn._ref, conn._end) is not None


def echo_then_report(conn, rounds: int) -> None:
    """Echo ``rounds`` messages, then send whether the end got linked."""
    for _ in range(rounds):
        conn.send(conn.recv())
    conn.send(("linked", is_linked(conn)))


def echo_then_report_transport(conn, rounds: int) -> None:
    """Echo ``rounds`` messages, then send the scheme of the link's address (None: no link)."""
    for _ in range(rounds):
        conn.send(conn.recv())
    reader = pipelink.reader_of(conn._ref, conn._end)
    conn.send(None if reader is None else reader.link.address.split("://")[0])


def echo_then_stay(conn, rounds: int, stay) -> None:
    """Echo ``rounds`` messages, then keep still (linked) until ``stay`` is set."""
    for _ in range(rounds):
        conn.send(conn.recv())
    stay.wait()


def read_then_idle(conn, count: int, out, stay) -> None:
    """Read ``count`` messages, report them and whether the end was linked, then keep
    the end (unread messages included) until ``stay`` is set."""
    items = [conn.recv() for _ in range(count)]
    out.put((items, is_linked(conn)))
    stay.wait()


def read_then_close(conn, count: int, out) -> None:
    items = [conn.recv() for _ in range(count)]
    linked = is_linked(conn)
    conn.close()
    out.put((items, linked))


def link_then_wait(conn, out) -> None:
    """Get linked, then wait on the end with ``wait()`` and ``poll()``: report each step."""
    for _ in range(LINKING_READS):
        conn.send(conn.recv())
    out.put(("linked", is_linked(conn), conn.poll(0)))
    ready = wait([conn], timeout=30)
    out.put(("woken", ready == [conn], conn.recv(), is_linked(conn)))
    out.put(("poll", conn.poll(30), conn.recv()))


def link_then_send_and_stall(conn, extra: int, out, stay) -> None:
    """Get linked, send ``extra`` more messages, say so and keep still until killed."""
    for _ in range(LINKING_READS):
        conn.send(conn.recv())
    for i in range(extra):
        conn.send(("extra", i))
    out.put(is_linked(conn))
    stay.wait()


def link_then_read_to_eof(conn, out) -> None:
    for _ in range(LINKING_READS):
        conn.send(conn.recv())
    linked = is_linked(conn)
    rest = []
    try:
        while True:
            rest.append(conn.recv())
    except EOFError:
        out.put((linked, rest))


def link_then_stall_then_read(conn, go, out) -> None:
    """Get linked, tell the parent, wait for ``go``, then read until None."""
    for _ in range(LINKING_READS):
        conn.send(conn.recv())
    out.put(is_linked(conn))
    go.wait()
    items = list(iter(conn.recv, None))
    out.put((items, is_linked(conn)))


def echo_many_kinds(conn) -> None:
    """Echo ``(kind, item)`` messages, and bytes as bytes, until ``("stop", _)``; then say
    whether the end was linked."""
    while True:
        kind, item = conn.recv()
        if kind == "stop":
            break
        if kind == "bytes":
            conn.send_bytes(conn.recv_bytes())
        else:
            conn.send((kind, item))
    conn.send(is_linked(conn))


# -- queues ----------------------------------------------------------------------------------
def queue_link_slots(q) -> list:
    """The slots of ``q`` this process has links for ("get", "put")."""
    return sorted(key[2] for key in pipelink._readers if key[:2] == (q._ref.address, q._ref.oid))


def get_then_idle(q, count: int, out, stay) -> None:
    """Get ``count`` items, report them and this job's links of ``q``, then keep still
    (with what its link holds) until ``stay`` is set."""
    items = [q.get(timeout=60) for _ in range(count)]
    out.put((items, queue_link_slots(q)))
    stay.wait()


def get_then_return(q, count: int, out) -> None:
    items = [q.get(timeout=60) for _ in range(count)]
    out.put((items, queue_link_slots(q)))


def put_many(q, tag, count: int, out=None) -> None:
    for i in range(count):
        q.put((tag, i))
    if out is not None:
        out.put(queue_link_slots(q))


def put_then_put_when_told(q, count: int, out, go, stay) -> None:
    """Put ``count`` items (enough to be linked), report this job's links of ``q``, put
    ``"last"`` once ``go`` is set, then keep still (linked) until ``stay`` is set."""
    for i in range(count):
        q.put(i)
    out.put(queue_link_slots(q))
    go.wait()
    q.put("last")
    stay.wait()


def put_then_stall(q, count: int, out, stay) -> None:
    for i in range(count):
        q.put(i)
    out.put(queue_link_slots(q))
    stay.wait()


def get_with_timeouts(q, count: int, out) -> None:
    """Get ``count`` items, then try empty gets with and without a timeout."""
    import queue
    items = [q.get(timeout=60) for _ in range(count)]
    results = []
    for attempt in (lambda: q.get(timeout=0.2), q.get_nowait):
        try:
            results.append(attempt())
        except queue.Empty:
            results.append("empty")
    out.put((items, queue_link_slots(q), results))
    out.put(q.get(timeout=60))


def work_and_mark_done(q, count: int, leave) -> None:
    """Get and mark done ``count`` items, then stay (and keep the queue's link) until
    ``leave`` is set."""
    for _ in range(count):
        q.get(timeout=60)
        q.task_done()
    leave.wait(60)


# -- readers killed mid-stream -------------------------------------------------------------
def relay_queue(q, results, tag, pause: float, joinable: bool = False) -> None:
    """Move items from ``q`` to ``results`` as ``(tag, item)`` until None, pausing a random
    moment after each."""
    _relay(q.get, results, tag, pause, q.task_done if joinable else None)


def relay_pipe(conn, results, tag, pause: float) -> None:
    """Move messages from the pipe end ``conn`` to ``results`` as ``(tag, item)``."""
    _relay(conn.recv, results, tag, pause)


def _relay(read, results, tag, pause: float, mark_done=None) -> None:
    import random
    import time
    while True:
        item = read()
        if item is None:
            return
        results.put((tag, item))
        if mark_done is not None:
            mark_done()
        time.sleep(random.uniform(0, pause))


def report_links_while_getting(q, out) -> None:
    """Get items until None, reporting each with whether this job then had a link."""
    for item in iter(q.get, None):
        out.put((item, queue_link_slots(q) == ["get"]))


READY = "ready"


def relay_noting(source, results, tag, pause: float, note_path: str, joinable: bool = False) -> None:
    """Put ``(READY, tag)`` into ``results``, then move items from the queue or pipe end
    ``source`` to ``results`` as ``(tag, item)`` until None, pausing a random moment after
    each; each item got through the hub is first written down in the file ``note_path``
    (it outlives a SIGKILL), before its receipt is sent: what this job may have got and
    not passed on."""
    import os
    from fiberlite.runtime.links import route
    note = os.open(note_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    through_hub = route.got_through_hub

    def noting(ref, slot, reply):
        if type(reply) is tuple:
            os.write(note, b"%r\n" % (reply[1].unpack(),))
        return through_hub(ref, slot, reply)
    route.got_through_hub = noting
    results.put((READY, tag))
    if hasattr(source, "get"):
        _relay(source.get, results, tag, pause, source.task_done if joinable else None)
    else:
        _relay(source.recv, results, tag, pause)


def get_two_with_late_receipts(q, out) -> None:
    """Get two items, receipts going on their own only after a minute, and report them."""
    from fiberlite.runtime import hub
    hub.RECEIPT_SECONDS = 60.0
    first = q.get()
    out.put((first, q.get()))


def pass_one_then_hold_one(q, out) -> None:
    """Get an item and put it into ``out`` (the receipt goes with that put), then get
    another and keep it, sending nothing more, until killed."""
    import time
    out.put(q.get())
    q.get()
    time.sleep(120)


def looks_before_the_link_is_made(servant) -> None:
    """(in the owner) The next read of this process finds no link, as one that looked
    just before a job's link was made and reached the hub just after: it must read the
    link then, not wait for the channel (what the job sends comes over the link)."""
    looked = servant.receive_local

    def no_link_yet(*args, **kwargs):
        servant.receive_local = looked
        return None
    servant.receive_local = no_link_yet


def put_then_set(q, count: int, done) -> None:
    """Put ``count`` items, then set the event ``done`` (the parent looks at the queue then)."""
    for i in range(count):
        q.put(i)
    done.set()
