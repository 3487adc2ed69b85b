"""Exports (JUnit XML, Markdown, CSV) of hand-built results: pure unit tests, no server needed."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crashbench.errors import UsageError
from crashbench.model.counts import Counts, Problem
from crashbench.model.results import DesignRun, Environment, Result, ThresholdResult, Timings
from crashbench.report.export import CSV_COLUMNS, check_paths, csv_text, junit, markdown, write_exports

ENV = Environment(
    crashbench="0.1.0",
    python="3.11.9",
    redis_py="5.0.0",
    platform="Linux",
    machine="ci-box",
    cpus=4,
    server_name="valkey",
    server_version="8.1.1",
    server_binary=None,
    server_mode="embedded",
    commit=None,
    dirty=None,
)
SCENARIO = {
    "name": "lesson",
    "jobs": 100,
    "job_ms": 10.0,
    "workers": 4,
    "kills": 5,
    "signal": "SIGKILL",
    "interval": 0.5,
    "seed": 1,
}


def run(
    design: str,
    repeat: int = 0,
    lost: int = 0,
    duplicated: int = 0,
    wall_s: float = 2.0,
    p95: float | None = 120.0,
    variant: str = "",
    problems: tuple[Problem, ...] = (),
    undrained: int = 0,
) -> DesignRun:
    """A run of 100 jobs whose outcome classes add up: the lost ones are taken from done."""
    counts = Counts(
        enqueued=100,
        done=100 - lost,
        lost=lost,
        duplicated=duplicated,
        duplicated_sequential=duplicated,
        extra_executions=duplicated,
        redelivered=3,
        kills=5,
        kills_mid_job=5,
        undrained=undrained,
    )
    timings = Timings(
        wall_s=wall_s,
        jobs_per_s=(100 - lost) / wall_s,
        ideal_s=0.25,
        drained=undrained == 0,
        drain_s=0.5,
        window_s=30.0,
        startup_ms_median=40.0,
        startup_ms_max=55.0,
        restart_ms_median=42.0,
        recovery_ms_p50=100.0 if p95 is not None else None,
        recovery_ms_p95=p95,
        recovery_ms_max=p95,
    )
    return DesignRun(
        design=design,
        variant=variant,
        prefix=f"cb:{design}:{repeat}",
        seed=1 + repeat,
        counts=counts,
        timings=timings,
        kills=[],
        repeat=repeat,
        problems=list(problems),
    )


def result(runs: list[DesignRun], thresholds: list[ThresholdResult], repeat: int = 1) -> Result:
    return Result(
        id="20250101-120000-abcd",
        kind="run",
        created="2025-01-01T12:00:00+0100",
        scenario=SCENARIO,
        fingerprint="f00d",
        runs=runs,
        environment=ENV,
        repeat=repeat,
        thresholds=thresholds,
    )


def threshold(
    design: str, text: str, status: str, actual: float | None, expected: float | None, **kw
) -> ThresholdResult:
    return ThresholdResult(
        design=design, threshold=text, source="scenario", status=status, actual=actual, expected=expected, **kw
    )


@pytest.fixture
def repeated() -> Result:
    """Two designs, three repeats each: naive loses jobs (a failed threshold), reliable passes one
    threshold and cannot be judged on another (no recovery time in any run)."""
    runs = [run("naive", repeat=i, lost=lost, wall_s=2.0 + i) for i, lost in enumerate((4, 0, 2))]
    runs += [run("reliable", repeat=i, duplicated=i, wall_s=3.0, p95=None) for i in range(3)]
    thresholds = [
        threshold("naive", "lost == 0", "fail", 4, 0, values=[4, 0, 2], note="run with seed 1"),
        threshold("reliable", "lost == 0", "pass", 0, 0, values=[0, 0, 0], note="all 3 runs"),
        threshold(
            "reliable", "recovery_p95 < 2000", "inconclusive", None, None, unit="ms", values=[None, None, None],
            note="no recovery_p95 value",
        ),
    ]  # fmt: skip
    return result(runs, thresholds, repeat=3)


def parse_junit(text: str) -> ET.Element:
    assert text.startswith("<?xml version='1.0' encoding='UTF-8'?>")
    return ET.fromstring(text.encode("utf-8"))


def outcome(case: ET.Element) -> str:
    kids = [c.tag for c in case]
    assert len(kids) <= 1, kids
    return kids[0] if kids else "pass"


# --- JUnit ----------------------------------------------------------------------------------------


def test_junit_totals_match_the_testcases(repeated: Result) -> None:
    root = parse_junit(junit(repeated))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["naive", "reliable"]
    for suite in suites:
        cases = suite.findall("testcase")
        assert suite.get("tests") == str(len(cases))
        assert suite.get("failures") == str(sum(outcome(c) == "failure" for c in cases))
        assert suite.get("errors") == str(sum(outcome(c) == "error" for c in cases))
        assert suite.get("skipped") == "0"
        assert suite.get("hostname") == "ci-box"
        assert suite.get("timestamp") == "2025-01-01T12:00:00"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    naive, reliable = suites
    assert [(c.get("classname"), c.get("name"), outcome(c)) for c in naive.findall("testcase")] == [
        ("crashbench.naive", "lost == 0", "failure")
    ]
    assert [(c.get("name"), outcome(c)) for c in reliable.findall("testcase")] == [
        ("lost == 0", "pass"),
        ("recovery_p95 < 2000", "error"),
    ]
    # time: the sum of the design's wall times (2 + 3 + 4 s; 3 x 3 s)
    assert naive.get("time") == "9.000" and reliable.get("time") == "9.000"
    assert naive.find("testcase").get("time") == "9.000"  # type: ignore[union-attr]
    assert root.get("time") == "18.000"


def test_junit_failure_gives_values_and_counts_per_run(repeated: Result) -> None:
    root = parse_junit(junit(repeated))
    failure = root.find("testsuite[@name='naive']/testcase/failure")
    assert failure is not None
    assert failure.get("type") == "threshold"
    assert "got 4, expected 0" in failure.get("message", "")
    text = failure.text or ""
    assert "per run: 4, 0, 2" in text
    assert "run with seed 1" in text
    assert (
        "repeat 0 (seed 1): enqueued 100, done 96, lost 4, stranded 0, failed 0, dead_lettered 0, duplicated 0" in text
    )
    assert "repeat 1 (seed 2): enqueued 100, done 100, lost 0" in text
    assert "repeat 2 (seed 3): enqueued 100, done 98, lost 2" in text
    error = root.find("testsuite[@name='reliable']/testcase/error")
    assert error is not None
    assert error.get("type") == "inconclusive"
    assert "no recovery_p95 value" in error.get("message", "")


def test_junit_properties(repeated: Result) -> None:
    root = parse_junit(junit(repeated))
    props = {p.get("name"): p.get("value") for p in root.findall("testsuite[@name='reliable']/properties/property")}
    assert props["scenario"] == "lesson"
    assert props["fingerprint"] == "f00d"
    assert props["seeds"] == "1,2,3"
    assert props["result_id"] == "20250101-120000-abcd"
    assert props["crashbench_version"] == "0.1.0"
    assert props["server_version"] == "8.1.1"


LOST_TWICE = Problem("ledger_vs_queue", "the queue acked 2 jobs the ledger never saw complete", ["j7", "j9"])


def test_junit_a_design_without_thresholds_fails_unless_allowed() -> None:
    res = result([run("good"), run("mine")], [threshold("good", "lost == 0", "pass", 0, 0)])
    assert res.status == "unchecked"
    root = parse_junit(junit(res))
    cases = {c.get("classname"): c for c in root.iter("testcase")}
    assert (cases["crashbench.mine"].get("name"), outcome(cases["crashbench.mine"])) == (
        "no threshold applied",
        "failure",
    )
    assert cases["crashbench.mine"].find("failure").get("type") == "unchecked"  # type: ignore[union-attr]
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("2", "1", "0")
    allowed = parse_junit(junit(res, allow_unchecked=True))
    mine = allowed.find("testsuite[@name='mine']/testcase")
    assert mine is not None and outcome(mine) == "skipped"
    assert (allowed.get("tests"), allowed.get("failures"), allowed.get("skipped")) == ("2", "0", "1")
    props = {p.get("name"): p.get("value") for p in root.findall("testsuite[@name='good']/properties/property")}
    assert props["thresholds_evaluated"] == "1"


def test_junit_evidence_problems_are_errors_with_every_id() -> None:
    many = Problem("unexpected_ids", "12 ids completed that were never enqueued", [f"x{i}" for i in range(12)])
    res = result([run("bad", problems=(LOST_TWICE, many))], [threshold("bad", "lost == 0", "pass", 0, 0)])
    assert res.status == "broken"
    root = parse_junit(junit(res))
    cases = root.findall("testsuite/testcase")
    assert [(c.get("name"), outcome(c)) for c in cases] == [
        ("lost == 0", "pass"),
        ("evidence: ledger_vs_queue", "error"),
        ("evidence: unexpected_ids", "error"),
    ]
    error = cases[1].find("error")
    assert error is not None and error.get("type") == "evidence"
    assert "the queue acked 2 jobs" in error.get("message", "")
    assert "ids (2): j7, j9" in (error.text or "")
    assert "x11" in (cases[2].find("error").text or "")  # type: ignore[union-attr]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "0", "2")


def test_an_undrained_run_no_longer_makes_a_result_inconclusive_by_itself() -> None:
    # The default threshold undrained == 0 (crashbench.model.thresholds) judges it now; a result whose
    # thresholds all passed is a pass, and JUnit adds no testcase of its own for it.
    res = result([run("slow", undrained=3)], [threshold("slow", "lost == 0", "pass", 0, 0)])
    assert res.status == "pass"
    root = parse_junit(junit(res))
    assert [c.get("name") for c in root.iter("testcase")] == ["lost == 0"]


@pytest.mark.parametrize(
    ("runs", "statuses", "expected"),
    [
        ([run("a", problems=(LOST_TWICE,)), run("b")], {"a": "fail", "b": "inconclusive"}, "broken"),
        ([run("a"), run("b")], {"a": "fail", "b": "inconclusive"}, "fail"),
        ([run("a"), run("b"), run("c")], {"a": "pass", "b": "inconclusive"}, "inconclusive"),
        ([run("a"), run("b")], {"a": "pass"}, "unchecked"),
        ([run("a"), run("b")], {"a": "pass", "b": "pass"}, "pass"),
        ([run("a", undrained=2)], {"a": "pass"}, "pass"),
    ],
)
def test_status_precedence(runs: list[DesignRun], statuses: dict[str, str], expected: str) -> None:
    res = result(runs, [threshold(d, "lost == 0", st, 0, 0) for d, st in statuses.items()])
    assert res.status == expected


# --- Markdown -------------------------------------------------------------------------------------


def test_markdown_heading_table_and_thresholds(repeated: Result) -> None:
    md = markdown(repeated)
    lines = md.splitlines()
    assert lines[0] == "## ❌ crashbench run: fail"
    assert "lesson: 100 jobs × 10 ms, 4 workers, 5 × SIGKILL every 0.5 s, seed 1, 3 repeats" in lines
    assert "| | naive | reliable |" in lines
    assert "|---|---:|---:|" in lines
    assert "| lost | 2 (0–4) | 0 |" in lines
    assert "| duplicated | 0 | 1 (0–2) |" in lines
    assert "| dead-lettered | 0 | 0 |" in lines
    assert "| redelivered | 3 | 3 |" in lines
    # naive: 96/2, 100/3, 98/4 jobs/s; reliable: 100/3 in every run; no recovery time for reliable
    assert "| jobs/s | 33 (24–48) | 33 |" in lines
    assert "| recovery p95 (ms) | 120 | - |" in lines
    assert "- ❌ `naive` lost == 0: got 4, expected 0; run with seed 1" in lines
    assert "- ✅ `reliable` lost == 0: got 0, expected 0; all 3 runs" in lines
    assert "- ⚠️ `reliable` recovery_p95 < 2000: got -, expected -; no recovery_p95 value" in lines
    assert "- `naive`: 1 threshold, 1 violated" in lines
    assert "- `reliable`: 2 thresholds, 1 inconclusive" in lines


def test_markdown_evidence_problems_show_their_ids_capped_and_unchecked_designs() -> None:
    many = Problem("unexpected_ids", "12 ids never enqueued", [f"x{i}" for i in range(12)])
    res = result([run("bad", problems=(LOST_TWICE, many)), run("mine")], [threshold("bad", "lost == 0", "pass", 0, 0)])
    md = markdown(res)
    lines = md.splitlines()
    assert lines[0] == "## 🛑 crashbench run: broken"
    assert (
        "- 🛑 `bad` (seed 1) `ledger_vs_queue`: the queue acked 2 jobs the ledger never saw complete (ids: `j7`, `j9`)"
        in lines
    )
    shown = ", ".join(f"`x{i}`" for i in range(10))
    assert f"- 🛑 `bad` (seed 1) `unexpected_ids`: 12 ids never enqueued (ids: {shown}, …)" in lines
    assert "`x10`" not in md
    assert "- `mine`: no threshold applied" in lines
    assert "- `bad`: 1 threshold, all met" in lines


def test_markdown_pass_status_baseline_and_escaped_pipes() -> None:
    res = result(
        [run("piped", variant="a|b")],
        [threshold("a|b", "jobs_per_s >= -10%", "pass", 50, 45, unit="jobs/s", baseline=50)],
    )
    md = markdown(res)
    assert md.startswith("## ✅ crashbench run: pass\n")
    assert "| | a\\|b |" in md.splitlines()
    assert "got 50 jobs/s, expected 45 jobs/s (baseline 50 jobs/s)" in md
    assert "repeats" not in md  # a single run has no spread to explain


# --- CSV ------------------------------------------------------------------------------------------


def test_csv_one_row_per_run(repeated: Result) -> None:
    reader = csv.DictReader(io.StringIO(csv_text(repeated)))
    counts = [f.name for f in dataclasses.fields(Counts) if f.name != "stranded_at"]
    timings = [f.name for f in dataclasses.fields(Timings)]
    assert reader.fieldnames == ["result_id", "design", "variant", "repeat", "seed", *counts, *timings]
    assert list(CSV_COLUMNS) == reader.fieldnames
    rows = list(reader)
    assert len(rows) == 6
    assert [(r["design"], r["repeat"], r["seed"]) for r in rows] == [
        ("naive", "0", "1"), ("naive", "1", "2"), ("naive", "2", "3"),
        ("reliable", "0", "1"), ("reliable", "1", "2"), ("reliable", "2", "3"),
    ]  # fmt: skip
    assert {r["result_id"] for r in rows} == {"20250101-120000-abcd"}
    assert [int(r["lost"]) for r in rows] == [4, 0, 2, 0, 0, 0]
    assert [int(r["done"]) for r in rows] == [96, 100, 98, 100, 100, 100]
    assert [int(r["duplicated"]) for r in rows[3:]] == [0, 1, 2]
    assert [float(r["wall_s"]) for r in rows] == [2.0, 3.0, 4.0, 3.0, 3.0, 3.0]
    assert rows[0]["recovery_ms_p95"] == "120.0" and rows[3]["recovery_ms_p95"] == ""
    assert rows[0]["drained"] == "True"
    assert "stranded_at" not in rows[0]


# --- check_paths ----------------------------------------------------------------------------------


def test_check_paths_rejects_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        check_paths([None, tmp_path])


def test_check_paths_rejects_a_missing_parent(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist") as info:
        check_paths([tmp_path / "nope" / "junit.xml"])
    assert str(tmp_path / "nope") in info.value.message
    assert not (tmp_path / "nope").exists()


def test_check_paths_accepts_writable_paths_and_leaves_them_as_they_were(tmp_path: Path) -> None:
    new = tmp_path / "junit.xml"
    existing = tmp_path / "summary.md"
    existing.write_text("keep me\n")
    check_paths([new, None, existing])
    assert not new.exists()
    assert existing.read_text() == "keep me\n"


def test_check_paths_rejects_an_unwritable_directory() -> None:
    """Root can write anywhere: as root, the check runs in a child that has given up root for nobody's
    uid, so that CI (root) runs it too."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)  # nobody may enter it
        locked = Path(d, "locked")
        locked.mkdir()
        locked.chmod(0o555)
        if os.geteuid() != 0:
            with pytest.raises(UsageError, match="not writable"):
                check_paths([locked / "out.csv"])
            return
        pid = os.fork()
        if pid == 0:  # the child: nobody, then the check; its exit code says what happened
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                check_paths([locked / "out.csv"])
                code = 1  # accepted: the check is broken
            except UsageError as exc:
                code = 0 if "not writable" in exc.message else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


