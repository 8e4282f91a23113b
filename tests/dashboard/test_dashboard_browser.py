"""The page in headless Chromium against a live run: it follows a map of 1,000 tasks
without a reload, shows a change at its next update, and shows failures and logs
(benchmarks/bench_dashboard.py measures the delay in seconds).
Screenshots of the page go to the test's temporary directory, or to the directory
named by FIBERLITE_SCREENSHOTS (``FIBERLITE_SCREENSHOTS=docs`` renews the ones the
documentation shows)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from browser_env import headless_browser
from dashboard.run_driver import LiveRun

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def browser():
    driver = headless_browser()
    yield driver
    driver.quit()


def text(browser, css: str) -> str:
    """The text of what ``css`` selects, read at once (the page redraws at each update)."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map((e) => e.textContent).join(' ')", css)


def click(browser, css: str) -> None:
    browser.execute_script("document.querySelector(arguments[0]).click()", css)


def wait_for(browser, condition, timeout: float = 60, step: float = 0.02):
    """Poll the page (not the run) until ``condition(browser)`` is true; returns when."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition(browser):
            return time.monotonic()
        time.sleep(step)
    raise AssertionError(f"the page never showed it; it shows: {browser.find_element('tag name', 'main').text[:2000]}")


@pytest.fixture
def screenshot(tmp_path):
    folder = Path(os.environ.get("FIBERLITE_SCREENSHOTS") or tmp_path)

    def take(browser, name: str) -> None:
        assert browser.save_screenshot(str(folder / name))
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return take


def test_page_follows_a_live_run(browser, screenshot):
    run = LiveRun()
    try:
        browser.get(run.url)
        wait_for(browser, lambda b: "Pool-1" in text(b, "#pool-list"))
        assert "4 of 4 workers" in text(browser, "#pool-list")

        # a change shows at the page's next update (the master pushes it as it happens),
        # without a reload: the update under way when the item was put may miss it, the
        # one after may not
        def queue_and_draws(b) -> tuple[str, int]:
            return tuple(b.execute_script(
                "return [document.querySelector('#queues tbody td:nth-child(2)').textContent,"
                " Number(document.body.dataset.draws)]"))
        assert queue_and_draws(browser)[0] == "0"
        run.send("put")
        assert run.answer() == "put"
        before = queue_and_draws(browser)[1]
        shown: list[int] = []  # the count of updates when the change first showed

        def change_shown(b) -> bool:
            size, count = queue_and_draws(b)
            if size == "1":
                shown.append(count)
            return bool(shown)
        wait_for(browser, change_shown, timeout=10)
        assert shown[0] - before <= 2, f"{shown[0] - before} updates before the change showed"

        # a Ring's members and their collective rates, while it runs
        assert run.ask("ring") == "ring started"

        def ring_rates(b) -> list[str]:
            return b.execute_script("return Array.from(document.querySelectorAll("
                                    "'#ring-list td.collective-rate')).map((e) => e.textContent)")
        wait_for(browser, lambda b: len(ring_rates(b)) == 2
                 and all(r not in ("–", "0.0") for r in ring_rates(b)))
        assert "rank 0" in text(browser, "#ring-list") and "rank 1" in text(browser, "#ring-list")

        # a map of 1,000 tasks, seen part done and then done
        run.send("map")
        partial = []

        def progress(b):
            done = text(b, "#pool-list td.done")
            if done and not done.startswith("1000 / 1000"):
                partial.append(done)
            return done.startswith("1000 / 1000")
        wait_for(browser, progress, timeout=60)
        assert run.answer() == "map exact"
        assert any(p.split(" / ")[1] == "1000" and 0 < int(p.split(" / ")[0]) < 1000
                   for p in partial), partial
        count = 'return document.querySelectorAll(arguments[0]).length'
        wait_for(browser, lambda b: b.execute_script(count, "#chart-tasks polyline") == 1
                 and b.execute_script(count, "#chart-cpu polyline") >= 1)
        screenshot(browser, "dashboard.png")
        answer, *counts = run.ask("ring-stop").split()
        assert answer == "ring-stopped"
        wait_for(browser, lambda b: text(b, "#ring-list td.collectives").split() == counts)

        # a failing call: its exception with the worker's traceback
        assert run.ask("fail") == "failed"
        wait_for(browser, lambda b: "KeyError" in text(b, "#pool-list summary"))
        click(browser, "#pool-list summary")
        wait_for(browser, lambda b: b.execute_script(
            "return document.querySelector('#pool-list details').open"), timeout=5)
        assert "fails_on_threes" in text(browser, "#pool-list details pre")
        # a local job's log tail on demand: what it printed
        answer, job = run.ask("talk").split()
        assert answer == "talked"
        wait_for(browser, lambda b: b.execute_script(  # its row, once it shows it ended
            "const row = Array.from(document.querySelectorAll('#jobs tr')).find("
            "(r) => r.cells[0].textContent === arguments[0]); "
            "return row !== undefined && row.cells[4].textContent === 'exited'", job))
        browser.execute_script(
            "Array.from(document.querySelectorAll('#jobs tr')).find("
            "(row) => row.cells[0].textContent === arguments[0]).querySelector('button').click()", job)
        wait_for(browser, lambda b: "line 299 of a job" in text(b, "#log-text"))
        assert text(browser, "#log-job") == job
        assert text(browser, "#log-text").splitlines() == [
            f"line {i} of a job" for i in range(100, 300)]
        screenshot(browser, "dashboard-failures.png")
    finally:
        assert run.close() == 0, "".join(run.stderr)
    # the run is over: the page says so instead of going blank
    wait_for(browser, lambda b: "run ended" in text(b, "#status"), timeout=10)


def test_page_lists_every_job_and_an_imaps_total(browser, screenshot):
    """A page asked for by the environment starts with the run's first object, the pool,
    whose host jobs start together: its Jobs table lists each of them. An imap over an
    input of known length shows that length as its total while it runs."""
    run = LiveRun(page_from_environment=True)
    try:
        answer, *jobs = run.ask("jobs").split()
        assert answer == "jobs" and jobs
        browser.get(run.url)

        def job_names(b) -> list[str]:
            return sorted(b.execute_script("return Array.from(document.querySelectorAll("
                                           "'#jobs tbody tr')).map((r) => r.cells[0].textContent)"))
        wait_for(browser, lambda b: job_names(b) == jobs, timeout=10)
        assert run.ask("imap") == "imap started 0"
        def imap_shown(b) -> bool:  # part done, out of the input's length
            done, _, total = text(b, "#pool-list td.done").partition(" / ")
            return total == "400" and 0 < int(done) < 400
        wait_for(browser, imap_shown, timeout=10)
        screenshot(browser, "dashboard-jobs.png")
        assert run.ask("imap-finish") == "imap exact"
        wait_for(browser, lambda b: text(b, "#pool-list td.done") == "400 / 400", timeout=10)
    finally:
        assert run.close() == 0, "".join(run.stderr)


def test_page_polls_where_its_stream_is_not_relayed(browser):
    """Behind ``fiberlite run``'s relay to a pod (which cannot pass a stream on) the
    page asks for its data instead, and still follows the run."""
    import urllib.request

    from fiberlite.backends.kubernetes.page_forward import PageForward

    def fetch(path: str) -> tuple[int, str, bytes]:
        with urllib.request.urlopen(run.url + path.lstrip("/"), timeout=10) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    run = LiveRun()
    door = PageForward(fetch)
    try:
        browser.get(door.url)
        wait_for(browser, lambda b: "Pool-1" in text(b, "#pool-list"))
        assert run.ask("put") == "put"
        wait_for(browser, lambda b: text(b, "#queues tbody td:nth-child(2)") == "1", timeout=10)
    finally:
        door.close()
        assert run.close() == 0, "".join(run.stderr)
