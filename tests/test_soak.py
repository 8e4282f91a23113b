"""The soak benchmark's short mode: every load runs, SIGKILLs happen, and nothing is
duplicated anywhere or lost by the pool, the pipe and the manager."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(150)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_short_soak_survives_kills_and_counts_every_item(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--seconds", "15",
                           "--kill-every", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    rows = {row["load"]: row for row in result["loads"]}
    assert set(rows) == {"pool tasks", "queue items", "pipe messages", "manager list items"}
    for row in rows.values():
        assert row["error"] is None, row
        assert row["received"] > 0 and row["duplicated"] == 0, row
    for name in ("pool tasks", "pipe messages", "manager list items"):
        assert rows[name]["lost"] == 0, rows[name]
    # a consumer killed between its get() and passing the item on loses that one item (as
    # with multiprocessing); what it had been sent ahead and not got goes back to the queue
    queue = rows["queue items"]
    assert queue["lost"] <= result["kills"].get("queue consumer", 0), (queue, result["kills"])
    assert sum(result["kills"].values()) >= 3, result["kills"]
    assert "lost" in done.stdout and "master RSS" in done.stdout