# --- write_exports --------------------------------------------------------------------------------


def test_write_exports_writes_files_and_appends_to_the_step_summary(repeated: Result, tmp_path: Path) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    junit_path, csv_path = tmp_path / "junit.xml", tmp_path / "runs.csv"
    written = write_exports(repeated, junit_path, None, csv_path, environ={"GITHUB_STEP_SUMMARY": str(summary)})
    assert written == [junit_path, csv_path, summary]
    assert parse_junit(junit_path.read_text(encoding="utf-8")).get("failures") == "1"
    assert len(list(csv.DictReader(io.StringIO(csv_path.read_text(encoding="utf-8"))))) == 6
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n## ❌ crashbench run: fail\n")
    assert "| lost | 2 (0–4) | 0 |" in text


def test_write_exports_without_step_summary(repeated: Result, tmp_path: Path) -> None:
    md_path = tmp_path / "summary.md"
    assert write_exports(repeated, None, md_path, None, environ={}) == [md_path]
    assert md_path.read_text(encoding="utf-8") == markdown(repeated)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]


def test_the_table_names_library_settings_warnings_disagreements_and_an_undrained_backlog() -> None:
    from rich.console import Console

    from crashbench.report.render import result_table

    lib = run("arq:reliable", undrained=40)
    lib.timings.cut_off = True
    lib.configuration = {"concurrency": 6, "job_timeout_s": 1.0}
    lib.warnings = ["arq:reliable: job_timeout 1 s is not above the longest job (3 s): arq cancels a job"]
    lib.counts.library_disagrees = 2
    lib.jobs = {"library_disagrees": ["000003", "000007"]}
    stuck = run("rq", undrained=5)
    shown = result([lib, stuck], [])
    shown.scenario = {**SCENARIO, "kill_when": "mid-job", "signal": "SIGKILL"}
    console = Console(width=200, record=True)
    console.print(result_table(shown))
    text = console.export_text()
    assert "arq:reliable: library settings: concurrency 6, job_timeout_s 1" in text
    assert "! arq:reliable: job_timeout 1 s is not above the longest job (3 s)" in text
    assert "2 jobs the library recorded otherwise than the ledger" in text and "000003, 000007" in text
    assert "arq:reliable: 40 jobs undrained: the drain stopped at its bound (300 s after the last fault)" in text
    # The words say the table's numbers (stranded 0, undrained 5), never "stranded" for an undrained backlog.
    assert "rq: the queue made no progress for 30 s (the window) with jobs still in it: 0 stranded, 5 undrained" in text
    assert "arq:reliable: the queue made no progress" not in text  # a cut-off drain is still progressing


