"""`crashbench recount` recomputes the verdict, not only the counts: a saved result whose status, a
threshold result, its summary or the scenario its thresholds come from was edited is not reproduced
(exit 4, the field named), and `show` and `check --results` say so and exit 4 too. The files are real:
the README's report result (naive, reliable, stream, with its timeline) and one made from it as a run
with a failing command-line threshold would have saved it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from click.testing import Result as Invoked

from crashbench.cli import cli
from crashbench.errors import ExitCode
from crashbench.model.thresholds import parse
from crashbench.report import recount, store
from crashbench.run.session import evaluate
from tests.test_check import saved_result
from tests.test_export import run

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "results/readme/report/20261130-180150-1d6e54e4-compare-default-naive-reliable-stream.json"
Edit = Callable[[dict[str, Any]], None]


def invoke(*args: str) -> Invoked:
    return CliRunner().invoke(cli, [*args, "--plain"])


def folded(text: str) -> str:
    """Whitespace folded: where a long line wraps depends on the console's width."""
    return " ".join(text.split())


@pytest.fixture
def passing(tmp_path: Path) -> Path:
    """The README's report result and its timeline, copied: status pass, 31 thresholds."""
    for path in (REPORT, REPORT.with_suffix(".timeline.jsonl.gz")):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / REPORT.name


@pytest.fixture
def failing(passing: Path) -> Path:
    """The same runs as `crashbench compare -t 'naive: lost == 0'` saves them: naive lost 5 of its
    jobs to 5 mid-job kills, so that threshold fails and the status is fail."""
    result = store.load(str(passing))
    for r, tl in zip(result.runs, recount.timelines_of(passing, result), strict=True):
        r.timeline = tl
    evaluate(result, [parse("naive: lost == 0")], None)
    assert result.status == "fail"
    return result.write(passing.parent / "failing.json")


def edited(path: Path, name: str, edit: Edit) -> Path:
    """A copy of the result at `path` with `edit` applied, beside it (so it names the same timeline)."""
    data = json.loads(path.read_text())
    edit(data)
    out = path.with_name(f"edited-{name}.json")
    out.write_text(json.dumps(data))
    return out


def threshold(data: dict[str, Any], design: str, rule: str) -> dict[str, Any]:
    return next(t for t in data["thresholds"] if (t["design"], t["threshold"]) == (design, rule))


def fail_to_pass(data: dict[str, Any]) -> None:
    data["status"] = "pass"


def pass_to_fail(data: dict[str, Any]) -> None:
    data["status"] = "fail"


def failed_threshold_passed(data: dict[str, Any]) -> None:
    """Both the threshold and the status, as one would to hide the failure consistently."""
    threshold(data, "naive", "lost == 0")["status"] = "pass"
    data["status"] = "pass"


def threshold_value(data: dict[str, Any]) -> None:
    threshold(data, "naive", "lost == kills_mid_job")["actual"] = 0


def summary_median(data: dict[str, Any]) -> None:
    data["summary"][0]["counts"]["lost"]["median"] = 0


def summary_count_dropped(data: dict[str, Any]) -> None:
    """A count removed from the summary reads as 0 (as an older file's would): not naive's 5."""
    del data["summary"][0]["counts"]["lost"]


def expectation_dropped(data: dict[str, Any]) -> None:
    """naive's expectation that it loses what the kills interrupt, gone from the scenario and the
    thresholds (and the runs' threshold counts): what is left agrees with itself."""
    data["scenario"]["expect"]["naive"].remove("lost == kills_mid_job")
    data["thresholds"].remove(threshold(data, "naive", "lost == kills_mid_job"))
    data["runs"][0]["thresholds_evaluated"] -= 1


def run_relabelled(data: dict[str, Any]) -> None:
    data["runs"][0]["design"] = "stream"


