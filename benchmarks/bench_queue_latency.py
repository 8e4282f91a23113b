"""Round-trip latency between a parent and one child job.

The parent sends a small message, the child sends it back, N times. Rows:

- ``pynng Pair0`` (the reference) and ``pynng Req0/Rep0``: raw nng sockets over TCP on
  loopback, the transport fiberlite uses, bytes in and out (no pickling);
- ``pynng Pair0, fiberlite frames``: the same socket carrying fiberlite's frames (the
  object pickled, wrapped in an envelope, decoded and unpickled on each side): two
  messages per round trip, the floor of a direct channel between the two processes;
- ``mp Queue`` / ``mp Pipe``: ``multiprocessing`` with the spawn start method
  (two queues, one each way; one duplex pipe);
- ``fiberlite Queue`` / ``fiberlite Pipe``: the same with fiberlite jobs;
- peers when installed (loky).

Run: ``python benchmarks/bench_queue_latency.py [--quick] [--json PATH]``
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, finish, optional_import, parser, progress, sized, timeit  # noqa: E402

REFERENCE = "pynng Pair0"
STOP = None
PYNNG_STOP = b"\x00"  # the echoed message is never this


# -- children (module level: the spawn start method imports them by name) ------------------
def pynng_ends(kind: str, parent: bool) -> tuple[Any, Callable[[Any], None], Callable[[], Any]]:
    """The parent's or the child's socket of a ``kind`` row with its send and receive:
    ``pair`` and ``req`` move raw bytes (the socket's own calls, nothing in between),
    ``framed`` moves fiberlite's frames."""
    import pynng
    if kind == "req":
        sock = pynng.Req0(resend_time=-1) if parent else pynng.Rep0()
    else:
        sock = pynng.Pair0()
    if kind != "framed":
        return sock, sock.send, sock.recv
    from fiberlite.wire import codec
    from fiberlite.wire.codec import Payload
    return (sock, lambda item: sock.send(codec.encode((True, Payload.pack(item)))),
            lambda: codec.decode(sock.recv())[1].unpack())


def pynng_echo(kind: str, address: str) -> None:
    sock, send, recv = pynng_ends(kind, parent=False)
    sock.dial(address, block=True)
    try:
        while True:
            message = recv()
            if message == PYNNG_STOP:  # no reply: closing right after one can cut it off
                break
            send(message)
    finally:
        sock.close()


def queue_echo(inbox: Any, outbox: Any) -> None:
    while True:
        item = inbox.get()
        if item is STOP:
            break
        outbox.put(item)


def pipe_echo(conn: Any) -> None:
    while True:
        item = conn.recv()
        if item is STOP:
            break
        conn.send(item)


# -- one measurement -------------------------------------------------------------------------
def ping_pong(send: Callable[[Any], None], recv: Callable[[], Any], message: Any,
              trips: int, repeats: int, warmup: int):
    def run() -> None:
        for _ in range(trips):
            send(message)
            recv()
    for _ in range(warmup):
        send(message)
        recv()
    return timeit(run, repeats=repeats, per=trips)


def measure_pynng(ctx: Any, kind: str, message: bytes, sizes: dict):
    sock, send, recv = pynng_ends(kind, parent=True)
    sock.listen("tcp://127.0.0.1:0")
    address = str(sock.listeners[0].local_address)
    child = ctx.Process(target=pynng_echo, args=(kind, "tcp://" + address))
    child.start()
    try:
        return ping_pong(send, recv, message, **sizes)
    finally:
        send(PYNNG_STOP)
        child.join()
        sock.close()


def measure_queues(ctx: Any, message: Any, sizes: dict):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=queue_echo, args=(inbox, outbox))
    child.start()
    try:
        return ping_pong(inbox.put, outbox.get, message, **sizes)
    finally:
        inbox.put(STOP)
        child.join()


def measure_pipe(ctx: Any, message: Any, sizes: dict):
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=pipe_echo, args=(theirs,))
    child.start()
    try:
        return ping_pong(mine.send, mine.recv, message, **sizes)
    finally:
        mine.send(STOP)
        child.join()


def main() -> None:
    p = parser("Round-trip latency between a parent and one child job.")
    p.add_argument("--payload", type=int, default=8, metavar="BYTES",
                   help="size of the message sent back and forth (default 8)")
    args = p.parse_args()
    sizes = {"trips": sized(args, 2000, 100), "repeats": sized(args, 7, 3), "warmup": sized(args, 200, 20)}
    message = b"x" * max(1, args.payload)
    report = Report("queue_latency", "round trip parent -> child -> parent, one small message",
                    payload_bytes=len(message), **sizes)
    section = report.section(
        "roundtrip", f"round trip, {len(message)}-byte message", unit="round trip", reference=REFERENCE,
        note="pynng rows send raw bytes over tcp://127.0.0.1; the others pickle a bytes object")

    spawn = multiprocessing.get_context("spawn")
    import fiberlite
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("pynng Pair0", lambda: measure_pynng(spawn, "pair", message, sizes)),
        ("pynng Req0/Rep0", lambda: measure_pynng(spawn, "req", message, sizes)),
        ("pynng Pair0, fiberlite frames", lambda: measure_pynng(spawn, "framed", message, sizes)),
        ("mp Queue (spawn)", lambda: measure_queues(spawn, message, sizes)),
        ("mp Pipe (spawn)", lambda: measure_pipe(spawn, message, sizes)),
        ("fiberlite Queue", lambda: measure_queues(fiberlite, message, sizes)),
        ("fiberlite Pipe", lambda: measure_pipe(fiberlite, message, sizes)),
    ]
    loky = optional_import("loky.backend")
    if loky is not None:
        lctx = loky.get_context("loky")
        rows += [("loky Queue", lambda: measure_queues(lctx, message, sizes)),
                 ("loky Pipe", lambda: measure_pipe(lctx, message, sizes))]
    for name, measure in rows:
        progress(f"measuring {name} ...")
        section.add(name, measure())
    finish(report, args)


if __name__ == "__main__":
    main()
