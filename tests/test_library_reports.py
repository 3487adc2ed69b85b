"""docs/findings/library-reports.md's table is lab/library_reports.py's rendering of the committed result files
(results/readme/library-reports, `make library-reports`), and each report's rule for "the claim holds" can
decide both ways: on the committed counts it gives the doc's verdict, and on a copy changed to say the
opposite (a count set the other side of the rule's bound) it gives the other. No crash runs."""

from __future__ import annotations

import copy
import importlib.util
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "readme" / "library-reports"
DOC = ROOT / "docs" / "findings" / "library-reports.md"

_spec = importlib.util.spec_from_file_location("library_reports", ROOT / "lab" / "library_reports.py")
assert _spec and _spec.loader
lab = importlib.util.module_from_spec(_spec)
sys.modules["library_reports"] = lab  # dataclasses look their module up by name
_spec.loader.exec_module(lab)


def _set(m: dict, key: str, name: str, value: float, designs: tuple[str, ...] = ()) -> None:
    """Set a count or a timing of every run of run `key` (or of `designs` only) in the measured copy m."""
    for design, run in m.get(key, {}).items():
        if designs and design not in designs:
            continue
        setattr(run.counts if hasattr(run.counts, name) else run.timings, name, value)


def _arq(m: dict, holds: bool) -> None:
    if holds:
        _set(m, "claim", "kills_mid_job", 5, ("arq",))
        _set(m, "claim", "recovery_ms_p50", math.inf, ("arq",))
        bound = float(m["claim"]["arq:reliable"].configuration.get("job_timeout_s", 0)) * 1000
        _set(m, "claim", "recovery_ms_p50", bound + 10_000, ("arq:reliable",))
    else:
        _set(m, "claim", "recovery_ms_p50", 1_000, ("arq",))


# report id -> a change of the measured copy that makes its claim hold (True) or not (False)
FLIP: dict[str, Callable[[dict, bool], None]] = {
    "celery-1628": lambda m, h: (
        _set(m, "claim", "lost", 4 if h else 0, ("celery:acks-late",)),
        _set(m, "claim", "failed", 0, ("celery:acks-late",)),
        _set(m, "claim", "stranded", 0 if h else 4, ("celery:acks-late",)),
    ),
    "kombu-337": lambda m, h: _set(m, "claim", "duplicated", 1 if h else 0, ("celery:acks-late",)),
    "celery-3501": lambda m, h: [
        _set(m, k, n, 1 if h and k == "claim" and n == "lost" else 0, ("celery",))
        for k in ("claim", "restart")
        for n in ("lost", "stranded")
    ],
    "celery-4976": lambda m, h: _set(m, "claim", "stranded", 2 if h else 0, ("celery:gevent",)),
    "celery-7950": lambda m, h: _set(m, "claim", "lost", 1 if h else 0),
    "rq-1846": lambda m, h: (_set(m, "claim", "lost", 0, ("rq",)), _set(m, "claim", "stranded", int(h), ("rq",))),
    "rq-2015": lambda m, h: (_set(m, "claim", "lost", 0, ("rq",)), _set(m, "claim", "stranded", int(h), ("rq",))),
    "dramatiq-527": lambda m, h: (
        _set(m, "claim", "delay_lateness_ms_max", 3_600_000 if h else 1_000),
        _set(m, "claim", "lost", 0),
        _set(m, "claim", "stranded", 0),
    ),
    "dramatiq-692": lambda m, h: _set(m, "claim", "duplicated_overlapping", int(h), ("dramatiq:reliable",)),
    "arq-402": _arq,
    "rq-1280": lambda m, h: _set(m, "claim", "lost_to_eviction", 3 if h else 0),
    "k8s-rollout": lambda m, h: _set(m, "claim", "deploy_lost", int(h)),
    "crash-loop": lambda m, h: _set(m, "claim", "crash_looping", int(h)),
    "huey-796": lambda m, h: _set(m, "claim", "lost", int(h), ("huey",)),
}


def _doc_table() -> str:
    page = DOC.read_text()
    return page.partition(lab.MARK_BEGIN)[2].partition(lab.MARK_END)[0].strip()


def test_the_doc_table_is_what_the_committed_result_files_give() -> None:
    table = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "library_reports.py"), "table", str(OUT)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert table == _doc_table()
    assert len(table.splitlines()) == 2 + len(lab.REPORTS)


def test_every_report_with_a_rule_has_a_flip_and_the_table_shows_the_rule() -> None:
    assert {r.id for r in lab.REPORTS if r.holds} == set(FLIP)


@pytest.mark.parametrize("report", [r for r in lab.REPORTS if r.holds], ids=lambda r: r.id)
def test_each_rule_gives_the_committed_verdict_and_fires_the_other_way_on_a_changed_copy(report) -> None:
    measured, _ = lab.load(OUT, report)
    row = next(line for line in _doc_table().splitlines() if line.startswith(f"| {report.links}:"))
    try:
        verdict = report.holds(measured)
    except KeyError:  # a run the rule reads ended without a result (or was not run): the doc says so
        assert "not decided" in row, row
        return
    assert ("**holds**" in row) == verdict
    changed = copy.deepcopy(measured)
    FLIP[report.id](changed, not verdict)
    assert report.holds(changed) is (not verdict)
    assert report.holds(measured) is verdict  # the copy, not the committed counts, was changed
