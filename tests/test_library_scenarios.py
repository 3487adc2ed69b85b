"""docs/findings/library-scenarios.md's tables are the committed result files' (`make library-scenarios`), and
the library expectations of the graceful, pause, broker-kill (each persistence mode), failover and mixed
scenarios hold on every one of those runs (no crash run here)."""

from __future__ import annotations

import copy
import functools
import runpy
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.model import thresholds
from crashbench.model.results import Result
from crashbench.report import store

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "readme" / "library-scenarios"
LAB = runpy.run_path(str(ROOT / "lab" / "library_scenarios.py"))


@functools.cache
def _results() -> list[Result]:
    """Every committed result, read once for all the tests here (each test changes only copies' counts)."""
    return [store.load(str(path)) for path in sorted(OUT.glob("*.json"))]


def test_the_doc_s_table_is_the_result_files_table() -> None:
    doc = (ROOT / "docs" / "findings" / "library-scenarios.md").read_text()
    shown = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    assert shown == "\n".join(LAB["table"](OUT, which) for which in LAB["TABLES"])


@pytest.mark.parametrize("name", LAB["SCENARIOS"])
def test_every_library_expectation_holds_on_the_committed_runs(name: str) -> None:
    sc = scenario.load(name)
    runs = [run for result in _results() if result.scenario["name"] == name for run in result.runs]
    libraries = {run.design for run in runs}
    # Every library design the scenario lists ran, and each has expectations of its own.
    assert libraries == set(sc.run.designs) - set(LAB["BUILTIN"]) and len(libraries) == 17
    assert libraries <= set(sc.expect)
    failed = [
        (run.design, run.seed, t.rule(), res.actual)
        for run in runs
        for t in sc.expect[run.design]
        if (res := thresholds.evaluate(t, run.design, [run], None)).status != "pass"
    ]
    assert failed == []
    # Each expectation can fail: the figure it reads, moved just past its bound on a copy of the run, breaks it.
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
