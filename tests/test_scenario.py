"""Scenario files: defaults, validation that reports every problem, overrides, the seeded schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashbench import scenario
from crashbench.errors import ScenarioError, UsageError
from crashbench.faults import plan_kills
from crashbench.session import sweep_values

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_scenario_is_valid() -> None:
    paths = sorted((ROOT / "scenarios").glob("*.toml"))
    assert paths
    for path in paths:
        assert scenario.load(str(path)).source == str(path)


def test_default_scenario_is_the_lessons_crash_test() -> None:
    sc = scenario.load("default")
    assert (sc.jobs, sc.job_ms, sc.workers, sc.kills, sc.interval, sc.signal) == (2000, 10, 4, 5, 0.5, "SIGKILL")
    assert sc.kill_when == "mid-job"
    assert sc.ideal_s == pytest.approx(5.0)
    assert {"lost == 0", "stranded == 0", "done == enqueued"} <= {t.rule() for t in sc.expect["reliable"]}


def test_validation_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
[workload]
jobs = -1
workrs = 4
[faults]
signal = "SIGBOGUS"
kill_when = "sometimes"
[expect.reliable]
lost = "about zero"
missing = 0
[extras]
"""
    )
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(bad))
    text = info.value.message
    for fragment in ("workload.jobs", "workload.workrs", "SIGBOGUS", "kill_when", "about zero", "'missing'", "extras"):
        assert fragment in text
    assert len(info.value.problems) == 7


def test_not_toml_is_a_clear_problem(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("[workload\njobs = ")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        scenario.load(str(bad))


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(ScenarioError, match=r"known: .*default"):
        scenario.load("no-such-scenario")


def test_overrides_replace_and_are_validated() -> None:
    sc = scenario.load("default").with_overrides(kills=2, signal="term", jobs=None)
    assert (sc.kills, sc.signal, sc.jobs) == (2, "SIGTERM", 2000)
    with pytest.raises(ScenarioError, match=r"workload\.workers"):
        sc.with_overrides(workers=0)


def test_scenario_expectations_are_thresholds_and_bad_ones_are_listed(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[expect.naive]\nlost = "== kills_mid_job"\n[expect.reliable]\nlost = 0\nrecovery_p95 = "< 2s"\n')
    sc = scenario.load(str(good))
    assert [t.rule() for t in sc.expect["reliable"]] == ["lost == 0", "recovery_p95 < 2000ms"]
    assert sc.expect["naive"][0].ref == "kills_mid_job"
    assert scenario.Scenario.from_dict(sc.to_dict()).expect == sc.expect
    bad = tmp_path / "bad.toml"
    bad.write_text('[expect.reliable]\nlots = 0\nlost = true\nwall = "< 3 parsecs"\n')
    with pytest.raises(ScenarioError) as err:
        scenario.load(str(bad))
    text = str(err.value.message)
    assert "unknown metric 'lots'" in text and "lost = True" in text and "parsecs" in text


def test_same_seed_same_schedule_other_seed_other_victims() -> None:
    sc = scenario.Scenario(kills=20, workers=4)
    assert plan_kills(sc) == plan_kills(sc)
    other = plan_kills(sc.with_overrides(seed=2))
    assert [k.slot for k in other] != [k.slot for k in plan_kills(sc)]
    assert [k.at for k in plan_kills(sc)][:3] == [0.5, 1.0, 1.5]


def test_sweep_values_follow_the_settings_declared_type() -> None:
    sc = scenario.Scenario(heartbeat_every=0)  # as a TOML file may write it
    values = sweep_values(sc, "heartbeat_every", "0, 0.1")
    assert [v.heartbeat_every for v in values] == [0.0, 0.1]
    assert [v.kills for v in sweep_values(sc, "kills", "1,3")] == [1, 3]
    with pytest.raises(UsageError, match="not a whole number"):
        sweep_values(sc, "kills", "1.5")


def test_library_tables_pass_through_to_the_design_settings(tmp_path: Path) -> None:
    path = tmp_path / "lib.toml"
    path.write_text('[library."celery:acks-late"]\nworker_prefetch_multiplier = 2\n[library.rq]\nworker_ttl = 30\n')
    sc = scenario.load(str(path))
    assert sc.settings("celery:acks-late").options == {"worker_prefetch_multiplier": 2}
    assert sc.settings("rq").options == {"worker_ttl": 30}
    assert sc.settings("reliable").options == {}
    path.write_text("[library]\nrq = 3\n")
    with pytest.raises(ScenarioError, match="one table per design"):
        scenario.load(str(path))
