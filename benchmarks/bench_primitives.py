"""The shared primitives of one machine: the same script with ``multiprocessing`` (spawn)
and with fiberlite, side by side in one run.

Each row is what a ``multiprocessing`` script does with a primitive: a ``Value``
incremented under its lock by two children, a ``Lock`` taken and given back, an
``Event`` ping-pong, a ``Pipe`` round trip, a ``Queue`` emptied as a child fills it,
``Array`` reads, a ``Condition`` passed back and forth (the last rows as in CPython's
``Doc/includes/mp_benchmarks.py``), and whether a child can write into an ``Array``
through ``numpy.frombuffer(arr.get_obj())`` so that the parent sees it.

Every library runs in a process of its own (a *side*), started by this script with
``--serve``: its children and the hub of fiberlite are its own, and a setting such as
``FIBERLITE_SHARE_MACHINE=0`` is in its environment and so in its children's. For each
row every side sets up its objects and children, sizes its sample so that it lasts
``--sample`` seconds, then the sides take turns for ``--rounds`` rounds; a row's figure
is its best round. A side that fails or does not answer within ``--timeout`` seconds
gets the one-line error in its cell (a side that hung is killed and started anew for
the next row), and the table goes on.

Where the processes run is fixed (``--place``): with ``--share-machine off``, by
default, each side runs on one CPU and its children on another (``apart``: as two
machines with a CPU each, where a message wakes a CPU that waits for it), so that the
floor and the rows are measured the same way from run to run; ``together`` puts a side
and its children on one CPU, ``free`` leaves them to the scheduler (the default
otherwise).

With ``--portable`` a column shows fiberlite's portable path (``FIBERLITE_PORTABLE_SYNC=1``:
POSIX semaphores, what macOS and a machine without a C compiler get); the targets hold
for it too.

Run: ``python benchmarks/bench_primitives.py [--quick] [--share-machine on|off|both]
[--place apart|together|free] [--portable] [--before DIR ...] [--rows KEY,...] [--json PATH]``
"""
from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, Stats, finish, format_time, parser, progress, sized  # noqa: E402
from _primitive_rows import BY_KEY, PLACES, Fixture, NumpyView, Spec, one_line  # noqa: E402

MP = "mp spawn"
FIBERLITE = "fiberlite"
NOT_SHARED = "fiberlite, FIBERLITE_SHARE_MACHINE=0"
SHARE_ENV = "FIBERLITE_SHARE_MACHINE"
PORTABLE = "fiberlite portable"  # the portable path of machines without the C extension
PORTABLE_ENV = "FIBERLITE_PORTABLE_SYNC"


# -- a side: serving one library's rows in a process of its own -----------------------------
def calibrate(fixture: Fixture, sample: float, limit: float) -> int:
    """A count whose run lasts about ``sample`` seconds, found by doubling from 1 after a
    first run (which pays for what happens once: a child's first wake-up, a connection)."""
    fixture.run(1)
    count, spent = 1, 0.0
    while True:
        elapsed = fixture.run(count)
        spent += elapsed
        if elapsed >= sample / 4 or spent >= limit:
            return max(1, round(count * sample / max(elapsed, 1e-9)))
        count *= 2


