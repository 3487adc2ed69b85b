"""Run matrices across machines: `--shard K/N` on compare, sweep and check splits the runs (designs or
sweep values x repeats) deterministically, each shard's result records which shard of which plan it
holds, and `crashbench merge` puts the shards together into the unsharded run's result (the same runs
in the same order, its thresholds evaluated again over all of them, its timelines beside it), refusing
in one line a missing, repeated or foreign shard and any file it cannot read. Real runs: one small
compare unsharded, and the same split three ways side by side (lab/shards.py, as `make libraries`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashbench.errors import UsageError
from crashbench.run import shard as sharding
from tests.test_cli import assert_clean_error, crashbench, crashbench_here

ROOT = Path(__file__).resolve().parent.parent
# Jobs of 20 ms, 200 of them for 4 workers: a second of work, so that both kills find a handler running
# whatever else the machine runs (at 5 ms, with three shards and the tests beside them, some found none).
RUN = ["--designs", "naive,reliable,stream", "--jobs", "200", "--job-ms", "20", "--kills", "2", "--interval", "0.1",
       "--stale-after", "0.3", "--recover-every", "0.05", "--drain-timeout", "1", "--repeat", "2",
       "-t", "reliable: recovery_p95 < 5s", "--plain"]  # fmt: skip
# What the fault schedule and the designs decide, whatever the machine's load: equal in any two runs.
HEADLINE = ("enqueued", "done", "lost", "duplicated", "stranded", "dead_lettered", "kills", "kills_mid_job",
            "unrecovered", "unexpected")  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plan run whole, then as three shards side by side merged by lab/shards.py, and one shard of
    another plan (another seed)."""
    d = tmp_path_factory.mktemp("shards")
    whole = crashbench("compare", *RUN, "--out", str(d / "whole"), tmp_path=d)
    assert whole.returncode in (0, 1), whole.stderr
    script = [sys.executable, str(ROOT / "lab" / "shards.py"), "3", str(d / "shards"), str(d / "merged")]
    sharded = subprocess.run([*script, "--", "compare", *RUN], capture_output=True, text=True, timeout=300)
    other = crashbench("compare", *RUN, "--seed", "7", "--shard", "3/3", "--out", str(d / "other"), tmp_path=d)
    assert other.returncode in (0, 1), other.stderr
    (whole_file,) = (d / "whole").glob("*.json")
    (merged_file,) = (d / "merged").glob("*.json")
    shards = sorted((d / "shards").glob("*.json"), key=lambda p: _load(p)["shard"]["k"])
    (other_file,) = (d / "other").glob("*.json")
    return {
        "dir": d, "whole": whole_file, "whole_code": whole.returncode, "sharded": sharded, "merged": merged_file,
        "shards": shards, "other": other_file,
    }  # fmt: skip


def test_the_split_is_every_run_once_dealt_forth_and_back_design_by_design() -> None:
    for entries, repeat in ((1, 1), (2, 1), (1, 5), (3, 2), (14, 2), (5, 3)):
        total = entries * repeat
        for n in range(1, total + 1):
            parts = [sharding.chosen(entries, repeat, k, n) for k in range(1, n + 1)]
            assert sorted(i for p in parts for i in p) == list(range(total))
            assert all(p == sorted(p) for p in parts)
            assert all(p for p in parts) and max(map(len, parts)) - min(map(len, parts)) <= 1
    assert [sharding.dealt(j, 3) for j in range(8)] == [1, 2, 3, 3, 2, 1, 1, 2]
    # Unsharded order: repeat 0 of designs 0, 1, 2 (runs 0, 1, 2), then repeat 1 (3, 4, 5). Dealt design
    # by design: (0, r0) (0, r1) (1, r0) to shards 1 2 3, then (1, r1) (2, r0) (2, r1) to 3 2 1.
    assert [sharding.chosen(3, 2, k, 3) for k in (1, 2, 3)] == [[0, 5], [2, 3], [1, 4]]
    # 14 designs x 2 seeds on 2 shards: each design's seeds on both, never both seeds of one on one.
    two = [sharding.chosen(14, 2, k, 2) for k in (1, 2)]
    assert all(sorted(i % 14 for i in part) == list(range(14)) for part in two)
    assert sharding.parse(" 2/3 ") == (2, 3) and sharding.parse("1/1") == (1, 1)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["compare", "--shard", "2-3"], "--shard '2-3': write K/N"),
        (["compare", "--shard", "a/b"], "write K/N"),
        (["sweep", "-p", "stale_after=0.5,1", "--shard", "0/2"], "--shard 0/2: K must be 1..2"),
        (["check", "--shard", "4/3"], "--shard 4/3: K must be 1..3"),
        (["check", "--shard", "1/0"], "--shard 1/0: N must be 1 or more"),
        (["compare", "--designs", "naive", "--repeat", "2", "--shard", "1/3"], "the plan has 2 run(s)"),
        (["sweep", "-p", "stale_after=0.5,1", "--shard", "3/3"], "so at most 2 shards"),
    ],
)
def test_a_bad_shard_is_one_line_exit_2_before_anything_runs(args: list[str], says: str, tmp_path: Path) -> None:
    cp = crashbench_here(*args, "--out", str(tmp_path), tmp_path=tmp_path)
    assert_clean_error(cp, 2, says)
    assert not list(tmp_path.glob("*.json"))
    with pytest.raises(UsageError):
        sharding.parse("3")


