"""Saboteur designs on a real server with real SIGKILLs: the counts must come out exactly as planted,
ids included, and a design whose own report lies must be caught by the evidence checks."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import redis
from designs_saboteur import PHANTOMS, GhostState, planted

from crashbench.errors import UnexpectedError
from crashbench.model.spec import Scenario
from crashbench.model.workload import job_ids
from crashbench.run.session import Options, run_designs
from crashbench.scenario import with_overrides
from tests import independent


def checks(run) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """The checks that fired, with their ids; the work directory a broken run keeps is removed."""
    if run.workdir:
        shutil.rmtree(run.workdir)
    return {p.check: p.ids for p in run.problems}


@pytest.mark.parametrize("kills, seed", [(0, 1), (5, 1), (5, 2)])
def test_saboteur_counts_come_out_exactly_as_planted(valkey_url: str, small: Scenario, kills: int, seed: int) -> None:
    sc = small.replace(kills=kills, seed=seed)
    run = run_designs(sc, ["designs_saboteur:SaboteurQueue"], Options(redis_url=valkey_url)).runs[0]
    plant = planted(job_ids(sc.workload.jobs))
    c = run.counts
    assert set(run.jobs["lost"]) == plant["lost"] and c.lost == len(plant["lost"]) == 30
    assert set(run.duplicates) == plant["duplicated"] and c.duplicated == 30
    assert set(run.jobs["stranded"]) == plant["parked"] | plant["hidden"] and c.stranded == 60
    assert c.stranded_at == {"hidden": 30, "parked": 30}
    assert set(run.jobs["dead_lettered"]) == plant["dead_lettered"] and c.dead_lettered == 30
    assert c.unexpected == len(PHANTOMS)
    assert c.done == 600 - 30 * 4
    assert (c.kills_mid_job, c.interrupted) == (kills, kills)
    # The design's report hides one list; the jobs pushed twice ran again with no requeue it reported
    # (it says it reports them all): exactly those checks fire. Its backlog() ignores both lists, but
    # nothing delivers them after the drain: stranded there, no backlog_wrong.
    hit = {k.job for k in run.kills}
    found = checks(run)
    assert set(found) == {"state_misses", "requeue_missed", "requeue_events_below_redeliveries"}
    assert set(found["state_misses"]) == plant["hidden"]
    # (a planted duplicate a kill also interrupted was given back by the reaper: requeued, reported)
    assert set(found["requeue_missed"]) == plant["duplicated"] - hit
    assert (c.redelivered, c.redeliveries, c.requeue_events) == (len(plant["duplicated"] | hit), 30 + kills, kills)
    assert run.total_queue is not None and not run.total_queue.valid


def test_a_state_that_claims_jobs_it_does_not_hold_is_named(valkey_url: str, small: Scenario) -> None:
    run = run_designs(small, ["designs_saboteur:GhostState"], Options(redis_url=valkey_url)).runs[0]
    assert run.workdir is not None and Path(run.workdir, "ledger").is_dir()  # the evidence is kept
    found = checks(run)
    assert found["state_claims_absent"] == list(GhostState.GHOSTS)
    assert found["state_claims_dead"] == list(GhostState.DEAD_GHOSTS)
    # The lie changes no count: what the kills took is lost, not stranded or dead-lettered.
    c = run.counts
    assert (c.lost, c.stranded, c.dead_lettered) == (c.kills_mid_job, 0, 0) == (5, 0, 0)


def test_a_backlog_that_always_says_zero_is_caught(valkey_url: str, small: Scenario) -> None:
    # One worker: the drain ends (backlog() says 0) at its first look between two of the worker's jobs,
    # which comes within a few jobs; four workers are seldom all between jobs at once, and the drain
    # could wait through most of the queue. 600 jobs of 10 ms: 2 s of margin before 200 are done.
    sc = small.replace(kills=0, workers=1)
    run = run_designs(sc, ["designs_saboteur:ZeroBacklog"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    assert run.timings.drained  # it believed its backlog() ...
    assert c.stranded > 400 and c.done + c.stranded == 600  # ... and the snapshot shows the truth
    # Its workers kept delivering after the drain: the jobs started in the watch are named, and in the
    # ledger they are one unbroken stretch of the starts (the watch's), none of them left stranded.
    assert run.workdir is not None
    starts = sorted(independent.read_ledgers(Path(run.workdir, "ledger")).runs, key=lambda r: r.start)
    named = checks(run)["backlog_wrong"]  # (and the kept workdir goes)
    order = [independent.number(r.job) for r in starts]  # the ledger holds the wire ids
    at = sorted(order.index(int(j)) for j in named)
    assert named and at == list(range(at[0], at[0] + len(named)))
    assert not set(named) & set(run.jobs["stranded"])


def test_jobs_the_workers_stop_takes_count_where_they_were_held_before(valkey_url: str, small: Scenario) -> None:
    """Redis is read before the workers are stopped, and after: the parked jobs their stop deleted are
    stranded at "parked" (taken_by_stop), not lost, and no check fires (state(), read after the stop,
    cannot report them)."""
    sc = small.replace(kills=0)
    run = run_designs(sc, ["designs_saboteur:StopTakesParked"], Options(redis_url=valkey_url)).runs[0]
    parked = {j for j in job_ids(sc.workload.jobs) if int(j) % 10 == 7}
    c = run.counts
    assert run.problems == []
    assert (c.lost, c.stranded, c.taken_by_stop, c.done) == (0, 60, 60, 540) and c.stranded_at == {"parked": 60}
    assert set(run.jobs["stranded"]) == set(run.jobs["taken_by_stop"]) == set(sorted(parked)[:100])


def test_requeues_without_requeue_events_are_caught(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=0)
    run = run_designs(sc, ["designs_saboteur:InflatedRequeues"], Options(redis_url=valkey_url)).runs[0]
    # Reported requeued by no requeue event, and never started again, held or dead-lettered either.
    ids = ["000001", "000002", "000003"]
    assert checks(run) == {"requeue_events_below": ids, "requeue_unfounded": ids}


@pytest.mark.slow
def test_requeue_events_the_ledger_cannot_account_for_are_caught(valkey_url: str, small: Scenario) -> None:
    # 1,200 jobs: work left for the fifth mid-job kill however late a loaded machine runs it.
    sc = with_overrides(small, jobs=1200)
    run = run_designs(sc, ["designs_saboteur:InflatedRequeueEvents"], Options(redis_url=valkey_url)).runs[0]
    assert run.counts.requeue_events == 100 * run.counts.redeliveries == 500
    assert set(checks(run)) == {"requeue_events_unfounded"}


def test_requeues_the_design_does_not_report_are_caught(valkey_url: str, small: Scenario) -> None:
    """Its reaper gives back every job the five kills interrupted; its state() says none: the ledger
    names exactly the interrupted jobs, each of which ran again."""
    run = run_designs(small, ["designs_saboteur:SilentRequeues"], Options(redis_url=valkey_url)).runs[0]
    c = run.counts
    # Two kills may hit one job (run again, then interrupted again): redelivered counts jobs.
    hit = {k.job for k in run.kills}
    assert (c.interrupted, c.redeliveries, c.requeue_events) == (5, 5, 0) and c.redelivered == len(hit)
    found = checks(run)
    assert set(found) == {"requeue_missed", "requeue_events_below_redeliveries"}
    assert set(found["requeue_missed"]) == {k.job for k in run.kills}


def test_poison_for_jobs_that_never_failed_is_caught(valkey_url: str, small: Scenario) -> None:
    run = run_designs(small, ["designs_saboteur:PoisonClaims"], Options(redis_url=valkey_url)).runs[0]
    assert run.counts.dead_lettered_poison == 0
    assert checks(run) == {"poison_unfounded": ["000004", "000005", "000006"]}


def test_a_location_that_is_not_a_string_is_a_problem_not_a_crash(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=0)
    run = run_designs(sc, ["designs_saboteur:BadLocation"], Options(redis_url=valkey_url)).runs[0]
    assert "state_types" in checks(run)


def test_a_design_that_raises_is_an_unexpected_error_with_its_workdir_kept(valkey_url: str, small: Scenario) -> None:
    sc = small.replace(kills=0)
    with pytest.raises(UnexpectedError) as info:
        run_designs(sc, ["designs_saboteur:StateRaises"], Options(redis_url=valkey_url))
    message = info.value.message
    assert "ZeroDivisionError: state is broken on purpose" in message
    assert "designs_saboteur.py" in message and "in state" in message
    assert "kept in" in message
    kept = message.rsplit("kept in ", 1)[1].strip()
    assert (Path(kept) / "ledger").is_dir()
    shutil.rmtree(kept)


@pytest.mark.slow
@pytest.mark.parametrize("kills", [0, 5])
def test_jobs_deleted_from_redis_by_another_process_are_exactly_the_lost_ones(
    valkey_url: str, small: Scenario, kills: int
) -> None:
    """Nothing in the design knows: a client outside the run removes ten known jobs from the pending
    list right after the enqueue, before any worker can reach them (they are the last in line)."""
    sc = small.replace(kills=kills)
    victims = [f"{n:06d}" for n in range(590, 600)]
    removed: list[int] = []
    client = redis.Redis.from_url(valkey_url, decode_responses=True)

    def delete() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not removed:
            for key in client.scan_iter("crashbench:*reliable:pending"):
                if client.llen(key) >= 500:  # the ids carry the run's token: found by the payload's number
                    for raw in client.lrange(key, 0, -1):
                        if f"{json.loads(json.loads(raw)['payload'])['n']:06d}" in victims:
                            removed.append(client.lrem(key, 1, raw))
            time.sleep(0.001)

    thread = threading.Thread(target=delete)
    thread.start()
    try:
        run = run_designs(sc, ["reliable"], Options(redis_url=valkey_url)).runs[0]
    finally:
        thread.join()
        client.close()
    assert removed == [1] * 10
    assert sorted(run.jobs["lost"]) == victims and run.counts.lost == 10
    assert run.counts.done == 590 and run.problems == []


def test_a_job_id_with_a_space_crashes_one_worker_with_a_clear_error_not_the_run(
    valkey_url: str, small: Scenario
) -> None:
    sc = small.replace(kills=0)
    run = run_designs(sc, ["designs_saboteur:SpacedId"], Options(redis_url=valkey_url)).runs[0]
    assert run.counts.worker_crashes == 1 and run.counts.done == 600
    assert "job id 'a b' contains whitespace" in run.worker_exits[0].log_tail
