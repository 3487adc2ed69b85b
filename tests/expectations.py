"""A scenario's expectations against committed runs: each holds on every run, and each can fail (the figure
it reads, moved just past its bound on a copy of a run, breaks it), so none restates what it reads."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path

from crashbench.model import thresholds
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.report import store


@functools.cache
def committed_runs(directory: Path) -> dict[str, list[DesignRun]]:
    """The runs of a directory's committed result files, by scenario name (read once per test process)."""
    out: dict[str, list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        out.setdefault(str(result.scenario["name"]), []).extend(result.runs)
    return out


def failing(sc: Scenario, runs: Sequence[DesignRun]) -> list[tuple[str, int, str, object]]:
    """The (design, seed, rule, value) of every expectation a run does not meet."""
    return [
        (run.design, run.seed, t.rule(), res.actual)
        for run in runs
        for t in sc.expect[run.design]
        if (res := thresholds.evaluate(t, run.design, [run], None)).status != "pass"
    ]


def assert_each_can_fail(sc: Scenario, runs: Sequence[DesignRun]) -> None:
    """On a copy of each design's first run, every expectation's figure moved just past its bound fails it."""
    first = {run.design: run for run in reversed(runs)}
    for design, run in first.items():
        for t in sc.expect[design]:
            metric, op, bound = t.rule().split(" ", 2)
            bad = copy.deepcopy(run)
            target = int(bound) if bound.isdigit() else getattr(run.counts, bound)
            moved = {"==": target + 1, "<=": target + 1, ">=": target - 1, ">": target, "<": target}[op]
            if moved < 0:
                continue  # ">= 0"-like bounds are not written (tests/test_thresholds.py refuses them)
            setattr(bad.counts, metric, moved)
            assert thresholds.evaluate(t, design, [bad], None).status == "fail", (design, t.rule())