def serve(library: str, timeout: float) -> None:
    """(``--serve LIBRARY``) Answer one JSON request a line on stdin, one JSON reply a line.
    A request not answered a second before ``timeout`` (when the side is killed) prints
    every thread's stack to stderr first, so that a hang shows where it waits."""
    faulthandler.enable()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else prints (children included) goes to stderr
    if library == MP:
        ctx: Any = multiprocessing.get_context("spawn")
        origin = "multiprocessing"
    else:
        import fiberlite
        ctx, origin = fiberlite, os.path.realpath(os.path.dirname(fiberlite.__file__))
    replies.write(json.dumps({"origin": origin}) + "\n")
    replies.flush()
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    fixture: Fixture | None = None
    count = 1
    for line in sys.stdin:
        request = json.loads(line)
        faulthandler.dump_traceback_later(max(1.0, timeout - 1.0))
        reply: dict[str, Any] = {}
        try:
            op = request["op"]
            if op == "setup":
                spec = BY_KEY[request["row"]]
                fixture = spec.make(ctx)
                if not spec.check:
                    try:
                        reply["cpus"] = fixture.place(request["place"], allowed)
                        count = calibrate(fixture, request["sample"], request["limit"])
                    except Exception:
                        fixture, failed = None, fixture
                        failed.close()
                        raise
                reply["count"] = count
            elif op == "sample":
                assert fixture is not None
                if isinstance(fixture, NumpyView):
                    reply["status"] = fixture.status()
                else:
                    reply["seconds"] = fixture.run(count) / (count * fixture.per)
            elif op == "stop":
                if fixture is not None:
                    fixture, closing = None, fixture
                    closing.close()
        except Exception as exc:
            reply = {"error": one_line(exc)}
        faulthandler.cancel_dump_traceback_later()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    if fixture is not None:
        fixture.close()


class SideError(RuntimeError):
    """A side failed a request: its one-line error, or that it died or did not answer."""