def test_a_fault_family_s_counts_are_rows_of_both_tables_when_some_run_has_them() -> None:
    """Each family's rows (FaultFamily.rows) follow the core's in the terminal and the HTML tables, shown
    only when some run's count is not zero; a lost one is an alarm. (Before, a rollout's or an eviction's
    counts were in the result and the checks, and in neither table.)"""
    from rich.console import Console

    from crashbench.faults import registry
    from crashbench.report import tables
    from crashbench.report.render import result_table

    def whole(runs: list[DesignRun]) -> Result:
        return dataclasses.replace(result(runs, []), scenario={**SCENARIO, "kill_when": "mid-job"})

    plain, hit = run("naive"), run("reliable")
    hit.counts.rollouts, hit.counts.deploy_lost, hit.counts.lost_to_eviction = 1, 2, 3
    labels = {key: label for family in registry.FAMILIES for label, key, _ in family.rows}
    assert {"rollouts", "deploy_lost", "lost_to_eviction", "evicted_keys"} <= labels.keys()
    for runs, expected in (([plain], set()), ([plain, hit], {"rollouts", "deploy_lost", "lost_to_eviction"})):
        console = Console(width=200, record=True)
        console.print(result_table(whole(runs), plain=True))
        text, page = console.export_text(), tables.counts(whole(runs))
        for key, label in labels.items():
            assert (f"| {label} " in text) == (key in expected), (key, text)
            assert (f'data-count="{key}"' in page) == (key in expected), key
    assert 'class="alarm" data-run="1" data-count="deploy_lost"' in tables.counts(whole([plain, hit]))


def test_dozens_of_workers_that_ended_on_their_own_are_named_five_then_counted() -> None:
    """RQ's workers exit whenever the server is down (a broker kill: ~60 of them); the table names five
    and counts the rest by how they ended, instead of one line each."""
    from rich.console import Console

    from crashbench.model.faults import WorkerExit
    from crashbench.report.render import result_table

    r = run("rq")
    r.worker_exits = [WorkerExit(f"w{i}", "exit code 1" if i % 3 else "signal SIGSEGV", "") for i in range(12)]
    console = Console(width=200, record=True)
    console.print(result_table(dataclasses.replace(result([r], []), scenario={**SCENARIO, "kill_when": "any"})))
    text = console.export_text()
    assert [f"w{i}" for i in range(12) if f"worker w{i} ended" in text] == ["w0", "w1", "w2", "w3", "w4"]
    assert "7 more workers ended on their own (5 exit code 1, 2 signal SIGSEGV; all in the JSON)" in text
