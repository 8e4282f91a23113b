"""What the run's live page costs the master, and how soon it shows a change.

A master (a child process of this script) runs ``Pool(4).map`` over 1,000 tasks of
``--task-ms`` milliseconds, with the dashboard off, and on with the page open: a
reader process following ``/api/events`` (the data pushed at each change), as the
page's script does, or with
``--browser`` the page itself in headless Chromium (selenium; Debian's ``chromium`` and
``chromium-driver``). The master's own CPU time (its process CPU clock, every thread of the
master and only the master: not its workers, not the reader) during the map is
compared, as a share of the master's CPU with the dashboard off; and, per thread,
where the master spends it. Then the master puts an item
in a queue, five times, and the reader notes when it first shows: in the page's data,
or with ``--browser`` in the page itself (the moment the page's queue table changed,
taken in the browser).

    python benchmarks/bench_dashboard.py [--rounds 5] [--task-ms 5] [--browser]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, finish, from_samples, interleave, parser, progress, sized  # noqa: E402

TASKS, WORKERS = 1000, 4
CHANGES = 5

# in the page: note when the queue table's first size changes, with the browser's clock
# (epoch seconds, as Python's time.time())
WATCH_QUEUE = """
window.seen = [];
let last = null;
const look = () => {
  const cell = document.querySelector("#queues tbody td:nth-child(2)");
  if (cell && /^[0-9]+$/.test(cell.textContent) && cell.textContent !== last) {
    last = cell.textContent;
    window.seen.push([last, (performance.timeOrigin + performance.now()) / 1000]);
  }
};
new MutationObserver(look).observe(document.getElementById("queues"),
                                   {childList: true, subtree: true, characterData: true});
look();
"""


def task(ms: float) -> float:
    time.sleep(ms / 1000)
    return ms


def reader(url: str) -> None:
    """The page, without a browser: follow the data the master pushes (``api/events``),
    as the page's script does; print the moment each new queue size is first seen
    (``seen SIZE T``) until the master goes away."""
    last = None
    try:
        with urllib.request.urlopen(url + "api/events", timeout=60) as stream:
            for line in stream:
                if not line.startswith(b"data: "):
                    continue
                data = json.loads(line[6:])
                if "progress" in data:
                    continue  # the running calls' counts alone, which the page merges
                sizes = [q["size"] for q in data["queues"]]
                if sizes and sizes[0] != last:
                    last = sizes[0]
                    print("seen", last, time.time(), flush=True)
    except (OSError, http.client.HTTPException):
        return


def browser_reader(url: str) -> None:
    """The page in headless Chromium; prints ``seen SIZE T`` as :func:`reader` does, T
    being when the page's queue table changed (until the master goes away)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # quit the browser too
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(url)
        driver.execute_script(WATCH_QUEUE)
        told = 0
        while True:
            seen, status = driver.execute_script(
                "return [window.seen, document.getElementById('status').textContent]")
            for size, when in seen[told:]:
                print("seen", size, when, flush=True)
            told = len(seen)
            if "run ended" in status:
                return
            time.sleep(0.05)
    finally:
        driver.quit()


def check_browser() -> None:
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        raise SystemExit("--browser needs " + ", ".join(missing) +
                         " (apt-get install -y chromium chromium-driver)")


def threads_cpu() -> dict[str, float]:
    """CPU seconds so far of each of this process's threads, by what they are: Python
    threads by name (``Thread-N`` dropped), the others (nng's) together; Linux's
    per-thread figures, empty elsewhere."""
    names = {t.native_id: re.sub(r"^Thread-\d+ ", "", t.name) for t in threading.enumerate()}
    found: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                cpu = int(stat.read().split()[0]) / 1e9
        except OSError:
            continue  # ended meanwhile
        name = names.get(int(tid), "other (nng)")
        found[name] = found.get(name, 0.0) + cpu
    return found


def page_threads(cpu: dict[str, float]) -> float:
    """The CPU seconds of the page's own threads (its clock, its server) in ``cpu``."""
    return sum(v for k, v in cpu.items() if k.startswith("fiberlite-dashboard"))


