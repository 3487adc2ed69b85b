"""The CI regression job: repeats, the results store, thresholds and baselines, exit codes, exports,
replay. One real run (two designs, two repeats) is saved once; most cases then check it from the store."""

from __future__ import annotations

import csv
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crashbench.errors import ExitCode
from crashbench.model.counts import Problem
from crashbench.model.results import DesignRun, summarize
from crashbench.model.spec import Scenario
from crashbench.run.session import evaluate
from tests.test_cli import SMALL, assert_clean_error, crashbench, crashbench_here
from tests.test_export import SCENARIO, result, run


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results store holding one compare of naive and reliable, 2 kills, repeated twice."""
    store = tmp_path_factory.mktemp("results")
    cp = crashbench(
        "compare", "--designs", "naive,reliable", "--kills", "2", "--repeat", "2", "--seed", "7", *SMALL,
        "--out", str(store), "--plain", tmp_path=store,
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr + cp.stdout
    return store


def saved(store: Path) -> dict:
    (path,) = store.glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_repeat_keeps_every_run_with_its_seed_and_schedule_and_shows_the_spread(store: Path) -> None:
    data = saved(store)
    runs = data["runs"]
    assert [(r["design"], r["repeat"], r["seed"]) for r in runs] == [
        ("naive", 0, 7), ("reliable", 0, 7), ("naive", 1, 8), ("reliable", 1, 8),
    ]  # fmt: skip
    # The same seed gives both designs the same schedule; the next seed another one.
    assert runs[0]["schedule"] == runs[1]["schedule"] != runs[2]["schedule"]
    assert data["repeat"] == 2 and data["fingerprint"] and data["environment"]["machine"]
    # min / median / max of every count and timing, per design, over the repeats.
    summary = {s["design"]: s for s in data["summary"]}
    walls = sorted(r["timings"]["wall_s"] for r in runs if r["design"] == "reliable")
    assert summary["reliable"]["timings"]["wall_s"] == {
        "min": walls[0], "median": round(sum(walls) / 2, 4), "max": walls[1], "n": 2,
    }  # fmt: skip
    assert summary["reliable"]["counts"]["lost"] == {"min": 0, "median": 0, "max": 0, "n": 2}
    # naive's scenario threshold (lost == kills_mid_job) held in each run; its values are listed per run.
    naive = next(t for t in data["thresholds"] if t["design"] == "naive" and t["threshold"].startswith("lost"))
    assert naive["status"] == "pass" and naive["values"] == [
        r["counts"]["lost"] for r in runs if r["design"] == "naive"
    ]


@pytest.mark.slow
def test_results_lists_and_show_renders_a_saved_result(store: Path, tmp_path: Path) -> None:
    rid = saved(store)["id"]
    cp = crashbench_here("results", "--dir", str(store), "--design", "reliable", tmp_path=tmp_path)
    assert cp.returncode == 0 and rid in cp.stdout and "pass" in cp.stdout
    cp = crashbench_here("results", "--dir", str(store), "--scenario", "other", tmp_path=tmp_path)
    assert rid not in cp.stdout
    cp = crashbench_here("show", rid[:17], "--dir", str(store), "--plain", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    # Whitespace folded: where a line breaks depends on the width and the measured figures.
    text = " ".join(cp.stdout.split())
    assert "2 repeats" in text and "+--" in text and "✓ reliable: lost == 0" in text
    assert_clean_error(crashbench_here("show", "nope", "--dir", str(store), tmp_path=tmp_path), 2, "no result 'nope'")


@pytest.mark.parametrize(
    ("rules", "code", "line"),
    [
        (["lost<=10"], ExitCode.OK, "✓ naive: lost <= 10"),
        (["reliable: duplicated<=0", "lost=0"], ExitCode.THRESHOLD_VIOLATED, "✗ naive: lost == 0"),
        # naive never recovers the job a kill interrupts: an infinite recovery time, so a violation
        (["naive: recovery_p95<2s"], ExitCode.THRESHOLD_VIOLATED, "✗ naive: recovery_p95 < 2000ms"),
    ],
)
def test_check_exit_code_follows_the_thresholds(
    store: Path, tmp_path: Path, rules: list[str], code: int, line: str
) -> None:
    args = [a for rule in rules for a in ("-t", rule)]
    cp = crashbench_here("check", "--results", "latest", "--dir", str(store), *args, "--plain", tmp_path=tmp_path)
    assert cp.returncode == code, cp.stderr + cp.stdout
    assert line in cp.stdout


def test_baseline_relative_thresholds(store: Path, tmp_path: Path) -> None:
    base = ["--results", "latest", "--baseline", "latest", "--dir", str(store), "--plain"]
    cp = crashbench_here("check", *base, "-t", "jobs_per_s>=-10%", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stdout
    assert "baseline" in cp.stdout
    cp = crashbench_here("check", *base, "-t", "reliable: jobs_per_s>=+50%", tmp_path=tmp_path)
    assert cp.returncode == ExitCode.THRESHOLD_VIOLATED, cp.stdout


def test_bad_thresholds_and_export_paths_fail_before_any_run(tmp_path: Path) -> None:
    nowhere = ["--server", "/nonexistent/redis-server"]  # had a run started: exit 3, not 2
    assert_clean_error(
        crashbench_here("check", "-t", "lots=0", *nowhere, tmp_path=tmp_path), 2, "unknown metric 'lots'"
    )
    cp = crashbench_here("check", "-t", "jobs_per_s>=-10%", *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "needs a baseline")
    cp = crashbench_here("check", "--junit", str(tmp_path / "missing" / "j.xml"), *nowhere, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "missing")
    assert_clean_error(
        crashbench_here("check", "--baseline", "nope", *nowhere, tmp_path=tmp_path), 2, "no result 'nope'"
    )
    cp = crashbench_here("check", "--redis-url", "redis://127.0.0.1:1/0", tmp_path=tmp_path)
    assert_clean_error(cp, ExitCode.SERVER_UNAVAILABLE, "127.0.0.1:1")


def test_exports_junit_markdown_csv_and_the_github_step_summary(store: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    junit, md, table = tmp_path / "j.xml", tmp_path / "s.md", tmp_path / "runs.csv"
    cp = crashbench_here(
        "check", "--results", "latest", "--dir", str(store), "-t", "lost=0", "--plain",
        "--junit", str(junit), "--markdown", str(md), "--csv", str(table),
        tmp_path=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    assert cp.returncode == ExitCode.THRESHOLD_VIOLATED, cp.stdout
    suites = ET.parse(junit).getroot()
    cases = suites.findall(".//testcase")
    assert {c.get("classname") for c in cases} == {"crashbench.naive", "crashbench.reliable"}
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["lost == 0"] and failed[0].get("classname") == "crashbench.naive"
    assert int(suites.get("failures", "0")) == 1
    assert "lost" in md.read_text() and "naive" in md.read_text()
    assert summary.read_text().startswith("earlier step\n") and md.read_text() in summary.read_text()
    rows = list(csv.DictReader(table.open()))
    assert [(r["design"], r["seed"]) for r in rows] == [
        ("naive", "7"),
        ("reliable", "7"),
        ("naive", "8"),
        ("reliable", "8"),
    ]


@pytest.mark.slow
def test_replay_reproduces_a_stored_run_s_fault_schedule(store: Path, tmp_path: Path) -> None:
    data = saved(store)
    cp = crashbench("replay", data["id"], "--run", "2", "--dir", str(store), "--out", str(tmp_path), tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr + cp.stdout
    assert "the same fault schedule" in cp.stderr
    (replayed,) = tmp_path.glob("*.json")
    run = json.loads(replayed.read_text())["runs"][0]
    assert (run["design"], run["seed"], run["schedule"]) == ("naive", 8, data["runs"][2]["schedule"])


def test_ci_examples_check_against_a_baseline_this_crashbench_reads(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples" / "ci"
    for name in ("github-actions.yml", "gitlab-ci.yml"):
        text = examples.joinpath(name).read_text()
        for part in ("crashbench check", "--baseline ci/baseline.json", "--junit crashbench.xml", "--markdown"):
            assert part in text, (name, part)
    # The committed baseline (scenario ci, 3 repeats) is read and used: against itself a bound 20 %
    # below holds, and one 1 % above must not (so the comparison really took the baseline's values).
    baseline = str(examples / "baseline.json")
    args = ["check", "--results", baseline, "--baseline", baseline, "--plain"]
    cp = crashbench_here(*args, "-t", "jobs_per_s>=-20%", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "✓ reliable: jobs_per_s >= -20%" in cp.stdout and "✓ stream: recovery_p95 < 2000ms" in cp.stdout
    cp = crashbench_here(*args, "-t", "jobs_per_s>=+1%", tmp_path=tmp_path)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "✗ reliable: jobs_per_s >= +1%" in cp.stdout


# --- the gate on hand-built results: check --results FILE, nothing runs ------------------------------


def saved_result(
    tmp_path: Path, runs: list[DesignRun], expect: dict[str, list[str]] | None = None, evaluated: bool = True
) -> Path:
    """A result file as a run would have saved it: its summary, its thresholds evaluated (show and
    check --results compute them again, and a file that does not say what they give is not passed).
    Not `evaluated`: thresholds no run could have evaluated (one naming a design not in it)."""
    res = result(runs, [])
    res.scenario = Scenario.from_dict({**SCENARIO, "expect": expect or {}}).to_dict()
    res.summary = summarize(runs)
    if evaluated:
        evaluate(res, [], None)
    return res.write(tmp_path / "hand-built.json")


def check_file(path: Path, *args: str, tmp_path: Path):
    return crashbench_here("check", "--results", str(path), "--plain", *args, tmp_path=tmp_path)


def test_check_a_design_no_threshold_applied_to_is_no_verdict_unless_allowed(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("reliable"), run("mine")], expect={"reliable": ["lost == 0"]})
    cp = check_file(path, tmp_path=tmp_path)
    assert cp.returncode == ExitCode.INCONCLUSIVE, cp.stdout + cp.stderr
    assert "no threshold applied to mine" in cp.stderr and "--allow-unchecked" in cp.stderr
    assert "mine: no threshold applied" in cp.stdout
    # lost == 0 and the two defaults
    assert "reliable: 3 thresholds, all met" in cp.stdout
    junit = tmp_path / "j.xml"
    cp = check_file(path, "--allow-unchecked", "--junit", str(junit), "--json", tmp_path=tmp_path)
    assert cp.returncode == ExitCode.OK, cp.stdout + cp.stderr
    data = json.loads(cp.stdout)
    assert data["status"] == "unchecked"
    assert [r["thresholds_evaluated"] for r in data["runs"]] == [3, 0]
    skipped = ET.parse(junit).getroot().find("testsuite[@name='mine']/testcase/skipped")
    assert skipped is not None


def test_check_without_any_threshold_is_no_verdict(tmp_path: Path) -> None:
    cp = check_file(saved_result(tmp_path, [run("mine")]), tmp_path=tmp_path)
    assert cp.returncode == ExitCode.INCONCLUSIVE, cp.stdout + cp.stderr


def test_show_and_run_style_commands_treat_unchecked_as_exploration(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("mine")])
    cp = crashbench_here("show", str(path), "--plain", tmp_path=tmp_path)
    # show re-renders the saved status (thresholds not evaluated: unchecked) and is not a gate
    assert cp.returncode == ExitCode.OK, cp.stdout + cp.stderr
    assert "mine: no threshold applied" in cp.stdout


def test_check_fails_the_default_undrained_threshold_next_to_a_passing_one(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("reliable", undrained=3)], expect={"reliable": ["lost == 0"]})
    cp = check_file(path, "--json", tmp_path=tmp_path)
    assert cp.returncode == ExitCode.THRESHOLD_VIOLATED, cp.stdout + cp.stderr
    got = {t["threshold"]: t for t in json.loads(cp.stdout)["thresholds"]}
    assert got["lost == 0"]["status"] == "pass"
    assert (got["undrained == 0"]["status"], got["undrained == 0"]["source"]) == ("fail", "default")
    cp = check_file(path, tmp_path=tmp_path)
    assert "✗ reliable: undrained == 0 (got 3; default)" in cp.stdout
    assert "reliable: 3 thresholds, 1 violated" in cp.stdout


def test_check_a_threshold_without_a_value_is_inconclusive_exit_4(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("reliable", p95=None)])
    cp = check_file(path, "-t", "recovery_p95<2s", tmp_path=tmp_path)
    assert cp.returncode == ExitCode.INCONCLUSIVE, cp.stdout + cp.stderr
    assert "? reliable: recovery_p95 < 2000ms" in cp.stdout
    assert "reliable: 3 thresholds, 1 inconclusive" in cp.stdout


def test_check_a_scenario_that_allows_undrained_jobs_overrides_the_default(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("reliable", undrained=3)], expect={"reliable": ["undrained <= 5"]})
    cp = check_file(path, tmp_path=tmp_path)
    assert cp.returncode == ExitCode.OK, cp.stdout + cp.stderr
    assert "✓ reliable: undrained <= 5" in cp.stdout and "undrained == 0" not in cp.stdout


def test_check_evidence_problems_are_broken_exit_4_with_the_ids(tmp_path: Path) -> None:
    problem = Problem("ledger_vs_queue", "the queue acked jobs the ledger never saw complete", ["j7", "j9"])
    path = saved_result(tmp_path, [run("reliable", problems=(problem,))], expect={"reliable": ["lost == 0"]})
    cp = check_file(path, tmp_path=tmp_path)
    assert cp.returncode == ExitCode.INCONCLUSIVE, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr
    assert "[ledger_vs_queue] the queue acked jobs the ledger never saw complete" in cp.stderr
    assert "ids: j7, j9" in cp.stderr
    assert "evidence problems" in cp.stdout and "(ids: j7, j9)" in cp.stdout
    cp = check_file(path, "--json", tmp_path=tmp_path)
    assert json.loads(cp.stdout)["status"] == "broken"


def test_check_a_threshold_for_a_design_not_in_the_saved_result_is_a_usage_error(tmp_path: Path) -> None:
    path = saved_result(tmp_path, [run("naive"), run("reliable")], expect={"reliable": ["lost == 0"]})
    cp = check_file(path, "-t", "relable: lost=0", tmp_path=tmp_path)
    assert_clean_error(cp, ExitCode.USAGE, "relable: lost == 0", "designs: naive, reliable")
    typo = saved_result(tmp_path, [run("reliable")], expect={"relable": ["lost == 0"]}, evaluated=False)
    assert_clean_error(check_file(typo, tmp_path=tmp_path), ExitCode.USAGE, "[expect.relable]")


@pytest.mark.slow
def test_bench_results_share_the_store_without_taking_latest(store: Path, tmp_path: Path) -> None:
    """A bench run after a crash run: `latest` is still the crash result for show, replay, check
    --results and --baseline; `results` lists both, the bench one marked; a bench id is refused
    with a clear message, not a parse error."""
    mixed = tmp_path / "store"
    mixed.mkdir()
    for path in store.glob("*.json"):
        shutil.copy(path, mixed)
    crash_id = saved(store)["id"]
    cp = crashbench("bench", "--designs", "naive", "--workers", "1", "--jobs", "200", "--repeat", "1",
                    "--memory-jobs", "0", "--out", str(mixed), "--plain", tmp_path=tmp_path)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    (bench,) = mixed.glob("*-bench.json")
    bench_id = json.loads(bench.read_text())["id"]
    assert bench.name > f"{crash_id}" and bench_id != crash_id  # newer: it would have been `latest`
    cp = crashbench_here("show", "latest", "--dir", str(mixed), "--plain", tmp_path=tmp_path)
    assert cp.returncode == 0 and crash_id in cp.stdout, cp.stderr
    cp = crashbench_here("check", "--results", "latest", "--baseline", "latest", "-t", "jobs_per_s>=-50%",
                    "--allow-unchecked", "--dir", str(mixed), tmp_path=tmp_path)  # fmt: skip
    assert cp.returncode == 0, cp.stderr + cp.stdout
    cp = crashbench("replay", "latest", "--run", "1", "--dir", str(mixed), "--out", str(tmp_path / "r"),
                    tmp_path=tmp_path)  # fmt: skip
    assert cp.returncode == 0, cp.stderr + cp.stdout
    # 80 columns, the width when output is not a terminal: every id whole, on one line.
    cp = crashbench_here("results", "--dir", str(mixed), tmp_path=tmp_path, env={"COLUMNS": "80"})
    assert cp.returncode == 0, cp.stderr
    lines = [line.split() for line in cp.stdout.splitlines() if line.startswith(("│", "|"))]
    rows = {cells[1]: " ".join(cells) for cells in lines if cells[1] not in ("│", "|")}  # not a wrapped cell
    assert f"results in {mixed}/ (2)" in cp.stdout.splitlines()  # the store's path whole too
    assert set(rows) == {crash_id, bench_id} and "bench" in rows[bench_id] and "bench" not in rows[crash_id]
    cp = crashbench_here("results", "--kind", "bench", "--dir", str(mixed), tmp_path=tmp_path)
    assert bench_id in cp.stdout and crash_id not in cp.stdout
    cp = crashbench_here("results", "--kind", "crash", "--dir", str(mixed), tmp_path=tmp_path)
    assert crash_id in cp.stdout and bench_id not in cp.stdout
    assert_clean_error(crashbench_here("show", bench_id, "--dir", str(mixed), tmp_path=tmp_path), 2, "bench result")


def test_a_baseline_from_another_scenario_is_warned_about_and_refused_when_strict() -> None:
    """A check of the default scenario against the name-reuse scenario's result compares two experiments."""
    from click.testing import CliRunner

    from crashbench.cli import cli

    readme = Path(__file__).resolve().parent.parent / "results" / "readme"
    default = str(readme / "20261203-064521-33bd600d-compare-default-naive-reliable-stream.json")
    (other,) = (str(p) for p in (readme / "stream-consumers").glob("*-compare-name-reuse-stream-stream-reuse.json"))
    args = ["check", "--results", default, "--plain", "--allow-unchecked"]
    same = CliRunner().invoke(cli, [*args, "--baseline", default, "--strict-baseline"])
    assert same.exit_code == 0 and "another scenario" not in same.output, same.output
    warned = CliRunner().invoke(cli, [*args, "--baseline", other])
    assert warned.exit_code == 0 and "warning: the baseline" in warned.output and "name-reuse" in warned.output
    refused = CliRunner().invoke(cli, [*args, "--baseline", other, "--strict-baseline"])
    assert refused.exit_code == 2 and "comes from another scenario (name-reuse" in refused.output, refused.output
