"""All-reduce bandwidth of a fiberlite Ring, against the raw link and torch's Gloo.

For float32 arrays from 4 KiB to 64 MiB on 2 and 4 ranks (local jobs on this
machine), each rank times back-to-back ``ring.all_reduce(x)`` calls; the time of an
all-reduce is the slowest rank's. Reported, as in nccl-tests:

- algbw = bytes / time
- busbw = algbw * 2(N-1)/N   (what each link carries; comparable across N)

References measured in the same run:

- ``pynng link``: one-way bandwidth of a raw pynng Pair0 socket between two processes
  over tcp://127.0.0.1, 1 MiB messages received with ``recv_msg`` (the transport
  fiberlite uses, no pickling, no copy out of nng's message);
- ``fiberlite send``: the same with ``ring.send``/``ring.recv`` of 1 MiB numpy arrays
  (messages, as every collective but the ring reductions; those move their bytes on the
  members' direct ring links, raw TCP without messages, so their bus bandwidth can
  exceed the message link's);
- ``gloo``: ``torch.distributed.all_reduce`` with the Gloo backend on the same ranks
  (started with ``ring.init_torch_distributed``), when torch is installed.

A first table gives the per-step overhead: the round trip of a small message between
two ranks (``ring.send``/``ring.recv``) against a raw pynng Pair0 ping-pong, and the
time of ``barrier()`` and of ``all_reduce(1.0)`` on each ring size.

``--crossover`` instead compares the two all-reduce algorithms (gather + local reduce,
and the ring) from 32 KiB to 2 MiB: the measurement behind the size up to which
``all_reduce`` gathers (``collectives.gather_limit``).

Run: ``python benchmarks/bench_allreduce.py [--quick] [--json PATH] [--ranks 2 4] [--crossover]``
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (Report, format_section, from_samples, optional_import, parser,  # noqa: E402
                     progress, sized)

KiB, MiB = 1 << 10, 1 << 20
LINK_MESSAGE = 1 * MiB


# -- raw link ---------------------------------------------------------------------------------
def pynng_sender(address: str, count: int) -> None:
    import pynng
    with pynng.Pair0(send_buffer_size=16) as sock:
        sock.dial(address, block=True)
        message = os.urandom(LINK_MESSAGE)
        for _ in range(count):
            sock.send(message)
        sock.recv()  # the receiver's acknowledgement


def measure_pynng_link(count: int, repeats: int) -> list[float]:
    """Seconds per byte, one way, per repeat."""
    import pynng
    spawn = multiprocessing.get_context("spawn")
    samples = []
    for _ in range(repeats):
        with pynng.Pair0(recv_buffer_size=16, recv_max_size=0) as sock:
            sock.listen("tcp://127.0.0.1:0")
            address = "tcp://" + str(sock.listeners[0].local_address)
            child = spawn.Process(target=pynng_sender, args=(address, count + 4))
            child.start()
            for _ in range(4):  # warm-up messages
                sock.recv_msg()
            start = time.perf_counter()
            for _ in range(count):
                sock.recv_msg()  # the message stays in nng's memory: no copy out
            samples.append((time.perf_counter() - start) / (count * LINK_MESSAGE))
            sock.send(b"ok")
            child.join()
    return samples


def send_member(ring: Any, count: int, repeats: int) -> list[float]:
    import numpy as np
    message = np.ones(LINK_MESSAGE // 4, np.float32)
    samples = []
    for rep in range(repeats):
        ring.barrier()
        if ring.rank == 0:
            for _ in range(count + 4):
                ring.send(message, 1, tag=rep)
            ring.recv(1, tag="ack")
        else:
            for _ in range(4):
                ring.recv(0, tag=rep)
            start = time.perf_counter()
            for _ in range(count):
                ring.recv(0, tag=rep)
            samples.append((time.perf_counter() - start) / (count * LINK_MESSAGE))
            ring.send("ok", 0, tag="ack")
    return samples


# -- per-step overhead -------------------------------------------------------------------------------
def pynng_echo(address: str) -> None:
    import pynng
    with pynng.Pair0() as sock:
        sock.dial(address, block=True)
        while True:
            message = sock.recv()
            sock.send(message)
            if message == b"stop":
                return


def measure_pynng_roundtrip(trips: int, repeats: int) -> list[float]:
    import pynng
    spawn = multiprocessing.get_context("spawn")
    with pynng.Pair0() as sock:
        sock.listen("tcp://127.0.0.1:0")
        child = spawn.Process(target=pynng_echo, args=("tcp://" + str(sock.listeners[0].local_address),))
        child.start()
        samples = []
        for rep in range(repeats + 1):
            start = time.perf_counter()
            for _ in range(trips):
                sock.send(b"12345678")
                sock.recv()
            if rep:  # the first repeat warms up
                samples.append((time.perf_counter() - start) / trips)
        sock.send(b"stop")
        sock.recv()
        child.join()
    return samples


def latency_member(ring: Any, trips: int, repeats: int) -> dict:
    """Seconds per small round trip (ranks 0 and 1), barrier and all_reduce(1.0)."""
    out: dict[str, list[float]] = {"roundtrip": [], "barrier": [], "all_reduce": []}
    for rep in range(repeats + 1):
        ring.barrier()
        start = time.perf_counter()
        for _ in range(trips):
            if ring.rank == 0:
                ring.send(b"12345678", 1)
                ring.recv(1)
            elif ring.rank == 1:
                ring.send(ring.recv(0), 0)
        elapsed = (time.perf_counter() - start) / trips
        for name, step in (("barrier", ring.barrier), ("all_reduce", lambda: ring.all_reduce(1.0))):
            ring.barrier()
            begin = time.perf_counter()
            for _ in range(trips):
                step()
            if rep:
                out[name].append(ring.all_reduce((time.perf_counter() - begin) / trips, op="max"))
        if rep:
            out["roundtrip"].append(elapsed)
    return out


# -- all-reduce ----------------------------------------------------------------------------------
def iterations(nbytes: int, quick: bool) -> int:
    budget = (8 if quick else 64) * MiB
    return max(2, min(200 if not quick else 20, budget // max(nbytes, 1)))


def allreduce_member(ring: Any, sizes: list[int], repeats: int, quick: bool, impl: str) -> dict:
    """Median seconds per all-reduce of each size (slowest rank)."""
    import numpy as np
    if impl == "gloo":
        import torch
        dist = ring.init_torch_distributed("gloo")
    out = {}
    for nbytes in sizes:
        if impl == "gloo":
            x = torch.zeros(nbytes // 4, dtype=torch.float32)

            def once(x: Any = x) -> None:
                dist.all_reduce(x)
        else:
            x = np.zeros(nbytes // 4, np.float32)

            def once(x: Any = x) -> None:
                ring.all_reduce(x)
        iters = iterations(nbytes, quick)
        once()
        samples = []
        for _ in range(repeats):
            ring.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                once()
            samples.append(ring.all_reduce((time.perf_counter() - start) / iters, op="max"))
        out[nbytes] = samples
    return out


def crossover_member(ring: Any, sizes: list[int], repeats: int, quick: bool) -> dict:
    """Median seconds per all-reduce of each size with each algorithm, alternated."""
    import numpy as np
    out: dict[tuple[str, int], list[float]] = {}
    for nbytes in sizes:
        x = np.zeros(nbytes // 4, np.float32)
        iters = iterations(nbytes, quick)
        for _ in range(repeats):
            for algorithm in ("gather", "ring"):
                ring.all_reduce(x, algorithm=algorithm)
                ring.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    ring.all_reduce(x, algorithm=algorithm)
                elapsed = (time.perf_counter() - start) / iters
                out.setdefault((algorithm, nbytes), []).append(ring.all_reduce(elapsed, op="max"))
    return out


def crossover(args: Any) -> None:
    """Where the ring starts beating gather + local reduce, per ring size: the data
    behind ``collectives.gather_limit``."""
    import fiberlite
    from fiberlite.ring.collectives import gather_limit
    sizes = sized(args, [KiB << i for i in range(5, 12)], [32 * KiB, 256 * KiB])
    repeats = sized(args, 5, 1)
    report = Report("allreduce_crossover", "all_reduce time, gather vs ring, by size",
                    sizes=sizes, ranks=args.ranks, repeats=repeats)
    for n in args.ranks:
        progress(f"measuring gather and ring on {n} ranks ...")
        times = fiberlite.Ring(n, crossover_member, args=(sizes, repeats, args.quick)).run()[0]
        section = report.section(f"crossover_{n}", f"all_reduce on {n} ranks, gather vs ring "
                                 f"(gather used up to {_size(gather_limit(n))})", unit="all-reduce",
                                 reference=None)
        for nbytes in sizes:
            gather, ring = (statistics.median(times[(a, nbytes)]) for a in ("gather", "ring"))
            section.add(f"gather {_size(nbytes)}", _stats(times[("gather", nbytes)]), ranks=n, bytes=nbytes)
            section.add(f"ring {_size(nbytes)}", _stats(times[("ring", nbytes)]), ranks=n, bytes=nbytes,
                        ring_vs_gather=ring / gather)
            print(f"  {n} ranks {_size(nbytes):>8}: gather {_time(gather):>9}  ring {_time(ring):>9}"
                  f"  ring/gather {ring / gather:.2f}x", flush=True)
    if args.json:
        report.write_json(args.json)
        progress(f"wrote {args.json}")


def fmt_bw(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def main() -> None:
    p = parser("All-reduce bandwidth of a fiberlite Ring vs raw pynng and torch Gloo.")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--no-gloo", action="store_true", help="skip torch.distributed Gloo")
    p.add_argument("--crossover", action="store_true",
                   help="only compare the gather and ring algorithms from 32 KiB to 2 MiB")
    args = p.parse_args()
    if args.crossover:
        crossover(args)
        return
    import fiberlite
    quick = args.quick
    sizes = sized(args, [4 * KiB << (2 * i) for i in range(8)], [4 * KiB, 256 * KiB, 4 * MiB])
    repeats = sized(args, 5, 2)
    link_count = sized(args, 200, 20)
    torch = None if args.no_gloo else optional_import("torch.distributed")
    report = Report("allreduce", "float32 all-reduce bandwidth, local jobs on one machine",
                    sizes=sizes, ranks=args.ranks, repeats=repeats, link_message=LINK_MESSAGE)

    progress("measuring the raw pynng link ...")
    link = report.section("link", "one-way link, 1 MiB messages", unit="byte", reference="pynng link")
    link.add("pynng link", _stats(measure_pynng_link(link_count, repeats)))
    progress("measuring fiberlite send/recv ...")
    sends = fiberlite.Ring(2, send_member, args=(link_count, repeats)).run()[1]
    link.add("fiberlite send", _stats(sends))
    link_bw = 1 / link.reference_value()

    trips = sized(args, 500, 50)
    progress("measuring per-step latency ...")
    steps = report.section("latency", "per-step overhead", unit="operation", reference="pynng round trip")
    steps.add("pynng round trip", _stats(measure_pynng_roundtrip(trips, repeats)))
    for n in args.ranks:
        lat = fiberlite.Ring(n, latency_member, args=(trips, repeats)).run()[0]
        if n == args.ranks[0]:
            steps.add("ring send/recv round trip", _stats(lat["roundtrip"]), ranks=n)
        steps.add(f"barrier, {n} ranks", _stats(lat["barrier"]), ranks=n)
        steps.add(f"all_reduce(1.0), {n} ranks", _stats(lat["all_reduce"]), ranks=n)

    table = []
    for n in args.ranks:
        section = report.section(f"allreduce_{n}", f"all_reduce on {n} ranks", unit="all-reduce",
                                 reference=None)
        progress(f"measuring fiberlite all_reduce on {n} ranks ...")
        ours = fiberlite.Ring(n, allreduce_member, args=(sizes, repeats, quick, "fiberlite")).run()[0]
        gloo = None
        if torch is not None:
            progress(f"measuring torch.distributed gloo all_reduce on {n} ranks ...")
            gloo = fiberlite.Ring(n, allreduce_member, args=(sizes, repeats, quick, "gloo")).run()[0]
        for nbytes in sizes:
            factor = 2 * (n - 1) / n
            t_ours = statistics.median(ours[nbytes])
            bus = nbytes / t_ours * factor
            t_gloo = statistics.median(gloo[nbytes]) if gloo else None
            bus_gloo = nbytes / t_gloo * factor if t_gloo else None
            info = {"ranks": n, "bytes": nbytes, "algbw": nbytes / t_ours, "busbw": bus,
                    "busbw_vs_link": bus / link_bw,
                    "busbw_vs_gloo": bus / bus_gloo if bus_gloo else None}
            section.add(f"fiberlite {_size(nbytes)}", _stats(ours[nbytes]), **info)
            if gloo:
                section.add(f"gloo {_size(nbytes)}", _stats(gloo[nbytes]), ranks=n, bytes=nbytes,
                            algbw=nbytes / t_gloo, busbw=bus_gloo, busbw_vs_link=bus_gloo / link_bw)
            table.append((n, nbytes, t_ours, nbytes / t_ours, bus, bus / link_bw,
                          t_gloo, bus_gloo, bus / bus_gloo if bus_gloo else None))
        if torch is None:
            section.note = "gloo: skipped (torch not installed)"

    print(f"# allreduce: float32 all-reduce, local jobs ({report.to_dict()['machine']['cpu_model']}, "
          f"{os.cpu_count()} cores)" + ("  [--quick: not a measurement]" if quick else ""))
    print(f"# raw pynng link {fmt_bw(link_bw)} GB/s one way; fiberlite send/recv "
          f"{fmt_bw(1 / link.value(link.rows[1]))} GB/s ({link.value(link.rows[0]) / link.value(link.rows[1]):.2f}x)")
    print()
    print(format_section(steps))
    print()
    head = ("ranks", "size", "time", "algbw GB/s", "busbw GB/s", "bus/link", "gloo time",
            "gloo busbw", "vs gloo")
    rows = [head]
    for n, nbytes, t, alg, bus, vs_link, tg, busg, vs_gloo in table:
        rows.append((str(n), _size(nbytes), _time(t), fmt_bw(alg), fmt_bw(bus), f"{vs_link:.2f}x",
                     _time(tg) if tg else "-", fmt_bw(busg), f"{vs_gloo:.2f}x" if vs_gloo else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        print("  " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  " + "-+-".join("-" * w for w in widths))
    if args.json:
        report.write_json(args.json)
        progress(f"wrote {args.json}")


def _stats(samples: list[float]):
    return from_samples(samples)


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
