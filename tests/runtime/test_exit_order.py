"""The order of exit is owned by ``runtime/exit_order.py``: stages run in their listed
order, each once, whether a job's bootstrap or the ``atexit`` hook gets there first."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from fiberlite.runtime import exit_order
from paths import ROOT
from interpreters import run_python

PACKAGE = Path(ROOT) / "fiberlite"


def test_stages_run_in_order_once_each_at_interpreter_exit():
    script = textwrap.dedent("""
        from fiberlite.runtime import exit_order
        for stage in reversed(exit_order.STAGES):   # registered backwards on purpose
            exit_order.at_exit(stage, lambda stage=stage: print(stage, flush=True))
        def broken():
            raise RuntimeError("this step fails")
        exit_order.at_exit("pools", broken)
        exit_order.leave(through="children")         # what a job's Process._bootstrap does
        print("--", flush=True)
    """)
    result = run_python("-c", script, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    stages = list(exit_order.STAGES)
    cut = stages.index("children") + 1
    assert result.stdout.split() == stages[:cut] + ["--"] + stages[cut:]
    assert "at exit (pools): RuntimeError('this step fails')" in result.stderr


def test_unknown_stage_is_refused_naming_the_stages():
    with pytest.raises(ValueError, match="unknown exit stage 'later'; one of pools, managers"):
        exit_order.at_exit("later", lambda: None)


def test_no_module_registers_atexit_or_calls_private_exit_functions():
    """One hook only: every exit step goes through exit_order (backends and the rest)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "exit_order.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "register" \
                    and isinstance(node.value, ast.Name) and node.value.id == "atexit":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} atexit.register")
            if isinstance(node, ast.Attribute) and node.attr in ("_exit_function", "_at_exit",
                                                                 "_end_children"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    assert not offenders, offenders


def test_a_pool_is_terminated_at_exit_after_weakrefs_finalizers_have_run():
    """The interpreter runs weakref's finalizers before fiberlite's exit stages. A job's
    sentinel must not be closed then: the pool's supervisor, woken before the stage
    "pools" terminates it, would take a closed sentinel for a job that ended and wait
    for that job (still running) for good, and the exit with it."""
    script = textwrap.dedent("""
        import threading, time, weakref
        import fiberlite as mp
        from multiprocessing.connection import wait

        def nap(started):
            started.set()
            time.sleep(60)

        if __name__ == "__main__":
            pool = mp.Pool(2)
            started = mp.Event()
            pending = pool.apply_async(nap, (started,))   # a worker busy, as at a real exit
            assert started.wait(60)
            sentinels = [p.sentinel for p in pool._pool]
            weakref.finalize._exitfunc()   # what the interpreter's exit runs first
            print("ended", len(wait(sentinels, 0)), flush=True)
            pool._core.wake()              # the supervisor looks at its jobs again:
            deadline = time.monotonic() + 2   # (a job it took for ended leaves its list)
            while len(pool._core.procs) == 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            stop = threading.Thread(target=pool.terminate, daemon=True)
            stop.start()
            stop.join(20)
            print("terminated" if not stop.is_alive() else "terminate hung", flush=True)
    """)
    result = run_python("-c", script, timeout=90, cwd=ROOT)
    assert result.stdout.split("\n")[:2] == ["ended 0", "terminated"], result.stdout + result.stderr
    assert result.returncode == 0, result.stderr