@pytest.mark.slow
def test_three_shards_merged_are_the_unsharded_run_and_recount_and_report_as_it(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    assert runs["sharded"].returncode == runs["whole_code"], runs["sharded"].stdout + runs["sharded"].stderr
    assert "3 shards side by side" in runs["sharded"].stdout
    whole, merged = _load(runs["whole"]), _load(runs["merged"])
    shards = [_load(p) for p in runs["shards"]]
    # Each shard holds its round robin share, and names the whole plan.
    assert [(s["shard"]["k"], s["shard"]["n"], s["shard"]["runs"]) for s in shards] == [
        (1, 3, [0, 5]), (2, 3, [2, 3]), (3, 3, [1, 4]),
    ]  # fmt: skip
    assert len({s["shard"]["plan"] for s in shards}) == 1 and shards[0]["shard"]["total"] == 6
    assert [r["design"] for r in shards[1]["runs"]] == ["stream", "naive"]  # reliable's threshold: not here
    assert merged["shard"] is None and merged["shards"] == [s["id"] for s in shards]
    # The same runs in the same order, the same fault schedules, counts and thresholds.
    key = [(r["design"], r["variant"], r["seed"], r["repeat"]) for r in whole["runs"]]
    assert [(r["design"], r["variant"], r["seed"], r["repeat"]) for r in merged["runs"]] == key
    assert [r["schedule"] for r in merged["runs"]] == [r["schedule"] for r in whole["runs"]]
    for a, b in zip(whole["runs"], merged["runs"], strict=True):
        assert {c: a["counts"][c] for c in HEADLINE} == {c: b["counts"][c] for c in HEADLINE}, a["design"]
    shape = [(t["design"], t["threshold"], t["source"], t["status"]) for t in whole["thresholds"]]
    assert [(t["design"], t["threshold"], t["source"], t["status"]) for t in merged["thresholds"]] == shape
    assert ("reliable", "recovery_p95 < 5000ms", "command line", "pass") in shape
    counted = [t["actual"] for t in whole["thresholds"] if t["threshold"].split()[0] in HEADLINE]
    assert [t["actual"] for t in merged["thresholds"] if t["threshold"].split()[0] in HEADLINE] == counted
    assert merged["status"] == whole["status"] and merged["repeat"] == 2
    assert [s["design"] for s in merged["summary"]] == ["naive", "reliable", "stream"]
    assert all(s["runs"] == 2 for s in merged["summary"])
    _recounts_reports_and_shows_as_a_run_s(runs, tmp_path)
    _the_library_table_reads_a_merged_compare_per_design(runs, tmp_path)


def _recounts_reports_and_shows_as_a_run_s(runs: dict[str, Any], tmp_path: Path) -> None:
    merged = runs["merged"]
    cp = crashbench_here("recount", str(merged), tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("reproduced (every count") == 6 and "verdict: reproduced" in cp.stdout
    cp = crashbench_here("report", str(merged), "--out", str(tmp_path / "r.html"), tmp_path=tmp_path)
    assert cp.returncode == 0 and "<svg" in (tmp_path / "r.html").read_text(), cp.stderr
    cp = crashbench_here("show", str(merged), "--plain", tmp_path=tmp_path)
    assert cp.returncode == runs["whole_code"], cp.stderr
    # A shard is a result of its own too: it recounts, and says which shard it is.
    cp = crashbench_here("recount", str(runs["shards"][0]), tmp_path=tmp_path)
    assert cp.returncode == 0 and cp.stdout.count("reproduced (every count") == 2, cp.stdout + cp.stderr
    cp = crashbench_here("show", str(runs["shards"][0]), "--plain", tmp_path=tmp_path)
    assert "shard 1/3 of plan " in cp.stdout and "2 of its 6 runs" in cp.stdout


def _the_library_table_reads_a_merged_compare_per_design(runs: dict[str, Any], tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("library_table", ROOT / "lab" / "library_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    (tmp_path / "table").mkdir()
    shutil.copy(runs["merged"], tmp_path / "table")
    found = table.newest(tmp_path / "table")
    assert {d: [r.seed for r in rs] for d, rs in found.items()} == {
        "naive": [1, 2],
        "reliable": [1, 2],
        "stream": [1, 2],
    }


def _copy(path: Path, into: Path, change: Any = None, timeline: bool = True) -> Path:
    """A copy of a result file (and its timeline), its JSON changed by `change`."""
    into.mkdir(parents=True, exist_ok=True)
    data = _load(path)
    if change is not None:
        change(data)
    target = into / path.name
    target.write_text(json.dumps(data))
    if timeline:
        shutil.copy(path.parent / data["timeline"], into / data["timeline"])
    return target


def _merge(*args: str | Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return crashbench_here("merge", "--plain", "--out", str(tmp_path / "out"), *map(str, args), tmp_path=tmp_path)


@pytest.mark.slow
def test_merge_refuses_in_one_line_a_missing_repeated_or_foreign_shard_and_what_it_cannot_read(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    one, two, three = runs["shards"]
    assert_clean_error(_merge(one, two, tmp_path=tmp_path), 2, "missing shard(s) 3/3 of plan", "given 2 of 3")
    again = _copy(one, tmp_path / "again")
    assert_clean_error(_merge(runs["dir"] / "shards", again, tmp_path=tmp_path), 2, "shard 1/3 given twice")
    assert_clean_error(_merge(one, two, runs["other"], tmp_path=tmp_path), 2, "shards of different plans", "in seed")
    # The same file twice is that shard once.
    assert _merge(one, one, two, three, tmp_path=tmp_path).returncode == runs["sharded"].returncode
    assert not list((tmp_path / "out").glob("*shard*"))
    _refuses_in_one_line_what_it_cannot_read(runs, tmp_path)
    _evaluates_the_shards_thresholds_against_their_baseline(runs, tmp_path)


def _refuses_in_one_line_what_it_cannot_read(runs: dict[str, Any], tmp_path: Path) -> None:
    one, two, three = runs["shards"]
    junk = tmp_path / "junk.json"
    junk.write_text('{"schema": "crashbench.result", "schema_version": 4, "runs": 3}')
    assert_clean_error(_merge(one, two, junk, tmp_path=tmp_path), 2, "cannot read it as a crashbench result")
    text = tmp_path / "text.json"
    text.write_text("not json")
    assert_clean_error(_merge(one, two, text, tmp_path=tmp_path), 2, "cannot read it as a crashbench result")
    assert_clean_error(_merge(one, tmp_path / "nowhere", tmp_path=tmp_path), 2, "no such file or directory")
    (tmp_path / "empty").mkdir()
    assert_clean_error(_merge(tmp_path / "empty", tmp_path=tmp_path), 2, "no shard results in it")
    assert_clean_error(_merge(one, runs["whole"], tmp_path=tmp_path), 2, "not a shard's result")
    bare = _copy(three, tmp_path / "bare", timeline=False)
    assert_clean_error(_merge(one, two, bare, tmp_path=tmp_path), 2, "not a readable crashbench timeline")
    moved = _copy(three, tmp_path / "moved", lambda d: d["shard"].update(runs=[2, 5]))
    assert_clean_error(_merge(one, two, moved, tmp_path=tmp_path), 2, "its runs are not that shard's")

    def lost_one(data: dict[str, Any]) -> None:
        data["runs"][0]["counts"]["lost"] += 1

    edited = _copy(three, tmp_path / "edited", lost_one)
    assert_clean_error(_merge(one, two, edited, tmp_path=tmp_path), 4, "not reproduced from its timeline")


def _evaluates_the_shards_thresholds_against_their_baseline(runs: dict[str, Any], tmp_path: Path) -> None:
    shards, whole = runs["shards"], runs["whole"]
    cp = _merge(*shards, "--baseline", whole, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "the shards were run without a baseline")

    def baseline(data: dict[str, Any]) -> None:
        data["baseline"] = "20260101-000000-nope"

    def thresholds(data: dict[str, Any]) -> None:
        data["shard"]["thresholds"] = ["lost =< 0"]

    nowhere = [_copy(p, tmp_path / "nowhere", baseline) for p in shards]
    cp = _merge(*nowhere, "--dir", tmp_path, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "checked against the baseline 20260101-000000-nope, which is neither beside")
    cp = _merge(*nowhere, "--baseline", whole, tmp_path=tmp_path)
    assert_clean_error(cp, 2, "the shards were checked against 20260101-000000-nope")
    bad = [_copy(p, tmp_path / "bad", thresholds) for p in shards]
    assert_clean_error(_merge(*bad, tmp_path=tmp_path), 2, "its thresholds")


LIBRARY_PLAN = "rq,rq:reliable,celery,celery:acks-late,dramatiq,dramatiq:reliable,huey,taskiq,taskiq:stream," \
    "taskiq:reliable,arq,arq:reliable,saq,saq:reliable"  # fmt: skip


def test_shards_script_stops_on_a_shard_s_error_and_estimates_the_docs_figures(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "lab" / "shards.py")]
    # A shard that ends with an error (exit 2: no such design) ends the script with its code, no merge.
    bad = [*script, "2", str(tmp_path / "shards"), str(tmp_path / "merged"), "--", "compare", "--designs", "nope,naive"]
    cp = subprocess.run(bad, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "unknown design" in cp.stdout and not (tmp_path / "merged").exists(), cp.stdout
    cp = subprocess.run([*script, "2"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and "python lab/shards.py N SHARD_DIR OUT" in cp.stderr
    # docs/how-to/ci.md's figures for make libraries on 2 shards, from the committed result files.
    libraries = str(ROOT / "results" / "readme" / "libraries")
    cp = subprocess.run([*script, "--estimate", libraries, LIBRARY_PLAN, "2", "2"], capture_output=True, text=True)
    line = next(line for line in cp.stdout.splitlines() if line.startswith("2 shards"))
    dealt, robin = (sorted(float(m) for m in part.split("(")[1].split(")")[0].split()) for part in line.split(";"))
    said = f"would be {robin[1]:.0f} and {robin[0]:.0f} minutes of runs; dealt so, {dealt[1]:.0f} and {dealt[0]:.0f}"
    assert said in " ".join((ROOT / "docs" / "how-to" / "ci.md").read_text().split())


@pytest.mark.slow
def test_a_sweep_split_in_two_merges_into_the_sweep_of_every_value(tmp_path: Path) -> None:
    args = ["sweep", "-d", "reliable", "-p", "stale_after=0.3,0.6", "--jobs", "100", "--job-ms", "10",
            "--kills", "1", "--recover-every", "0.05", "--drain-timeout", "2",
            "-t", "stale_after=0.6: redelivered<=100", "--plain"]  # fmt: skip
    for k in (1, 2):
        cp = crashbench(*args, "--shard", f"{k}/2", "--out", str(tmp_path / "shards"), tmp_path=tmp_path)
        assert cp.returncode in (0, 1), cp.stderr
    cp = crashbench_here("merge", "--plain", "--out", str(tmp_path / "merged.json"), str(tmp_path / "shards"),
                         tmp_path=tmp_path)  # fmt: skip
    merged = _load(tmp_path / "merged.json")
    assert cp.returncode == {"pass": 0, "fail": 1}[merged["status"]], cp.stdout + cp.stderr
    assert merged["kind"] == "sweep" and [r["variant"] for r in merged["runs"]] == [
        "stale_after=0.3",
        "stale_after=0.6",
    ]
    assert ("stale_after=0.6", "redelivered <= 100", "command line") in [
        (t["design"], t["threshold"], t["source"]) for t in merged["thresholds"]
    ]
    cp = crashbench_here("recount", str(tmp_path / "merged.json"), tmp_path=tmp_path)
    assert cp.returncode == 0 and cp.stdout.count("reproduced (every count") == 2, cp.stdout + cp.stderr
