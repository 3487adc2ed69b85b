"""Crash tests against real servers with real SIGKILLs: the designs' losses are known in advance."""

from __future__ import annotations

import shutil

import pytest

from crashbench.errors import RunAborted, UnexpectedError
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs


def assert_evidence_agrees(run: DesignRun) -> None:
    """No evidence check fired: the design's report, the ledgers and Redis as read by the harness agree."""
    assert run.problems == [], [str(p) for p in run.problems]


def test_reliable_and_stream_lose_nothing_under_mid_job_kills(server_url: str, small: Scenario) -> None:
    result = run_designs(small, ["reliable", "stream"], Options(redis_url=server_url))
    for run in result.runs:
        c = run.counts
        assert_evidence_agrees(run)
        assert run.timings.drained
        assert (c.kills, c.kills_mid_job) == (5, 5), run.kills
        assert {k.target for k in run.kills} == {"worker"}  # a single-process worker is the whole target
        assert c.lost == 0 and c.stranded == 0 and c.dead_lettered == 0
        assert c.done == c.enqueued == 600
        # Each killed worker held exactly one job, and recovery gave exactly that one back (a job
        # given back can be hit again by a later kill, so distinct jobs are the distinct victims' jobs).
        assert c.interrupted == 5
        assert c.requeue_events == 5
        assert c.requeued == len({k.job for k in run.kills})
        # Killed inside the handler, before the end record: the job ran to completion once, not twice.
        assert c.duplicated == 0


