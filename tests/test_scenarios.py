"""The shipped scenarios, run as shipped, meet their own exact expectations: every figure a scenario
states ([expect.*]) is checked here on a real server with real faults, none is vacuous, and a run
that checks nothing would fail."""

from __future__ import annotations

import pytest

from crashbench import scenario
from crashbench.session import Options, run_designs

# Run whole here, within the suite's time budget. `make scenarios` checks every shipped scenario the
# same way (pause, graceful, long-jobs, the failovers and the persistence variants of broker-kill too);
# tests/test_failures.py and tests/test_broker.py prove the figures of those on smaller workloads.
SHIPPED = ["default", "ci", "poison", "broker-kill-none"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_scenario_meets_its_own_expectations(name: str) -> None:
    sc = scenario.load(name)
    result = run_designs(sc, list(sc.designs), Options(), kind="check")
    failing = [
        f"{t.design}: {t.threshold} (got {t.actual}, expected {t.expected})" for t in result.thresholds if not t.met
    ]
    assert failing == [] and result.problems == [], (failing, [str(p) for p in result.problems])
    # Every design of the scenario was checked, each with more than the default gates.
    assert result.status == "pass"
    assert all(run.thresholds_evaluated > 2 for run in result.runs)
