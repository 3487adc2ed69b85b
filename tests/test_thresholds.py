"""Thresholds: parsing (good and bad), evaluation over repeats, against other counts and a baseline.
Pure unit tests: the runs are built by hand, their values known."""

from __future__ import annotations

import pytest

from crashbench.errors import UsageError
from crashbench.model.counts import Counts
from crashbench.model.faults import NetworkFaultRecord
from crashbench.model.results import DesignRun, Timings
from crashbench.model.thresholds import (
    Threshold,
    ThresholdSyntaxError,
    check_all,
    check_targets,
    evaluate,
    parse,
    parse_entry,
)


def run(
    design: str = "reliable",
    seed: int = 1,
    jobs_per_s: float = 100.0,
    p95: float | None = 800.0,
    variant: str = "",
    **counts: int,
) -> DesignRun:
    timings = Timings(
        wall_s=1.0, jobs_per_s=jobs_per_s, ideal_s=1.0, drained=counts.get("undrained", 0) == 0, drain_s=0.1,
        window_s=30.0, startup_ms_median=5.0, startup_ms_max=6.0, restart_ms_median=10.0, recovery_ms_p95=p95,
    )  # fmt: skip
    return DesignRun(design, variant, "p:", seed, Counts(**counts), timings, kills=[])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lost=0", Threshold("lost", "==", 0.0)),
        ("duplicated <= 2", Threshold("duplicated", "<=", 2.0)),
        ("recovery_p95<2s", Threshold("recovery_p95", "<", 2000.0)),
        ("recovery_p95 < 500ms", Threshold("recovery_p95", "<", 500.0)),
        ("wall<=1500ms", Threshold("wall", "<=", 1.5)),
        ("jobs_per_s>=-10%", Threshold("jobs_per_s", ">=", -10.0, relative=True)),
        ("lost == kills_mid_job", Threshold("lost", "==", ref="kills_mid_job")),
        ("lost.median<=1", Threshold("lost", "<=", 1.0, stat="median")),
        ("rq:reliable: stranded=0", Threshold("stranded", "==", 0.0, design="rq:reliable")),
    ],
)
def test_parse_reads_the_small_syntax(text: str, expected: Threshold) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots=0", "unknown metric 'lots'"),
        ("lost", "write METRIC OP VALUE"),
        ("lost=many", "not a number"),
        ("lost=2s", "not a time"),
        ("recovery_p95 < kills", "compares with a number"),
        ("lost.mean<1", "unknown statistic .mean"),
    ],
)
def test_parse_refuses_bad_syntax_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ThresholdSyntaxError, match=message):
        parse(text)


def test_a_count_must_hold_in_every_repeat_and_the_failing_run_is_named() -> None:
    runs = [run(seed=1, lost=0), run(seed=2, lost=3), run(seed=3, lost=0)]
    r = evaluate(parse("lost=0"), "reliable", runs, None)
    assert (r.status, r.actual, r.expected, r.values) == ("fail", 3, 0, [0, 3, 0])
    assert "seed 2" in r.note
    ok = evaluate(parse("lost<=3"), "reliable", runs, None)
    assert (ok.status, ok.actual) == ("pass", 3)  # the worst run is reported


def test_a_count_against_another_count_of_the_same_run() -> None:
    runs = [run(lost=2, kills_mid_job=2), run(lost=1, kills_mid_job=2)]
    r = evaluate(parse("lost == kills_mid_job"), "naive", runs, None)
    assert (r.status, r.actual, r.expected) == ("fail", 1, 2)


def test_timings_use_the_median_of_repeats_unless_a_statistic_is_given() -> None:
    runs = [run(p95=900.0), run(p95=1500.0), run(p95=2500.0)]
    assert evaluate(parse("recovery_p95<2s"), "reliable", runs, None).status == "pass"  # median 1500
    r = evaluate(parse("recovery_p95.max<2s"), "reliable", runs, None)
    assert (r.status, r.actual, r.expected) == ("fail", 2500.0, 2000.0)


def test_a_missing_value_is_inconclusive_never_a_pass() -> None:
    r = evaluate(parse("recovery_p95<2s"), "naive", [run(p95=None)], None)
    assert r.status == "inconclusive" and r.actual is None


def test_relative_thresholds_compare_with_the_baseline_median() -> None:
    baseline = [run(jobs_per_s=100.0), run(jobs_per_s=110.0), run(jobs_per_s=90.0)]
    t = parse("jobs_per_s>=-10%")
    r = evaluate(t, "reliable", [run(jobs_per_s=91.0)], baseline)
    assert (r.status, r.baseline, r.expected) == ("pass", 100.0, 90.0)
    assert evaluate(t, "reliable", [run(jobs_per_s=89.0)], baseline).status == "fail"
    assert evaluate(t, "reliable", [run(jobs_per_s=89.0)], []).status == "inconclusive"  # no such design
    assert evaluate(t, "reliable", [run(jobs_per_s=89.0)], None).status == "inconclusive"  # no baseline


