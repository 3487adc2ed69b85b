"""Failure semantics on real servers with real signals: poison jobs, retries with backoff, pauses,
graceful stops, long jobs with and without heartbeats inside the handler."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.model.workload import job_ids
from crashbench.run.session import Options, run_designs, run_sweep
from tests.conftest import assert_recounts


def check(run: DesignRun) -> None:
    assert run.problems == []
    c = run.counts
    assert c.done + c.dead_lettered + c.stranded + c.failed + c.lost == c.enqueued


@pytest.fixture
def failing(small: Scenario) -> Scenario:
    return small.replace(
        jobs=400, job_ms=1, kills=0, poison_rate=0.02, transient_rate=0.05, transient_failures=2,
        max_attempts=3, retry_base=0.02, retry_factor=2.0, recover_every=0.01,
    )  # fmt: skip


@pytest.mark.parametrize("design", ["reliable", "stream"])
def test_poison_is_dead_lettered_after_exactly_max_attempts_and_transients_succeed(
    valkey_url: str, failing: Scenario, design: str, tmp_path: Path
) -> None:
    result = run_designs(failing, [design], Options(redis_url=valkey_url))
    run = result.runs[0]
    check(run)
    assert_recounts(result, tmp_path)  # retries, delays and dead letters, read back from the timeline
    c = run.counts
    w = failing.workload_model()
    poison = {j for j in job_ids(failing.workload.jobs) if w.is_poison(j)}
    assert c.poison_jobs == len(poison) > 0 and c.transient_jobs > 0
    # Every poison job ran exactly max_attempts times, every transient job failed exactly twice.
    assert c.failed_attempts == 3 * c.poison_jobs + 2 * c.transient_jobs
    assert set(run.jobs["dead_lettered"]) == poison
    assert c.dead_lettered == c.dead_lettered_poison == len(poison)
    assert c.done == c.enqueued - len(poison)  # every transient job ended done
    assert (c.lost, c.failed, c.stranded) == (0, 0, 0)
    assert c.retried == c.poison_jobs + c.transient_jobs
    # No retry started before its backoff (base 20 ms, x2 per attempt) had passed.
    assert c.early_retries == 0


def test_naive_drops_every_failing_job(valkey_url: str, failing: Scenario) -> None:
    run = run_designs(failing, ["naive"], Options(redis_url=valkey_url)).runs[0]
    check(run)
    c = run.counts
    assert c.failed == c.failed_attempts == c.poison_jobs + c.transient_jobs
    assert (c.retried, c.dead_lettered, c.lost) == (0, 0, 0)


@pytest.mark.slow
def test_a_pause_longer_than_the_threshold_runs_the_job_twice_at_once(
    valkey_url: str, small: Scenario, tmp_path: Path
) -> None:
    # Two workers paused 0.05 s apart, both before recovery (0.2 s later) can give the first one's job to
    # anyone: a pause that landed later could freeze the worker running that job's second copy.
    pauses = tuple({"signal": "SIGSTOP", "at": at, "slot": slot, "pause": 0.6} for at, slot in ((0.2, 0), (0.25, 1)))
    # 30 ms jobs: a pause is mid-job by the injector's look at the frozen victim's ledger, which is
    # wrong only if the handler had taken its end time and not yet written it (crashbench.evidence.signaled
    # settles the verdict from the final ledger); longer jobs make that window a smaller share.
    sc = small.replace(jobs=300, job_ms=30, stale_after=0.2, kills=0, schedule=pauses)
    result = run_designs(sc, ["reliable", "stream", "naive"], Options(redis_url=valkey_url))
    assert_recounts(result, tmp_path)  # overlapping duplicates, from the timeline alone
    for run in result.runs:
        check(run)
        c = run.counts
        assert c.kills_mid_job == 2 and c.lost == 0 and c.interrupted == 0
        paused_jobs = {k.job for k in run.kills}
        if run.design == "naive":  # nothing takes the job back: it finishes late, once
            assert c.duplicated == 0
            continue
        assert c.duplicated_overlapping == c.duplicated == 2
        assert set(run.duplicates) == paused_jobs
        # Each job ran twice at once, and one of its two acks found nothing left: reliable's paused
        # owner's (recovery had moved it), or the stream's second (XACK does not check the owner).
        assert c.empty_acks == 2
        # Taken back once the heartbeat (or delivery), a few ms before the pause, is 0.2 s old.
        assert all(k.recovered_after_ms is not None and k.recovered_after_ms > 150 for k in run.kills), run.kills
        assert run.timings.recovery_ms_max is not None


@pytest.mark.slow
def test_sigterm_is_a_graceful_stop_that_loses_and_repeats_nothing(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(signal="SIGTERM")
    for run in run_designs(sc, ["naive", "reliable", "stream"], Options(redis_url=valkey_url)).runs:
        check(run)
        c = run.counts
        assert c.kills_mid_job == 5
        assert (c.lost, c.duplicated, c.interrupted, c.stranded) == (0, 0, 0, 0)
        assert c.done == c.enqueued


@pytest.mark.slow
def test_heartbeats_inside_long_jobs_prevent_the_duplicates(valkey_url: str, small: Scenario) -> None:
    # Every job takes 0.3 s, twice the 0.15 s threshold.
    sc = small.replace(jobs=8, job_ms=300, kills=0, stale_after=0.15, recover_every=0.03)
    for design in ("reliable", "stream"):
        result = run_sweep(sc, design, "heartbeat_every", "0,0.05", Options(redis_url=valkey_url))
        without, with_ = result.runs
        check(without)
        check(with_)
        assert (without.variant, with_.variant) == ("heartbeat_every=0", "heartbeat_every=0.05")
        assert without.counts.duplicated_overlapping >= 1, design
        assert with_.counts.duplicated == 0 and with_.counts.requeued == 0, design
        assert without.counts.lost == with_.counts.lost == 0


def test_a_kill_between_side_effect_and_ack_is_a_sequential_duplicate(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(job_ms=1, kill_when="any", jobs=300)
    run = run_designs(sc, ["designs_broken:SlowAckQueue"], Options(redis_url=valkey_url)).runs[0]
    check(run)
    c = run.counts
    assert c.lost == 0 and c.done == c.enqueued
    assert c.duplicated_sequential >= 1 and c.duplicated_overlapping == 0
