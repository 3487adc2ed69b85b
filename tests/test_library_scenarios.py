"""docs/findings/library-scenarios.md's tables are the committed result files' (`make library-scenarios`), and
the library expectations of the graceful, pause, broker-kill (each persistence mode), failover and mixed
scenarios hold on every one of those runs (no crash run here)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.model import thresholds
from crashbench.report import store

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "readme" / "library-scenarios"
LAB = runpy.run_path(str(ROOT / "lab" / "library_scenarios.py"))


def test_the_doc_s_table_is_the_result_files_table() -> None:
    doc = (ROOT / "docs" / "findings" / "library-scenarios.md").read_text()
    shown = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    assert shown == "\n".join(LAB["table"](OUT, which) for which in LAB["TABLES"])


@pytest.mark.parametrize("name", LAB["SCENARIOS"])
def test_every_library_expectation_holds_on_the_committed_runs(name: str) -> None:
    sc = scenario.load(name)
    runs = [run for path in sorted(OUT.glob("*.json")) for run in store.load(str(path)).runs
            if store.load(str(path)).scenario["name"] == name]  # fmt: skip
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
    # Each expectation can fail: the figures it reads, changed, break it (a count off by one).
    for run in runs[:1]:
        for t in sc.expect[run.design]:
            if re.fullmatch(r"\w+ == \d+", t.rule()):
                setattr(run.counts, t.metric, getattr(run.counts, t.metric) + 1)
                assert thresholds.evaluate(t, run.design, [run], None).status == "fail"