def test_check_all_applies_the_scenario_s_and_the_command_line_s_to_the_right_designs() -> None:
    runs = [run("naive", lost=4, kills_mid_job=4), run("reliable", lost=0, kills_mid_job=4)]
    declared = {"naive": (parse("lost == kills_mid_job", source="scenario"),)}
    given = (parse("lost=0"), parse("reliable: duplicated<=0"))
    got = [(r.design, r.threshold, r.source, r.status) for r in check_all(runs, declared, given)]
    assert got == [
        ("naive", "lost == kills_mid_job", "scenario", "pass"),
        ("naive", "lost == 0", "command line", "fail"),
        ("naive", "undrained == 0", "default", "pass"),
        ("naive", "worker_crashes == 0", "default", "pass"),
        ("reliable", "lost == 0", "command line", "pass"),
        ("reliable", "duplicated <= 0", "command line", "pass"),
        ("reliable", "undrained == 0", "default", "pass"),
        ("reliable", "worker_crashes == 0", "default", "pass"),
    ]


# --- the defaults: undrained == 0, worker_crashes == 0 --------------------------------------------


def test_an_undrained_run_fails_the_default_threshold_next_to_a_passing_explicit_one() -> None:
    declared = {"reliable": (parse_entry("reliable", "lost", 0, "scenario"),)}
    got = {r.threshold: r for r in check_all([run(undrained=3, lost=0)], declared, ())}
    assert got["lost == 0"].status == "pass"
    undrained = got["undrained == 0"]
    assert (undrained.status, undrained.actual, undrained.source) == ("fail", 3, "default")
    assert (got["worker_crashes == 0"].status, got["worker_crashes == 0"].source) == ("pass", "default")


def test_a_scenario_that_names_undrained_overrides_the_default() -> None:
    declared = {"reliable": (parse_entry("reliable", "undrained", "<= 5", "scenario"),)}
    got = [(r.threshold, r.source, r.status) for r in check_all([run(undrained=3)], declared, ())]
    assert got == [("undrained <= 5", "scenario", "pass"), ("worker_crashes == 0", "default", "pass")]


def test_a_command_line_threshold_naming_worker_crashes_overrides_the_default() -> None:
    got = [
        (r.threshold, r.source, r.status) for r in check_all([run(worker_crashes=1)], {}, (parse("worker_crashes<=1"),))
    ]
    assert got == [("worker_crashes <= 1", "command line", "pass"), ("undrained == 0", "default", "pass")]


def test_a_design_without_explicit_thresholds_gets_no_defaults_either() -> None:
    # The defaults alone would make an unchecked design look checked.
    runs = [run("naive", undrained=3, worker_crashes=2), run("reliable")]
    got = check_all(runs, {"reliable": (parse_entry("reliable", "lost", 0, "scenario"),)}, ())
    assert {r.design for r in got} == {"reliable"}


def test_a_run_with_network_faults_is_also_held_to_no_stuck_worker() -> None:
    declared = {"reliable": (parse_entry("reliable", "lost", 0, "scenario"),)}
    faulted = run(stuck_workers=2)
    faulted.network_faults = [NetworkFaultRecord(0, "timeout", [0, 1], 1.0, 3.0, stuck=[0, 1])]
    got = {r.threshold: r for r in check_all([faulted], declared, ())}
    stuck = got["stuck_workers == 0"]
    assert (stuck.status, stuck.actual, stuck.source) == ("fail", 2, "default")
    # Without network faults the default is not there: nothing could have made a worker stuck.
    assert "stuck_workers == 0" not in {r.threshold for r in check_all([run()], declared, ())}


# --- thresholds that name a design not in the run -------------------------------------------------


def test_a_command_line_threshold_naming_a_design_not_in_the_run_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        check_targets(["naive", "reliable"], (), {}, (parse("relable: lost=0"), parse("lost=0")))
    assert "relable: lost == 0" in info.value.message
    assert "designs: naive, reliable" in info.value.message


def test_a_command_line_threshold_may_not_name_a_design_only_the_scenario_lists() -> None:
    # The scenario's designs are not run here, so this threshold would check nothing.
    with pytest.raises(UsageError, match="naive: lost == 0"):
        check_targets(["reliable"], ("naive", "reliable"), {}, (parse("naive: lost=0"),))


def test_a_scenario_expectation_may_name_its_own_designs_but_not_a_typo() -> None:
    declared = {"naive": (parse_entry("naive", "lost", 0, "scenario"),)}
    check_targets(["reliable"], ("naive", "reliable", "stream"), declared, ())  # run -d reliable: fine
    typo = {"relable": (parse_entry("relable", "lost", 0, "scenario"),)}
    with pytest.raises(UsageError) as info:
        check_targets(["reliable"], ("naive", "reliable", "stream"), typo, ())
    assert "[expect.relable]" in info.value.message
    assert "reliable (and the scenario's naive, stream)" in info.value.message


def test_a_sweep_value_is_a_design_of_the_run() -> None:
    check_targets(["reliable", "kills=0", "kills=2"], (), {}, (parse("kills=2: lost=0"),))
    with pytest.raises(UsageError, match="kills=3"):
        check_targets(["reliable", "kills=0", "kills=2"], (), {}, (parse("kills=3: lost=0"),))


def test_a_rule_in_the_scenario_and_on_the_command_line_is_checked_once() -> None:
    runs = [run(design="naive", lost=1, kills_mid_job=1)]
    declared = {"naive": [parse("lost == kills_mid_job"), parse("stranded == 0")]}
    results = check_all(runs, declared, [parse("lost == kills_mid_job"), parse("naive: stranded == 0")])
    rules = [r.threshold for r in results if r.source != "default"]
    assert rules == ["lost == kills_mid_job", "stranded == 0"]
