"""Targets for the pipe-link tests: jobs that read a pipe end long enough to be linked."""
from __future__ import annotations

from fiberlite import pipelink
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