def master(page: bool, task_ms: float, browser: bool) -> None:
    """One measured map (and, with the page, the change latencies), as one JSON line."""
    import fiberlite as mp
    if page:
        mp.init(dashboard="127.0.0.1:0")
    queue = mp.Queue()
    result: dict = {}
    with mp.Pool(WORKERS) as pool:
        pool.map(task, [0.0] * WORKERS * 4)  # every worker up
        watcher = None
        if page:
            from fiberlite import dashboard
            role = "browser" if browser else "reader"
            watcher = subprocess.Popen([sys.executable, __file__, "--role", role, dashboard.url()],
                                       stdout=subprocess.PIPE, text=True)
            assert watcher.stdout.readline().startswith("seen 0")
        threads, before, start = threads_cpu(), time.process_time(), time.perf_counter()
        assert pool.map(task, [task_ms] * TASKS, chunksize=1) == [task_ms] * TASKS
        result["cpu"], result["wall"] = time.process_time() - before, time.perf_counter() - start
        result["threads"] = {name: cpu - threads.get(name, 0.0)
                             for name, cpu in threads_cpu().items()}
        if watcher is not None:
            delays = []
            for size in range(1, CHANGES + 1):
                time.sleep(random.uniform(0, 1))  # changes come at any moment, not in step
                put = time.time()
                queue.put(size)
                seen = watcher.stdout.readline().split()
                assert seen[:2] == ["seen", str(size)], seen
                delays.append(float(seen[2]) - put)
            result["delays"] = delays
            watcher.terminate()
            watcher.wait()
    print(json.dumps(result), flush=True)


def measure(page: bool, task_ms: float, browser: bool) -> dict:
    done = subprocess.run([sys.executable, __file__, "--role", "master", "--task-ms", str(task_ms)]
                          + (["--page"] if page else []) + (["--browser"] if browser else []),
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the master failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser("the dashboard's cost to the master and its delay")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--task-ms", type=float, default=5.0)
    p.add_argument("--browser", action="store_true",
                   help="open the page in headless Chromium instead of fetching its data")
    p.add_argument("--role", choices=["master", "reader", "browser"], help=argparse.SUPPRESS)
    p.add_argument("--page", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("url", nargs="?", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "reader":
        return reader(args.url)
    if args.role == "browser":
        return browser_reader(args.url)
    if args.role == "master":
        return master(args.page, args.task_ms, args.browser)
    if args.browser:
        check_browser()
    rounds = sized(args, args.rounds, 1)
    samples = interleave({"page closed": lambda: measure(False, args.task_ms, args.browser),
                          "page open": lambda: measure(True, args.task_ms, args.browser)},
                         rounds, label="maps")
    shown = ("shown in the page (headless Chromium)" if args.browser
             else "seen by a reader following the page's data (api/events)")
    report = Report("dashboard", f"Pool({WORKERS}).map of {TASKS} tasks of {args.task_ms:g} ms, "
                                 f"page {'open in headless Chromium' if args.browser else 'followed by a reader'}",
                    tasks=TASKS, workers=WORKERS)
    cpu = report.section("master_cpu", "master CPU during the map", unit="map",
                         reference="page closed", note="the master process only (its process CPU clock)")
    for name, results in samples.items():
        cpu.add(name, from_samples(r["cpu"] for r in results),
                wall=[r["wall"] for r in results])
    delay = report.section("delay", "from a change to the page " + (
        "showing it" if args.browser else "data"), unit="change", reference="queue.put " + shown)
    delays = [d for r in samples["page open"] for d in r["delays"]]
    delay.add("queue.put " + shown, from_samples(delays))
    finish(report, args)
    closed = [c["cpu"] for c in samples["page closed"]]
    opened = [o["cpu"] for o in samples["page open"]]
    wall = [o["wall"] for o in samples["page open"]]
    extra = statistics.median(opened) - statistics.median(closed)
    print(f"\ncost of the open page: {extra * 1000:+.1f} ms of master CPU per map, "
          f"{100 * extra / statistics.median(closed):+.1f}% of the master's CPU with the "
          f"dashboard off (medians; means: {100 * (sum(opened) / sum(closed) - 1):+.1f}%); "
          f"slowest change shown after {max(delays):.2f} s")
    own = [page_threads(o["threads"]) for o in samples["page open"]]
    if any(own):
        print(f"the page's own threads: {statistics.median(own) * 1000:.1f} ms per map, "
              f"{100 * statistics.median(own) / statistics.median(closed):.1f}% of the "
              f"master's CPU with the dashboard off ({100 * sum(own) / sum(wall):.2f}% of one core)")
        print("master CPU per thread, ms per map (median): page closed / page open")
        names = sorted({n for r in samples["page closed"] + samples["page open"]
                        for n in r["threads"]})
        for name in names:
            c, o = ([r["threads"].get(name, 0.0) * 1000 for r in samples[k]]
                    for k in ("page closed", "page open"))
            print(f"  {name:40} {statistics.median(c):7.1f} / {statistics.median(o):7.1f}")
    progress("done")


if __name__ == "__main__":
    main()
