"""``fiberlite.runtime.deferred``: a job imports asyncio only once it uses it."""
from __future__ import annotations

import sys
import threading

import pytest

import fiberlite
from fiberlite.runtime.deferred import DeferredModule, defer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module on a temporary path whose import is counted in a file."""
    count = tmp_path / "imported"
    (tmp_path / "deferred_probe").mkdir()
    (tmp_path / "deferred_probe" / "__init__.py").write_text(
        f"import time\nwith open({str(count)!r}, 'a') as f: f.write('x')\n"
        "time.sleep(0.05)  # a slow import: racing readers must wait for it\nVALUE = 42\n")
    (tmp_path / "deferred_probe" / "child.py").write_text("NAME = 'child'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield count
    for name in ("deferred_probe", "deferred_probe.child"):
        sys.modules.pop(name, None)


def test_imported_on_first_read_once_even_when_threads_race(probe):
    defer("deferred_probe")
    import deferred_probe
    assert isinstance(deferred_probe, DeferredModule) and not probe.exists()
    values, start = [], threading.Barrier(4)

    def read():
        start.wait()
        values.append(deferred_probe.VALUE)
    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert values == [42] * 4
    assert probe.read_text() == "x"                      # imported exactly once
    real = sys.modules["deferred_probe"]
    assert not isinstance(real, DeferredModule) and real.VALUE == 42
    import deferred_probe.child                          # submodules import as usual
    assert deferred_probe.child.NAME == "child"


def test_a_submodule_import_loads_the_package_first(probe):
    defer("deferred_probe")
    from deferred_probe import child
    assert child.NAME == "child" and sys.modules["deferred_probe"].VALUE == 42


def test_defer_leaves_an_imported_module_alone():
    defer("json")
    import json
    assert not isinstance(json, DeferredModule)


def asyncio_in_a_job():
    before = type(sys.modules.get("asyncio")).__name__
    import asyncio

    async def double(x):
        await asyncio.sleep(0)
        return 2 * x
    result = asyncio.run(double(21))
    import asyncio.subprocess  # noqa: F401  (a submodule, once the real module is in)
    return before, result, type(sys.modules["asyncio"]).__name__


def test_a_job_starts_without_asyncio_and_can_still_use_it():
    q = fiberlite.Queue()
    p = fiberlite.Process(target=lambda: q.put(asyncio_in_a_job()))
    p.start()
    assert q.get(timeout=30) == ("DeferredModule", 42, "module")
    p.join(30)
    assert p.exitcode == 0