class Side:
    """One library (maybe with settings) in a process of its own, started when first asked."""

    def __init__(self, label: str, library: str, env: dict[str, str], timeout: float,
                 root: str | None = None) -> None:
        self.label, self.library, self.env, self.timeout, self.root = label, library, env, timeout, root
        self.process: subprocess.Popen | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _start(self) -> None:
        progress(f"starting the side {self.label} ...")
        self.lines = queue.Queue()
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", self.library,
             "--timeout", str(self.timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env,
            cwd=self.root or os.getcwd(), start_new_session=True)  # its own group: killed whole
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        origin = self._reply(120)["origin"]
        if self.root and not origin.startswith(os.path.realpath(self.root)):
            self.kill()
            raise SideError(f"the side for {self.root} imported fiberlite from {origin}")

    @staticmethod
    def _read(stream: Any, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def _reply(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill(stacks=True)
            raise SideError(f"timed out: no answer within {timeout:.0f} s; its process was killed") from None
        if line is None:
            code = self.process.wait() if self.process else None
            self.process = None
            raise SideError(f"its process ended (exit code {code})")
        return json.loads(line)

    def ask(self, **request: Any) -> dict[str, Any]:
        """The reply to ``request``; :class:`SideError` on an error reply, a timeout or a dead side."""
        if self.process is None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except OSError as exc:
            self.kill()
            raise SideError(f"its process is gone ({one_line(exc)})") from None
        reply = self._reply(self.timeout)
        if "error" in reply:
            raise SideError(reply["error"])
        return reply

    @property
    def running(self) -> bool:
        return self.process is not None

    def kill(self, stacks: bool = False) -> None:
        """End this side's process group (its own children with it). With ``stacks``, its
        processes get SIGABRT first: with ``PYTHONFAULTHANDLER`` set, as the smoke test
        sets it, each prints every thread's stack to stderr as it ends."""
        if self.process is not None:
            if stacks:
                self._signal(signal.SIGABRT)
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self._signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def _signal(self, number: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, number)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(30)
                self.process = None
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


# -- measuring and printing ------------------------------------------------------------------
@dataclass
class Cell:
    """What one side gave for one row: samples (seconds per unit), a status, or an error."""

    samples: list[float] = field(default_factory=list)
    status: str | None = None
    error: str | None = None
    cpus: list[list[int]] | None = None  # the CPUs of the side's threads, and of its children's


def measure(spec: Spec, sides: list[Side], rounds: int, sample: float, place: str) -> dict[str, Cell]:
    """Every side's cell of one row: set up in turn, then ``rounds`` rounds, the order turning."""
    progress(f"{spec.title} ...")
    cells = {side.label: Cell() for side in sides}
    ready: list[Side] = []
    for side in sides:
        try:
            reply = side.ask(op="setup", row=spec.key, sample=sample, limit=10 * sample, place=place)
            cells[side.label].cpus = reply.get("cpus")
            ready.append(side)
        except SideError as exc:
            cells[side.label].error = str(exc)
    for round_ in range(1 if spec.check else rounds):
        shift = round_ % max(1, len(ready))
        for side in ready[shift:] + ready[:shift]:
            cell = cells[side.label]
            if cell.error:
                continue
            try:
                reply = side.ask(op="sample")
                if spec.check:
                    cell.status = reply["status"]
                else:
                    cell.samples.append(reply["seconds"])
            except SideError as exc:
                cell.error = str(exc)
    for side in ready:
        if not side.running:  # killed: nothing left to stop
            continue
        try:
            side.ask(op="stop")
        except SideError as exc:
            progress(f"  {side.label}: {spec.key} did not stop cleanly: {exc}")
    return cells


def format_unit(spec: Spec, seconds: float) -> str:
    if spec.rate:
        rate = 1 / seconds
        return f"{rate / 1000:,.0f}k/s" if rate >= 10_000 else f"{rate:,.0f}/s"
    return f"{seconds * 1e9:.0f} ns" if seconds < 1e-6 else format_time(seconds)


def ratio(spec: Spec, reference: float, seconds: float) -> float:
    """fiberlite / stdlib: of the times, or of the rates for a throughput row."""
    return reference / seconds if spec.rate else seconds / reference


class PrimitivesReport(Report):
    """The report with one table of every row and side, and the checks in the JSON."""

    def __init__(self, *args: Any, **params: Any) -> None:
        super().__init__(*args, **params)
        self.cells: dict[str, dict[str, Cell]] = {}
        self.labels: list[str] = []

    def record(self, spec: Spec, cells: dict[str, Cell]) -> None:
        self.cells[spec.key] = cells
        if spec.check:
            return
        section = self.section(spec.key, spec.title, unit=spec.unit, reference=MP, stat="best",
                               note="seconds per item; the table shows items/s, and their ratio (this one inverted)"
                               if spec.rate else "")
        for label, cell in cells.items():
            if cell.samples and not cell.error:
                section.add(label, Stats(cell.samples))
            else:
                section.skip(label, cell.error or "not measured")

    def to_dict(self) -> dict[str, Any]:
        document = super().to_dict()
        document["checks"] = {key: {label: cell.status or cell.error for label, cell in cells.items()}
                              for key, cells in self.cells.items() if BY_KEY[key].check}
        document["placement"] = {key: {label: {"side": cell.cpus[0], "children": cell.cpus[1]}
                                       for label, cell in cells.items() if cell.cpus}
                                 for key, cells in self.cells.items()}
        trips = {label: self.round_trips(label) for label in self.across_labels()}
        if any(trips.values()):
            document["tcp_round_trips"] = {label: t for label, t in trips.items() if t}
        return document

    def table(self) -> str:
        others = [label for label in self.labels if label != MP]
        lines = [["row", "per", "better", MP, *[x for label in others for x in (label, "ratio")], "target"]]
        for key, cells in self.cells.items():
            spec = BY_KEY[key]
            line = [spec.title, "-" if spec.check else ("items/s" if spec.rate else spec.unit),
                    "works" if spec.check else ("higher" if spec.rate else "lower"), self._cell(spec, cells[MP])]
            for label in others:
                line += [self._cell(spec, cells[label]), self._ratio(spec, cells[MP], cells[label])]
            lines.append(line + [self._target(spec, cells)])
        widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
        out = ["One machine: the same script with each library, in one run"]
        for i, row in enumerate(lines):
            out.append("  " + " | ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]))
            if i == 0:
                out.append("  " + "-+-".join("-" * w for w in widths))
        place = self.params["place"]
        out.append(f"  note: best of {self.params['rounds']} rounds of about {self.params['sample']} s per row "
                   f"and side, placed {place} ({PLACES[place]}). "
                   "ratio = fiberlite / stdlib: of times (lower is better), of items/s for the Queue "
                   f"rows (higher is better). Targets are for the column {FIBERLITE!r} (same machine)"
                   + (f" and, after the slash, {PORTABLE!r}." if PORTABLE in self.labels else "."))
        return "\n".join(out + self.across_machines())

    def across_labels(self) -> list[str]:
        """The columns measured with ``share_machine`` off (``--before`` ones too, then)."""
        if self.params.get("share_machine") == "off":
            return [label for label in self.labels if label != MP]
        return [NOT_SHARED] if NOT_SHARED in self.labels else []

    def round_trips(self, label: str = NOT_SHARED) -> dict[str, float] | None:
        """Each row of the column ``label`` in raw TCP round trips of the same side (the
        ``tcp`` row), None without both."""
        floor = self.cells.get("tcp", {}).get(label)
        if floor is None or floor.error or not floor.samples:
            return None
        tcp = min(floor.samples)
        return {key: min(cells[label].samples) / tcp for key, cells in self.cells.items()
                if key != "tcp" and label in cells and cells[label].samples
                and not cells[label].error and not BY_KEY[key].rate}

    def across_machines(self) -> list[str]:
        """The rows with a target across machines: each in TCP round trips (or items/s)."""
        out: list[str] = []
        for label in self.across_labels():
            trips = self.round_trips(label)
            if trips is None:
                continue
            floor = self.cells["tcp"][label]
            where = (f" (the side on CPU {','.join(map(str, floor.cpus[0]))}, its children on CPU "
                     f"{','.join(map(str, floor.cpus[1]))})") if floor.cpus and floor.cpus[0] else ""
            out += ["", f"Across machines ({SHARE_ENV}=0: the hub over TCP), {label}, against a raw TCP "
                        f"round trip between the same kind of processes, placed the same way{where}, in this "
                        f"run: {format_time(min(floor.samples))}"]
            for key, cells in self.cells.items():
                spec, cell = BY_KEY[key], cells.get(label)
                if spec.remote is None or cell is None:
                    continue
                if cell.error or not cell.samples:
                    out.append(f"  {spec.title}: {cell.error or 'not measured'}")
                    continue
                best = min(cell.samples)
                if spec.rate:
                    met = 1 / best >= spec.remote
                    out.append(f"  {spec.title}: {format_unit(spec, best)} (target >= "
                               f"{spec.remote / 1000:,.0f}k/s: {'met' if met else 'NOT met'})")
                else:
                    met = trips[key] <= spec.remote
                    out.append(f"  {spec.title}: {format_time(best)} = {trips[key]:.1f} TCP round trips "
                               f"(target <= {spec.remote:g}: {'met' if met else 'NOT met'})")
        return out

    @staticmethod
    def _ratio(spec: Spec, reference: Cell, cell: Cell) -> str:
        if reference.error or cell.error or not (reference.samples and cell.samples):
            return "-"
        return f"{ratio(spec, min(reference.samples), min(cell.samples)):.2f}x"

    @classmethod
    def _target(cls, spec: Spec, cells: dict[str, Cell]) -> str:
        """The row's target, and whether the same-machine column (and the portable one) meets it."""
        verdicts = [cls._met(spec, cells.get(label), cells[MP]) for label in (FIBERLITE, PORTABLE)
                    if label in cells]
        verdicts = [v for v in verdicts if v is not None]
        if spec.target == "-" or not verdicts:
            return spec.target
        return f"{spec.target}: {' / '.join(verdicts)}"

    @staticmethod
    def _met(spec: Spec, cell: Cell | None, reference: Cell) -> str | None:
        """'met' or 'NOT met' for one column (None: nothing to say)."""
        if cell is None or spec.target == "-":
            return None
        if spec.check or cell.error:
            met = cell.status == "works"
        elif cell.samples and reference.samples:
            value = ratio(spec, min(reference.samples), min(cell.samples))
            met = value >= spec.limit if spec.rate else value <= spec.limit  # type: ignore[operator]
        else:
            return None
        return "met" if met else "NOT met"

    @staticmethod
    def _cell(spec: Spec, cell: Cell) -> str:
        if cell.error:
            return f"fails: {cell.error}"
        if spec.check:
            return cell.status or "-"
        return format_unit(spec, min(cell.samples)) if cell.samples else "-"


def make_sides(args: Any) -> list[Side]:
    base = {k: v for k, v in os.environ.items() if k not in (SHARE_ENV, PORTABLE_ENV)}
    sides = [Side(MP, MP, base, args.timeout)]
    if args.share_machine in ("on", "both"):
        sides.append(Side(FIBERLITE, FIBERLITE, base, args.timeout))
    if args.share_machine in ("off", "both"):
        sides.append(Side(NOT_SHARED, FIBERLITE, {**base, SHARE_ENV: "0"}, args.timeout))
    if args.portable:
        sides.append(Side(PORTABLE, FIBERLITE, {**base, PORTABLE_ENV: "1"}, args.timeout))
    for root in args.before:
        path = os.pathsep.join([os.path.abspath(root), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = {**base, "PYTHONPATH": path, **({SHARE_ENV: "0"} if args.share_machine == "off" else {})}
        sides.append(Side(f"fiberlite {root}", FIBERLITE, env, args.timeout, root=os.path.abspath(root)))
    return sides


def main() -> None:
    p = parser("Shared primitives on one machine: multiprocessing (spawn) and fiberlite side by side.")
    p.add_argument("--rounds", type=int, help="rounds per row; a row's figure is its best (7; --quick 2)")
    p.add_argument("--sample", type=float, help="seconds one round of a row lasts (0.25; --quick 0.02)")
    p.add_argument("--share-machine", choices=("on", "off", "both"), default="on",
                   help=f"the fiberlite column as configured (on), with {SHARE_ENV}=0 in the environment "
                        "of the parent and its children (off), or both columns")
    p.add_argument("--portable", action="store_true",
                   help=f"also a column of fiberlite's portable path ({PORTABLE_ENV}=1: POSIX semaphores, "
                        "what a machine without the C extension uses)")
    p.add_argument("--before", metavar="DIR", action="append", default=[],
                   help="also a column of fiberlite imported from the checkout DIR (may be repeated)")
    p.add_argument("--place", choices=list(PLACES),
                   help="which CPU runs which process (" + "; ".join(f"{k}: {v}" for k, v in PLACES.items())
                        + "); apart by default with --share-machine off, else free")
    p.add_argument("--rows", help="only these rows, by key: " + ",".join(BY_KEY))
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a side has to answer one request before it is killed (120)")
    p.add_argument("--serve", choices=(MP, FIBERLITE), help=argparse_hidden())
    args = p.parse_args()
    if args.serve:
        return serve(args.serve, args.timeout)
    rounds = args.rounds or sized(args, 7, 2)
    sample = args.sample or sized(args, 0.25, 0.02)
    keys = args.rows.split(",") if args.rows else list(BY_KEY)
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        p.error(f"unknown rows {', '.join(unknown)}; the rows are {', '.join(BY_KEY)}")
    place = args.place or ("apart" if args.share_machine == "off" else "free")
    sides = make_sides(args)
    report = PrimitivesReport("primitives", "shared primitives of one machine, multiprocessing spawn and fiberlite",
                              rounds=rounds, sample=sample, share_machine=args.share_machine, place=place,
                              sides=[side.label for side in sides])
    report.labels = [side.label for side in sides]
    try:
        for key in keys:
            report.record(BY_KEY[key], measure(BY_KEY[key], sides, rounds, sample, place))
    finally:
        for side in sides:
            side.close()
    finish(report, args)


def argparse_hidden() -> str:
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
