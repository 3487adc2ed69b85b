"""Each evidence check, fed contradictory evidence, fires and names the ids; fed consistent evidence, it
stays quiet. Pure unit tests: the evidence is built in memory (the saboteur tests run them for real)."""

from __future__ import annotations

import dataclasses

from crashbench.designs import Located, QueueState
from crashbench.evidence.checks import Evidence, KillFact, check
from crashbench.evidence.ledger import Execution, LedgerProblem

IDS = ["a", "b", "c", "d"]


def ex(job: str, worker: str = "w0", start: float = 1.0, end: float | None = 2.0, failed: bool = False) -> Execution:
    return Execution(job, worker, start, end, failed=failed)


def consistent() -> Evidence:
    """a, b done; c held in pending (and reported); d dead-lettered (and reported); w1 killed inside b's
    first execution, which ran again."""
    located = Located()
    located.add("c", "pending")
    located.add("d", "dead", "dead")
    return Evidence(
        enqueued=IDS,
        executions=[ex("a"), ex("b", "w1", end=None), ex("b", "w2", start=3.0, end=4.0)],
        located=located,
        state=QueueState(held={"c": "pending"}, dead_lettered={"d"}, requeued={"b"}, requeue_events=1),
        drained=False,
        own_worker=False,
        kills=[KillFact("w1", "SIGKILL", True, "b")],
    )


def fired(ev: Evidence) -> dict[str, list[str]]:
    return {p.check: p.ids for p in check(ev)}


def test_consistent_evidence_raises_nothing() -> None:
    assert check(consistent()) == []


def test_state_claiming_what_redis_does_not_hold() -> None:
    ev = consistent()
    ev.state.held["a"] = "pending"
    ev.state.dead_lettered.add("b")
    assert fired(ev) == {"state_claims_absent": ["a"], "state_claims_dead": ["b"]}


def test_redis_holding_what_state_does_not_report() -> None:
    ev = consistent()
    ev.located.add("a", "hidden")
    ev.located.add("b", "graveyard", "dead")
    assert fired(ev) == {"state_misses": ["a"], "state_misses_dead": ["b"]}


def test_a_job_stored_twice_or_in_two_places() -> None:
    ev = consistent()
    ev.located.add("c", "processing:w3")
    ev.located.add("d", "pending")
    ev.state.held["d"] = "pending"
    assert fired(ev) == {"held_twice": ["c", "d"]}


def test_drained_with_jobs_still_waiting() -> None:
    ev = dataclasses.replace(consistent(), drained=True)
    assert fired(ev) == {"backlog_wrong": ["c"]}
    ev.located.delayed.add("c")  # a delayed retry is not backlog the drain should have waited for
    assert fired(ev) == {}


def test_ids_in_redis_that_were_never_enqueued() -> None:
    ev = consistent()
    ev.located.add("zz", "pending")
    ev.state.held["zz"] = "pending"
    assert fired(ev) == {"never_enqueued": ["zz"]}


def test_requeued_jobs_without_as_many_requeue_events() -> None:
    ev = consistent()
    ev.state.requeued |= {"a", "c"}
    assert fired(ev) == {"requeue_events_below": ["a", "b", "c"]}


def test_failed_without_a_failure_record_only_where_crashbench_runs_the_handler() -> None:
    ev = consistent()
    ev.state.failed.add("a")
    assert fired(ev) == {"failed_without_record": ["a"]}
    assert fired(dataclasses.replace(ev, own_worker=True)) == {}  # a library may fail a killed job itself
    ev.executions = [*ev.executions, ex("a", start=5.0, end=6.0, failed=True)]
    assert fired(ev) == {}


def test_a_mid_job_kill_whose_victim_finished_the_job() -> None:
    ev = consistent()
    ev.executions = [ex("a"), ex("b", "w1"), ex("b", "w2", start=3.0, end=4.0)]  # w1's run of b ended
    assert fired(ev) == {"kill_without_open_execution": ["b"], "interrupted_below_kills": []}


def test_a_kill_record_naming_another_workers_open_execution() -> None:
    ev = consistent()
    ev.kills = [KillFact("w2", "SIGKILL", True, "b")]
    assert fired(ev) == {"kill_without_open_execution": ["b"]}


def test_ledger_anomalies_become_problems() -> None:
    ev = consistent()
    ev.ledger_problems = [LedgerProblem("orphan_end", "w0", "a", "an end with no start")]
    assert fired(ev) == {"ledger_orphan_end": ["a"]}


def test_enqueues_both_acknowledged_and_indeterminate_or_neither() -> None:
    ev = dataclasses.replace(consistent(), acknowledged={"a", "b", "c"}, indeterminate={"c"})
    assert fired(ev) == {"enqueue_both": ["c"], "enqueue_unaccounted": ["d"]}
    ev = dataclasses.replace(consistent(), acknowledged={"a", "b", "c", "d", "x"}, indeterminate=set())
    assert fired(ev) == {"enqueue_extra": ["x"]}


def test_state_with_a_location_that_is_not_a_string() -> None:
    ev = consistent()
    ev.state.held["c"] = 3  # type: ignore[assignment]
    assert fired(ev) == {"state_types": ["'c'"]}
