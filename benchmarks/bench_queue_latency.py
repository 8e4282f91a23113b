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
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, Stats, finish, interleave, optional_import, parser, progress, sized  # noqa: E402

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


# -- the rows: each sets up its pair of processes once and yields one ping-pong ----------
class Echo:
    """A parent and its echoing child, set up once and kept for every round: ``trips``
    round trips timed on the wall clock and in CPU time (parent and child together)."""

    def __init__(self, send: Callable[[Any], None], recv: Callable[[], Any], child: Any,
                 stop: Callable[[], None], message: Any) -> None:
        self.send, self.recv, self.child, self._stop, self.message = send, recv, child, stop, message
        self._child_cpu = _cpu_clock(child.pid)

    def warm(self, trips: int) -> None:
        send, recv, message = self.send, self.recv, self.message
        for _ in range(trips):
            send(message)
            recv()

    def measure(self, trips: int) -> tuple[float, float | None]:
        """Seconds per round trip, and CPU seconds per round trip (None: not measurable)."""
        send, recv, message = self.send, self.recv, self.message
        cpu0, child0 = time.process_time(), self._child_cpu()
        start = time.perf_counter()
        for _ in range(trips):
            send(message)
            recv()
        wall = time.perf_counter() - start
        cpu1, child1 = time.process_time(), self._child_cpu()
        if child0 is None or child1 is None:
            return wall / trips, None
        return wall / trips, (cpu1 - cpu0 + child1 - child0) / trips

    def stop(self) -> None:
        self._stop()


def _cpu_clock(pid: int | None) -> Callable[[], float | None]:
    """CPU seconds used so far by the process ``pid`` (None when it is not a process of
    this machine, e.g. a container elsewhere)."""
    import psutil
    try:
        process = psutil.Process(pid) if pid else None
    except (psutil.Error, ValueError):
        process = None

    def read() -> float | None:
        if process is None:
            return None
        try:
            times = process.cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system
    return read


def pynng_row(ctx: Any, kind: str, message: bytes, transport: str = "tcp") -> Echo:
    """A raw pynng row over ``tcp`` (loopback) or a Linux ``abstract`` socket."""
    sock, send, recv = pynng_ends(kind, parent=True)
    if transport == "abstract":
        address = f"abstract://fiberlite-bench-{os.getpid()}-{id(sock)}"
        sock.listen(address)
    else:
        sock.listen("tcp://127.0.0.1:0")
        address = "tcp://" + str(sock.listeners[0].local_address)
    child = ctx.Process(target=pynng_echo, args=(kind, address))
    child.start()

    def stop() -> None:
        send(PYNNG_STOP)
        child.join()
        sock.close()
    return Echo(send, recv, child, stop, message)


def queue_row(ctx: Any, message: Any) -> Echo:
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=queue_echo, args=(inbox, outbox))
    child.start()

    def stop() -> None:
        inbox.put(STOP)
        child.join()
    return Echo(inbox.put, outbox.get, child, stop, message)


def pipe_row(ctx: Any, message: Any) -> Echo:
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=pipe_echo, args=(theirs,))
    child.start()

    def stop() -> None:
        mine.send(STOP)
        child.join()
    return Echo(mine.send, mine.recv, child, stop, message)


def measure_rows(rows: dict[str, Callable[[], Echo]], trips: int, rounds: int, warmup: int
                 ) -> dict[str, tuple[list[float], list[float]]]:
    """Every row's samples (wall, CPU): each row set up and warmed up with ``warmup``
    round trips, then ``rounds`` interleaved rounds of ``trips`` round trips."""
    echoes: dict[str, Echo] = {}
    try:
        for name, make in rows.items():
            progress(f"starting {name} ...")
            echoes[name] = make()
            echoes[name].warm(warmup)
        measured = interleave({name: (lambda e=echo: e.measure(trips)) for name, echo in echoes.items()},
                              rounds, label="round trips")
    finally:
        for echo in echoes.values():
            echo.stop()
    return {name: ([wall for wall, _ in pairs], [cpu for _, cpu in pairs if cpu is not None])
            for name, pairs in measured.items()}


def main() -> None:
    p = parser("Round-trip latency between a parent and one child job.")
    p.add_argument("--payload", type=int, default=8, metavar="BYTES",
                   help="size of the message sent back and forth (default 8)")
    args = p.parse_args()
    trips, rounds, warmup = sized(args, 2000, 100), sized(args, 15, 2), sized(args, 300, 20)
    message = b"x" * max(1, args.payload)
    report = Report("queue_latency", "round trip parent -> child -> parent, one small message",
                    payload_bytes=len(message), trips=trips, rounds=rounds, warmup=warmup)
    note = ("pynng rows send raw bytes over tcp://127.0.0.1; the others pickle a bytes object. "
            f"Rows interleaved: {rounds} rounds of {trips} round trips each")
    wall = report.section("roundtrip", f"round trip, {len(message)}-byte message", unit="round trip",
                          reference=REFERENCE, note=note)
    cpu = report.section("cpu", f"CPU time per round trip, parent and child together, "
                         f"{len(message)}-byte message", unit="round trip", reference=REFERENCE,
                         note="user + system time of both processes, all their threads")

    spawn = multiprocessing.get_context("spawn")
    import fiberlite
    rows: dict[str, Callable[[], Echo]] = {
        "pynng Pair0": lambda: pynng_row(spawn, "pair", message),
        "pynng Req0/Rep0": lambda: pynng_row(spawn, "req", message),
        "pynng Pair0, fiberlite frames": lambda: pynng_row(spawn, "framed", message),
    }
    if sys.platform.startswith("linux"):  # the transport of fiberlite's links between local jobs
        rows["pynng Pair0, abstract socket"] = lambda: pynng_row(spawn, "pair", message, "abstract")
    rows |= {
        "mp Queue (spawn)": lambda: queue_row(spawn, message),
        "mp Pipe (spawn)": lambda: pipe_row(spawn, message),
        "fiberlite Queue": lambda: queue_row(fiberlite, message),
        "fiberlite Pipe": lambda: pipe_row(fiberlite, message),
    }
    loky = optional_import("loky.backend")
    if loky is not None:
        lctx = loky.get_context("loky")
        rows["loky Queue"] = lambda: queue_row(lctx, message)
        rows["loky Pipe"] = lambda: pipe_row(lctx, message)
    samples = measure_rows(rows, trips, rounds, warmup)
    for name, (walls, cpus) in samples.items():
        wall.add(name, Stats(walls))
        if cpus:
            cpu.add(name, Stats(cpus))
        else:
            cpu.skip(name, "its child's CPU time cannot be read from here")
    finish(report, args)


if __name__ == "__main__":
    main()
