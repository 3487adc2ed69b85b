"""The GitHub Actions exports (crashbench.report.github): step outputs for $GITHUB_OUTPUT and
github-action-benchmark's customSmallerIsBetter JSON, on hand-built results and on the committed
baseline (a real check of 3 repeats), each figure computed here from the runs themselves."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from crashbench.errors import ExitCode
from crashbench.report import github, store
from crashbench.report.export import write_exports
from tests.test_cli import assert_clean_error, crashbench_here
from tests.test_export import repeated, result, run  # noqa: F401 (repeated: a fixture)

BASELINE = Path(__file__).resolve().parent.parent / "examples" / "ci" / "baseline.json"


def read_outputs(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT as the runner reads it: key=value, or key<<DELIMITER ... DELIMITER."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            body = []
            for more in lines:
                if more == delimiter:
                    break
                body.append(more)
            values[key] = "\n".join(body)
        else:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_outputs_give_the_verdict_thresholds_and_counts_summed_over_every_run(repeated) -> None:  # noqa: F811
    # naive lost 4, 0, 2 and reliable duplicated 0, 1, 2 over three repeats of 100 jobs each
    values = read_outputs(github.output_lines(github.outputs(repeated, saved=Path("r/x.json"))))
    assert values["verdict"] == "fail"
    assert (values["thresholds"], values["violated"], values["inconclusive"]) == ("3", "1", "1")
    assert (values["runs"], values["designs"], values["result_id"]) == ("6", "naive,reliable", repeated.id)
    assert (values["enqueued"], values["lost"], values["duplicated"], values["done"]) == ("600", "6", "3", "594")
    assert values["stranded"] == values["dead_lettered"] == values["evidence_problems"] == "0"
    assert values["result"] == str(Path("r/x.json").resolve())


def test_a_value_with_a_line_break_is_written_as_a_heredoc() -> None:
    text = github.output_lines({"verdict": "pass", "odd": "a\nCRASHBENCH_EOF\nb"})
    assert text.startswith("verdict=pass\nodd<<CRASHBENCH_EOF_\n")
    assert read_outputs(text) == {"verdict": "pass", "odd": "a\nCRASHBENCH_EOF\nb"}


def test_benchmark_entries_of_repeats_are_the_mean_counts_and_the_median_recovery(repeated) -> None:  # noqa: F811
    entries = github.benchmark(repeated)
    shown = {e["name"]: (e["unit"], e["value"], e.get("range")) for e in entries}
    assert shown == {
        "naive lost": ("jobs", 2.0, "0 to 4"),  # (4 + 0 + 2) / 3
        "naive duplicated": ("jobs", 0.0, "0 to 0"),
        "naive recovery p95": ("ms", 120.0, "120 to 120"),
        "reliable lost": ("jobs", 0.0, "0 to 0"),
        "reliable duplicated": ("jobs", 1.0, "0 to 2"),  # (0 + 1 + 2) / 3
        # reliable recovered nothing in any run: no recovery entry rather than a made-up figure
    }
    assert all(e["extra"].endswith(f"(seeds 1, 2, 3); result {repeated.id}") for e in entries)
    assert [e["name"] for e in entries][:3] == ["naive lost", "naive duplicated", "naive recovery p95"]
    single = github.benchmark(result([run("solo", lost=3)], []))
    extra = f"1 run (seed 1); result {repeated.id}"
    assert single[0] == {"name": "solo lost", "unit": "jobs", "value": 3.0, "extra": extra}


def test_a_recovery_that_never_happened_has_no_entry_and_the_json_stays_finite() -> None:
    never = run("naive", p95=float("inf"))
    text = github.benchmark_json(result([never], []))
    assert [e["name"] for e in json.loads(text)] == ["naive lost", "naive duplicated"]


def test_benchmark_entries_of_the_committed_baseline_are_its_own_figures() -> None:
    """A real check (ci scenario, reliable and stream, 3 repeats): each figure from the raw JSON, and
    the recovery p95 equal to what crashbench's threshold evaluation recorded as the median."""
    raw = json.loads(BASELINE.read_text())
    entries = {e["name"]: e for e in github.benchmark(store.load(str(BASELINE)))}
    assert len(entries) == 6
    for design in ("reliable", "stream"):
        runs = [r for r in raw["runs"] if r["design"] == design]
        assert len(runs) == 3
        for count in ("lost", "duplicated"):
            assert entries[f"{design} {count}"]["value"] == sum(r["counts"][count] for r in runs) / 3
        p95 = [r["timings"]["recovery_ms_p95"] for r in runs]
        assert entries[f"{design} recovery p95"]["value"] == round(statistics.median(p95), 3)
        (recorded,) = [t for t in raw["thresholds"] if t["design"] == design and t["threshold"].startswith("recovery")]
        assert entries[f"{design} recovery p95"]["value"] == recorded["actual"]
        assert entries[f"{design} recovery p95"]["range"] == f"{min(p95):g} to {max(p95):g}"


def test_write_exports_writes_the_benchmark_and_appends_the_outputs(repeated, tmp_path: Path) -> None:  # noqa: F811
    bench, out = tmp_path / "bench.json", tmp_path / "github_output"
    out.write_text("earlier=1\n")
    written = write_exports(repeated, None, None, None, environ={}, benchmark_path=bench, github_output=out)
    assert written == [bench, out]
    assert json.loads(bench.read_text()) == github.benchmark(repeated)
    values = read_outputs(out.read_text())
    assert values["earlier"] == "1" and values["verdict"] == "fail" and values["lost"] == "6"


def test_the_options_write_from_a_saved_result_and_a_bad_path_is_refused(tmp_path: Path) -> None:
    bench, out = tmp_path / "bench.json", tmp_path / "github_output"
    args = ["check", "--results", str(BASELINE), "--plain", "--benchmark-json", str(bench), "--github-output", str(out)]
    cp = crashbench_here(*args, tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert read_outputs(out.read_text())["verdict"] == "pass"
    assert json.loads(bench.read_text())[0]["name"] == "reliable lost"
    for option in ("--benchmark-json", "--github-output"):
        bad = ["check", "--results", str(BASELINE), option, str(tmp_path / "no" / "file")]
        assert_clean_error(crashbench_here(*bad, tmp_path=tmp_path), ExitCode.USAGE, "does not exist")