def test_naive_loses_exactly_one_job_per_mid_job_kill(server_url: str, small: Scenario) -> None:
    run = run_designs(small, ["naive"], Options(redis_url=server_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert c.kills_mid_job == 5
    assert c.lost == 5
    assert c.done == 595
    assert c.interrupted == 5
    assert c.requeued == 0
    # The lost jobs are exactly the ones the kills interrupted.
    assert set(run.jobs["lost"]) == {k.job for k in run.kills}


@pytest.mark.slow
@pytest.mark.parametrize("design", ["naive", "reliable", "stream"])
def test_without_kills_every_job_runs_exactly_once(valkey_url: str, small: Scenario, design: str) -> None:
    sc = small.replace(kills=0)
    run = run_designs(sc, [design], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert c.done == c.enqueued == c.executions == 600
    assert (c.lost, c.duplicated, c.extra_executions, c.requeued, c.interrupted) == (0, 0, 0, 0, 0)


@pytest.mark.slow
def test_compare_uses_one_fault_schedule_for_every_design(valkey_url: str, small: Scenario) -> None:
    result = run_designs(small, ["naive", "reliable", "stream"], Options(redis_url=valkey_url), kind="compare")
    schedules = [[(k.index, k.planned_at, k.slot) for k in run.kills] for run in result.runs]
    assert schedules[0] == schedules[1] == schedules[2]
    assert len(schedules[0]) == 5
    again = run_designs(small, ["naive"], Options(redis_url=valkey_url)).runs[0]
    assert [(k.planned_at, k.slot) for k in again.kills] == [(k.planned_at, k.slot) for k in result.runs[0].kills]


def test_kills_on_the_clock_still_lose_nothing_with_reliable(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kill_when="any")
    run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    assert_evidence_agrees(run)
    assert run.counts.lost == 0
    assert run.counts.kills == 5
    assert run.counts.done == 600


@pytest.mark.slow
def test_kills_timed_from_the_drain_hit_idle_workers_after_it(valkey_url: str, small: Scenario) -> None:
    """after = "drained": the entry's kills wait for the queue to drain, then hit idle workers, each
    replacement's READY measured (the last one too); the mid-job kills from the start are as before."""
    entry = {"at": 0.1, "count": 3, "every": 0.1, "kill_when": "any", "after": "drained"}
    sc = small.replace(schedule=(entry,))
    run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    assert_evidence_agrees(run)
    c = run.counts
    assert (c.kills, c.kills_mid_job, c.done, c.lost, c.interrupted) == (8, 5, 600, 0, 5)
    later = [k for k in run.kills if k.index >= 5]
    last_end = max(ex.end for ex in run.timeline.executions if ex.end is not None)
    assert len(later) == 3 and all(k.at > last_end and not k.mid_job for k in later)
    assert all(k.replacement_ready_ms is not None for k in run.kills)
    assert [k.planned_at for k in later] == sorted(k.planned_at for k in later)


def test_kills_timed_from_the_drain_are_not_made_when_it_gives_up(valkey_url: str, small: Scenario) -> None:
    """A 1 s job and a 0.2 s drain window: the drain gives up (no handler started within it), so the
    queue never drained and a kill timed from its drain is never due."""
    entry = {"at": 0.1, "kill_when": "any", "after": "drained"}
    sc = small.replace(jobs=4, job_ms=1000, workers=1, kills=0, drain_timeout=0.2, schedule=(entry,))
    run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    assert not run.timings.drained and run.kills == [] and [f.after for f in run.schedule] == ["drained"]


def test_kills_on_the_clock_are_mid_job_only_when_the_victim_s_ledger_says_so(valkey_url: str, small: Scenario) -> None:
    """--kill-when any: a kill lands between jobs or inside one; mid-job is what the dead worker's ledger
    says (an execution it started and never ended), never an earlier look. naive loses every mid-job
    victim's job, and may lose more: a job popped but not yet started dies with its worker, unseen."""
    sc = small.replace(kill_when="any", kills=12, interval=0.05)
    run = run_designs(sc, ["naive"], Options(redis_url=valkey_url)).runs[0]
    assert_evidence_agrees(run)
    c = run.counts
    assert c.kills == 12
    assert c.kills_mid_job == c.interrupted
    assert {k.job for k in run.kills if k.mid_job} <= set(run.jobs["lost"])
    assert c.kills_mid_job <= c.lost <= c.kills


def test_a_broken_design_is_reported_with_exactly_the_faults_it_caused(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(jobs=100, kills=0)
    run = run_designs(sc, ["designs_broken:KnownFaultsQueue"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    # Its backlog() counts the pending list only, so the run "drained" with the parked jobs left over;
    # nothing delivers them after (the watch after the drain), so they are stranded, its own finding,
    # not a wrong backlog (designs_saboteur's ZeroBacklog is the lie).
    assert run.problems == [] and run.workdir is None
    assert c.enqueued == 100
    assert c.lost == 10
    assert c.duplicated == 10 and c.extra_executions == 10
    assert c.stranded == 10 and c.stranded_at == {"parked": 10}
    assert c.dead_lettered == 10
    assert c.unexpected == 1
    assert c.done == 70
    assert c.executions == 60 + 20 + 1
    assert sorted(run.duplicates) == [f"{i:06d}" for i in range(5, 100, 10)]


@pytest.mark.slow
def test_user_design_from_examples_survives_kills(valkey_url: str, small: Scenario) -> None:
    run = run_designs(small, ["examples.visibility_queue:VisibilityTimeoutQueue"], Options(redis_url=valkey_url)).runs[
        0
    ]
    assert_evidence_agrees(run)
    c = run.counts
    assert c.kills_mid_job == 5
    assert (c.done, c.lost, c.stranded, c.dead_lettered) == (600, 0, 0, 0)
    assert c.requeued == len({k.job for k in run.kills})
    assert c.requeue_events >= c.requeued > 0


def test_workers_that_crash_on_their_own_abort_the_run_with_their_error(valkey_url: str, small: Scenario) -> None:
    with pytest.raises(RunAborted, match="fetch is broken on purpose"):
        run_designs(small, ["designs_broken:FetchRaises"], Options(redis_url=valkey_url))


def test_an_exception_in_the_runner_still_stops_every_worker(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=0)
    with pytest.raises(UnexpectedError, match="backlog is broken on purpose") as info:
        run_designs(sc, ["designs_broken:BacklogRaises"], Options(redis_url=valkey_url))
    shutil.rmtree(info.value.message.rsplit("kept in ", 1)[1].strip())  # the evidence it kept
    # The autouse fixture checks that no worker outlived the exception.


def test_a_drain_still_making_progress_at_its_bound_reports_its_backlog_undrained(
    valkey_url: str, small: Scenario
) -> None:
    # One worker, 40 ms jobs, a 0.25 s window: a handler starts every 40 ms, so the window never runs
    # out (the worker would have to stall six jobs' time), and the bound (10 windows after the last
    # fault) stops the drain with most jobs waiting.
    sc = small.replace(jobs=150, job_ms=40, workers=1, kills=0, drain_timeout=0.25)
    run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert_evidence_agrees(run)
    assert run.timings.cut_off and not run.timings.drained
    assert c.stranded == 0 and c.stranded_at == {}
    assert c.undrained == c.enqueued - c.done - c.lost > 50
    assert c.lost == 0 and len(run.jobs["undrained"]) == c.undrained
