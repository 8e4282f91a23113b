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
