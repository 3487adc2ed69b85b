"""docs/findings/clocks.md's table is what lab/clocks.py makes of the committed result files (`make clocks`),
and every expectation of the clock scenarios holds on those runs and can fail (no crash run here)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.model.results import DesignRun
from tests.expectations import assert_each_can_fail, committed_runs, failing

ROOT = Path(__file__).resolve().parent.parent
LAB = runpy.run_path(str(ROOT / "lab" / "clocks.py"))
OUT = ROOT / "results" / "readme" / "clocks"


def _runs() -> dict[str, list[DesignRun]]:
    return committed_runs(OUT)


def test_the_doc_s_table_is_the_result_files_table() -> None:
    doc = (ROOT / "docs" / "findings" / "clocks.md").read_text()
    shown = "\n".join(line for line in doc.splitlines() if line.startswith("| ") or line.startswith("|---"))
    assert shown == LAB["table"](OUT)


@pytest.mark.parametrize(
    "name", ["clock-rq-abandoned", "clock-libraries-ahead", "clock-arq-behind", "clock-server-jump"]
)
def test_every_expectation_holds_on_the_committed_runs_and_can_fail(name: str) -> None:
    sc = scenario.load(name)
    runs = _runs()[name]
    assert {run.design for run in runs} == set(sc.run.designs) <= set(sc.expect)
    assert failing(sc, runs) == []
    assert_each_can_fail(sc, runs)
