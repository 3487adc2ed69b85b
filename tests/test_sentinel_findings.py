"""docs/findings/sentinel.md's three tables are what lab/sentinel_promotion.py makes of the committed result
files (`make sentinel`, `make sentinel-partition`, `make sentinel-libraries`), and every built-in design's
expectation of the sentinel scenarios holds on those runs and can fail (no crash run here; the libraries'
are checked in tests/test_sentinel_libraries.py)."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.model.results import DesignRun
from crashbench.report import store
from tests.expectations import assert_each_can_fail, failing

ROOT = Path(__file__).resolve().parent.parent
LAB = runpy.run_path(str(ROOT / "lab" / "sentinel_promotion.py"))
OUT = ROOT / "results" / "readme"
TABLES = (("table", "sentinel"), ("split_table", "sentinel-partition"), ("library_table", "sentinel-libraries"))


@functools.cache
def _runs(directory: str) -> dict[str, list[DesignRun]]:
    """The committed runs of a results directory, by scenario name (read once for the tests here)."""
    out: dict[str, list[DesignRun]] = {}
    for path in sorted((OUT / directory).glob("*.json")):
        result = store.load(str(path))
        out.setdefault(str(result.scenario["name"]), []).extend(result.runs)
    return out


def test_the_doc_s_tables_are_the_result_files_tables() -> None:
    doc = (ROOT / "docs" / "findings" / "sentinel.md").read_text()
    shown = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    assert shown == "\n".join(LAB[name](OUT / directory) for name, directory in TABLES)


def test_every_promotion_is_the_sentinels_own_and_none_came_without_the_quorum() -> None:
    """A sentinel's decision takes its 1 s down-after at least; with the quorum lost, nothing was promoted
    before the killed sentinels were back (the record's own times, beside the count)."""
    runs = _runs("sentinel")
    everything = [run for rs in runs.values() for run in rs]
    assert len(everything) == 27 and all(1.0 <= LAB["promotion_s"](run) < 30 for run in everything)
    for run in runs["sentinel-quorum"]:
        bf = run.broker_fault
        assert bf is not None and bf.back_at is not None and bf.quorum_back_at is not None
        assert bf.back_at > bf.quorum_back_at and run.counts.promoted_without_quorum == 0


@pytest.mark.parametrize(
    ("directory", "name"),
    [("sentinel", "sentinel-kill"), ("sentinel", "sentinel-quorum"), ("sentinel", "sentinel-midjob"),
     ("sentinel-partition", "sentinel-partition"), ("sentinel-partition", "sentinel-partition-min-replicas")],
)  # fmt: skip
def test_every_expectation_holds_on_the_committed_runs_and_can_fail(directory: str, name: str) -> None:
    sc = scenario.load(name)
    runs = _runs(directory)[name]
    assert {run.design for run in runs} == set(sc.run.designs) <= set(sc.expect)
    assert failing(sc, runs) == []
    assert_each_can_fail(sc, runs)
