"""The shipped scenarios, run as shipped, meet their own exact expectations: every figure a scenario
states ([expect.*]) is checked here on a real server with real faults, none is vacuous, and a run
that checks nothing would fail."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from crashbench import scenario
from crashbench.cli import cli
from crashbench.errors import ExitCode
from crashbench.report import recount
from crashbench.run.session import BUILTIN_ORDER, Options, run_designs

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

# Run whole here, within the suite's time budget. `make scenarios` checks every shipped scenario the
# same way (pause, graceful, long-jobs, the failovers and the persistence variants of broker-kill too);
# tests/test_failures.py and tests/test_broker.py prove the figures of those on smaller workloads.
SHIPPED = ["default", "ci", "poison", "broker-kill-none"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_scenario_meets_its_own_expectations(name: str, tmp_path: Path) -> None:
    sc = scenario.load(name)
    # Its built-in designs: the libraries' expectations (broker-kill-none lists every library too) are
    # checked against their committed runs by tests/test_library_scenarios.py, and whole by `make scenarios`.
    result = run_designs(sc, [d for d in sc.run.designs if d in BUILTIN_ORDER], Options(), kind="check")
    failing = [
        f"{t.design}: {t.threshold} (got {t.actual}, expected {t.expected})" for t in result.thresholds if not t.met
    ]
    assert failing == [] and result.problems == [], (failing, [str(p) for p in result.problems])
    # Every design of the scenario was checked, each with more than the default gates.
    assert result.status == "pass"
    assert all(run.thresholds_evaluated > 2 for run in result.runs)

    # The saved timeline alone gives every count, timing and id again (crashbench recount).
    saved = result.write(tmp_path)
    again = recount.recount(*recount.load(str(saved)))
    assert [r.differences for r in again] == [[] for _ in result.runs]
    if name == "default":
        # crashbench's own worker records each ack once it returned, after the handler's end.
        for run in result.runs:
            assert run.timeline is not None
            done = [ex for ex in run.timeline.executions if ex.completed]
            assert len(done) >= run.counts.done and all(ex.acked is not None and ex.acked >= ex.end for ex in done)
        _the_saved_result_is_drawn(saved, [r.design for r in result.runs])
        _a_missing_or_unreadable_timeline_is_a_usage_error(saved, tmp_path)
        _a_changed_timeline_is_not_reproduced(saved)


def _the_saved_result_is_drawn(saved: Path, designs: list[str]) -> None:
    """`crashbench report` writes the HTML beside the result, one section per run; `show --markdown
    --html` links the report from the summary and writes the queue-depth chart beside it."""
    out = CliRunner().invoke(cli, ["report", str(saved)])
    assert out.exit_code == ExitCode.OK, out.output
    page = saved.with_suffix(".html").read_text()
    assert [d for d in designs if f'<section class="run" data-design="{d}"' in page] == designs
    md, html = saved.parent / "summary.md", saved.parent / "drawn" / "report.html"
    html.parent.mkdir()
    out = CliRunner().invoke(cli, ["show", str(saved), "--markdown", str(md), "--html", str(html), "--plain"])
    assert out.exit_code == ExitCode.OK, out.output
    text = md.read_text()
    assert "](drawn/report.html)" in text and "![queue depth" in text and "](summary.depth.svg)" in text
    assert (saved.parent / "summary.depth.svg").read_text().startswith("<svg") and html.stat().st_size > 10_000


def _a_missing_or_unreadable_timeline_is_a_usage_error(saved: Path, tmp_path: Path) -> None:
    """recount and report refuse, exit 2, a result that names no timeline, one whose file is not a
    timeline, and one whose file holds other runs; --html refuses a result without timelines."""
    timeline = saved.with_name(saved.stem + ".timeline.jsonl.gz")
    data = json.loads(saved.read_text())
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "none.json").write_text(json.dumps({**data, "timeline": None}))
    (cases / "bad.json").write_text(json.dumps({**data, "timeline": "bad.jsonl.gz"}))
    (cases / "bad.jsonl.gz").write_bytes(b"not gzip")
    with gzip.open(timeline, "rt") as f:
        lines = f.read().splitlines()
    second = [i for i, line in enumerate(lines) if line.startswith('{"e":"run"')][1]
    with gzip.open(cases / "one.jsonl.gz", "wt") as f:
        f.write("\n".join(lines[:second]) + "\n")  # the first run's timeline only
    (cases / "one.json").write_text(json.dumps({**data, "timeline": "one.jsonl.gz"}))
    for name, says in (("none", "names no timeline file"), ("bad", "not a readable crashbench timeline"),
                       ("one", "holds runs")):  # fmt: skip
        out = CliRunner().invoke(cli, ["recount", str(cases / f"{name}.json")])
        assert out.exit_code == ExitCode.USAGE and says in out.output, (name, out.output)
    out = CliRunner().invoke(cli, ["show", str(cases / "none.json"), "--html", str(cases / "x.html"), "--plain"])
    assert out.exit_code == ExitCode.USAGE and "no timeline to draw" in out.output, out.output


def _a_changed_timeline_is_not_reproduced(saved: Path) -> None:
    """The recount fires: one completed execution of the reliable run dropped from the saved timeline
    makes its job not done (and lost or stranded), and `crashbench recount` exits 4 naming the counts."""
    path = saved.with_name(saved.stem + ".timeline.jsonl.gz")
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    events = [json.loads(line) for line in lines]
    starts = [i for i, e in enumerate(events) if e["e"] == "run"]
    reliable = range(starts[1], starts[2])
    done = Counter(events[i]["j"] for i in reliable if events[i]["e"] == "x" and events[i]["d"] is not None)
    drop = next(i for i in reliable if events[i]["e"] == "x" and done[events[i]["j"]] == 1 and not events[i]["f"])
    del lines[drop]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = CliRunner().invoke(cli, ["recount", str(saved)])
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert "run 0 naive: reproduced" in out.output and "run 2 stream: reproduced" in out.output
    assert "counts.done: saved 2000, recounted 1999" in out.output
