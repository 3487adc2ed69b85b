"""docs/findings/library-scenarios.md's tables are the committed result files' (`make library-scenarios`), and
the library expectations of the graceful, pause, broker-kill (each persistence mode), failover and mixed
scenarios hold on every one of those runs (no crash run here)."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.model.results import Result
from crashbench.report import store
from tests.expectations import assert_each_can_fail, failing

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
    assert failing(sc, runs) == []
    assert_each_can_fail(sc, runs)
