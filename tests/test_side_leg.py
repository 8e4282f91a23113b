"""The legs (:mod:`side_leg`): in a whole run, the cluster tests and the benchmark
scripts' runs (the side leg), and a share of the suite's own files (the share leg), go to
pytests of their own, started when the suite is collected, and these tests wait for
them. Every test sent to a leg must pass or be skipped by its own condition: none may be
missing from its count."""
from __future__ import annotations

import re
import pytest

import side_leg
import side_run


@pytest.mark.timeout(side_leg.RUN_SECONDS + 60)
@pytest.mark.parametrize("name", side_leg.LEGS)
def test_the_leg_passes(name):
    leg = side_leg.started(name)
    if leg is None:
        pytest.skip(f"no test of the {name} leg is selected with this test: they run in this "
                    "pytest, if selected")
    if not side_run.wait_for(leg.process, side_leg.RUN_SECONDS, f"{name} leg"):
        pytest.fail(f"the {name} leg did not finish within {side_leg.RUN_SECONDS} s:\n{leg.output()[-8000:]}")
    output = leg.output()
    summary = output.rstrip().splitlines()[-1] if output.strip() else ""
    assert leg.process.returncode == 0, f"the {name} leg failed:\n{output[-12000:]}"
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|skipped)\b", summary)}
    ran = counts.get("passed", 0) + counts.get("skipped", 0)
    assert ran == len(leg.ids), (f"the {name} leg was sent {len(leg.ids)} tests and reports {ran} "
                                 f"passed or skipped:\n{output[-6000:]}")
    print(f"{name} leg: {summary}")