CASES: list[tuple[str, str, Edit, str]] = [
    # (name, which file, the edit, the line recount prints for it)
    ("status-fail-to-pass", "failing", fail_to_pass, "status: saved 'pass', recomputed 'fail'"),
    ("status-pass-to-fail", "passing", pass_to_fail, "status: saved 'fail', recomputed 'pass'"),
    ("threshold-verdict", "failing", failed_threshold_passed,
     "(naive: lost == 0).status: saved 'pass', recomputed 'fail'"),
    ("threshold-value", "passing", threshold_value,
     "(naive: lost == kills_mid_job).actual: saved 0.0, recomputed 5"),
    ("summary-median", "passing", summary_median, "summary[0] (naive).counts.lost.median: saved 0.0, recomputed 5"),
    ("summary-count-dropped", "passing", summary_count_dropped,
     "summary[0] (naive).counts.lost.max: saved 0, recomputed 5"),
    ("expectation-dropped", "passing", expectation_dropped,
     "scenario.expect: saved {'naive': ['kills_mid_job == kills', 'unrecovered == kills_mid_job',"),
    ("run-relabelled", "passing", run_relabelled, "design: saved 'stream', recounted 'naive'"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("name", "which", "edit", "line"), CASES, ids=[c[0] for c in CASES])
def test_an_edited_verdict_is_not_reproduced_and_no_command_passes_it(
    name: str, which: str, edit: Edit, line: str, request: pytest.FixtureRequest
) -> None:
    path = edited(request.getfixturevalue(which), name, edit)
    out = invoke("recount", str(path))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert folded(line) in folded(out.output), out.output
    for command in (["show", str(path)], ["check", "--results", str(path)]):
        out = invoke(*command)
        assert out.exit_code == ExitCode.INCONCLUSIVE, (command, out.output)
        said = folded(out.output)
        assert "crashbench: no verdict: the saved result is not what its own record gives" in said
        assert folded(line) in said, (command, out.output)  # the field, named, with both values
    out = invoke("show", str(path), "--json")
    assert json.loads(out.stdout)["status"] == "broken"


def test_an_untouched_result_reproduces_counts_and_verdict(passing: Path, failing: Path) -> None:
    """Both files recount and reproduce; show exits with the saved status, check --results with its
    own thresholds (the scenario's: the failing file's -t was its run's, not this check's)."""
    for path, status, shown in ((passing, "pass", ExitCode.OK), (failing, "fail", ExitCode.THRESHOLD_VIOLATED)):
        out = invoke("recount", str(path))
        assert out.exit_code == ExitCode.OK, out.output
        assert f"verdict: reproduced (status {status}, " in out.output and "difference" not in out.output
        for command, code in ((["show", str(path)], shown), (["check", "--results", str(path)], ExitCode.OK)):
            out = invoke(*command)
            assert out.exit_code == code, (command, out.output)
            assert "not what its own record gives" not in out.output and "not recounted" not in out.output


def test_without_a_timeline_the_verdict_is_checked_against_the_saved_runs(passing: Path) -> None:
    """A result that names no timeline (or whose file is gone) cannot be recounted, and says so; its
    verdict is still computed again from its runs as saved, and an edit of it still fires."""
    bare = edited(passing, "bare", lambda d: d.update(timeline=None))
    out = invoke("show", str(bare))
    assert out.exit_code == ExitCode.OK and "counts not recounted: the result names no timeline" in out.output
    assert invoke("recount", str(bare)).exit_code == ExitCode.USAGE  # recount needs one
    lying = edited(passing, "lying", lambda d: (d.update(timeline=None), summary_median(d)))
    out = invoke("check", "--results", str(lying))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert "the saved verdict is not what its saved runs give" in folded(out.output)
    assert "summary[0] (naive).counts.lost.median: saved 0.0, recomputed 5" in folded(out.output)


def test_default_thresholds_a_file_does_not_list_still_decide_its_status(tmp_path: Path) -> None:
    """A result saved before the default thresholds existed lists none, and that alone is not a
    difference (examples/ci/baseline.json is one); but its status is recomputed with them: a file
    that lists no failing default and says pass, while undrained == 0 fails, is not reproduced."""

    def older(data: dict[str, Any]) -> None:  # as crashbench wrote it before the defaults
        data["thresholds"] = [t for t in data["thresholds"] if t["source"] != "default"]
        del data["runs"][0]["thresholds_evaluated"]

    honest = saved_result(tmp_path / "honest", [run("reliable")], expect={"reliable": ["lost == 0"]})
    out = invoke("show", str(edited(honest, "older", older)))
    assert out.exit_code == ExitCode.OK, out.output
    assert "not what" not in out.output
    path = saved_result(tmp_path, [run("reliable", undrained=3)], expect={"reliable": ["lost == 0"]})
    assert json.loads(path.read_text())["status"] == "fail"
    assert invoke("show", str(path)).exit_code == ExitCode.THRESHOLD_VIOLATED
    # Left at fail, its status is not what its listed thresholds give (pass): show acts on those.
    out = invoke("show", str(edited(path, "stale", older)))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert folded("status as the saved thresholds give it: 'pass', recomputed 'fail'") in folded(out.output)
    out = invoke("show", str(edited(path, "hidden", lambda d: (older(d), fail_to_pass(d)))))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert "status: saved 'pass', recomputed 'fail'" in folded(out.output)


def test_a_baseline_that_cannot_be_found_is_named(passing: Path) -> None:
    path = edited(passing, "based", lambda d: d.update(baseline="20250101-000000-gone"))
    out = invoke("recount", str(path))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert "baseline: 20250101-000000-gone is neither beside the result nor in results/" in folded(out.output)


def test_a_relative_threshold_is_computed_again_against_the_baseline_beside_the_result(passing: Path) -> None:
    """A result checked against a baseline (here the README's result, beside it) lists the baseline's
    value of each relative threshold: reproduced as saved, and an edited one fires."""
    result = store.load(str(passing))
    for r, tl in zip(result.runs, recount.timelines_of(passing, result), strict=True):
        r.timeline = tl
    result.id = "20990101-000000-relative"
    evaluate(result, [parse("jobs_per_s >= -10%")], store.load(str(passing)))
    path = result.write(passing.parent / f"{result.id}.json")
    out = invoke("recount", str(path))
    assert out.exit_code == ExitCode.OK and "verdict: reproduced" in out.output, out.output

    def rebased(data: dict[str, Any]) -> None:
        threshold(data, "stream", "jobs_per_s >= -10%")["baseline"] = 1.0

    out = invoke("recount", str(edited(path, "rebased", rebased)))
    assert out.exit_code == ExitCode.INCONCLUSIVE, out.output
    assert "(stream: jobs_per_s >= -10%).baseline: saved 1.0, recomputed" in folded(out.output)
