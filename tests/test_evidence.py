"""Each evidence check, fed contradictory evidence, fires and names the ids; fed consistent evidence, it
stays quiet. Pure unit tests: the evidence is built in memory (the saboteur tests run them for real)."""

from __future__ import annotations

import dataclasses

from crashbench.evidence.checks import Evidence, Redelivery, SignalFact, check, requeues
from crashbench.model.ledger import Execution, Executions, LedgerProblem
from crashbench.model.queue import Located, QueueState

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
        signals=[SignalFact("w1", "SIGKILL", True, "b")],
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


def test_a_job_the_stop_took_is_not_one_state_misses() -> None:
    """Held before the workers were stopped, nowhere after: state(), read after, cannot report it."""
    ev = consistent()
    ev.located.add("a", "active")
    ev.located.stopped.add("a")
    assert fired(ev) == {}
    ev.located.stopped.clear()
    assert fired(ev) == {"state_misses": ["a"]}


def test_a_job_stored_twice_or_in_two_places() -> None:
    ev = consistent()
    ev.located.add("c", "processing:w3")
    ev.located.add("d", "pending")
    ev.state.held["d"] = "pending"
    assert fired(ev) == {"held_twice": ["c", "d"]}


def test_a_place_named_with_braces_is_quoted_as_it_is() -> None:
    """Key names carry the run's hash tag, crashbench:{token}:...; a message quoting one must not be
    read as a format string (saq:reliable's run ended in a KeyError on one)."""
    ev = consistent()
    ev.located.add("c", "saq:crashbench:{2e9f565b}:0-saq:queued")
    [problem] = check(ev)
    assert problem.check == "held_twice" and "{2e9f565b}" in problem.message and problem.message.startswith("1 ")


def test_drained_with_jobs_still_waiting() -> None:
    ev = dataclasses.replace(consistent(), drained=True)
    assert fired(ev) == {"backlog_wrong": ["c"]}
    ev.located.delayed.add("c")  # a delayed retry is not backlog the drain should have waited for
    assert fired(ev) == {}


def test_held_jobs_nothing_delivers_after_the_drain_are_no_wrong_backlog() -> None:
    """With the watch after the drain: c, held and never started again, is stranded, not a lie."""
    ev = dataclasses.replace(consistent(), drained=True, drained_at=5.0, settled_at=5.2, backlog_after=0)
    assert fired(ev) == {}


def test_a_job_started_in_the_watch_after_the_drain_is_a_wrong_backlog() -> None:
    ev = dataclasses.replace(consistent(), drained=True, drained_at=5.0, settled_at=5.2, backlog_after=0)
    ev.executions = [*ev.executions, ex("c", "w2", start=5.1, end=5.15)]
    ev.state.held.pop("c")
    ev.located = Located()
    ev.located.add("d", "dead", "dead")
    assert fired(ev) == {"backlog_wrong": ["c"]}
    ev.executions[-1] = ex("c", "w2", start=5.3, end=5.35)  # after the watch: the workers were being stopped
    assert fired(ev) == {}
    ev.executions[-1] = ex("c", "w2", start=5.1, end=5.15)
    ev.held_at_drain = ["c"]  # Redis held it as the drain ended: backlog() did not count it
    assert fired(ev) == {"backlog_wrong": ["c"]}
    ev.held_at_drain = []  # a worker had taken it already (read ahead, waiting for a thread): no lie
    assert fired(ev) == {}


def test_a_backlog_that_comes_back_above_zero_is_a_wrong_backlog() -> None:
    ev = dataclasses.replace(consistent(), drained=True, drained_at=5.0, settled_at=5.2, backlog_after=1)
    assert [(p.check, p.ids) for p in check(ev)] == [("backlog_wrong", [])]
    assert "said 1 again" in check(ev)[0].message


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
    ev.signals = [SignalFact("w2", "SIGKILL", True, "b")]
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


def requeue_check(
    state: QueueState, runs: list[Execution], located: Located | None = None, **kw: object
) -> dict[str, list[str]]:
    """The requeue and poison checks (crashbench.evidence.checks.requeues): the ledger's redeliveries
    are computed here by hand, as counting would give them."""
    found = Executions.of(runs)
    starts: dict[str, list[Execution]] = {}
    for e in found:
        starts.setdefault(e.job, []).append(e)
    again = {j: sum(1 for e in sorted(es, key=lambda e: e.start)[:-1] if not e.failed) for j, es in starts.items()}
    r = Redelivery(
        redelivered={j for j, n in again.items() if n}, redeliveries=sum(again.values()),
        first_fault=float(kw.get("first_fault", 1.5)), faults=int(kw.get("faults", 1)), batch=int(kw.get("batch", 1)),
        counts_requeues=bool(kw.get("counts_requeues", True)), broker_fault=bool(kw.get("broker_fault", False)),
    )  # fmt: skip
    return {p.check: p.ids for p in requeues(state, IDS, found, located or Located(), r)}


# b: killed in its first execution at 1.5, run again at 3.0: one redelivery, requeued.
B_TWICE = [ex("a"), ex("b", "w1", end=None), ex("b", "w2", start=3.0, end=4.0)]


def test_requeue_figures_that_match_the_ledger_raise_nothing() -> None:
    assert requeue_check(QueueState(requeued={"b"}, requeue_events=1), B_TWICE) == {}
    # c was fetched by the victim and never started there: its only start follows the fault.
    runs = [*B_TWICE, ex("c", "w2", start=2.0, end=2.5)]
    assert requeue_check(QueueState(requeued={"b", "c"}, requeue_events=2), runs) == {}
    held = Located()
    held.add("d", "pending")  # given back, not yet run again
    assert requeue_check(QueueState(requeued={"b", "d"}, requeue_events=2), B_TWICE, held) == {}


def test_requeue_events_beyond_what_the_ledger_allows() -> None:
    found = requeue_check(QueueState(requeued={"b"}, requeue_events=300), B_TWICE)
    assert set(found) == {"requeue_events_unfounded"}


def test_a_job_reported_requeued_that_ran_once_before_any_fault() -> None:
    assert requeue_check(QueueState(requeued={"a", "b"}, requeue_events=2), B_TWICE) == {"requeue_unfounded": ["a"]}
    # ... or never ran at all and is held nowhere
    assert requeue_check(QueueState(requeued={"b", "d"}, requeue_events=2), B_TWICE) == {"requeue_unfounded": ["d"]}


def test_more_jobs_reported_requeued_after_a_fault_than_it_could_have_left_fetched() -> None:
    runs = [*B_TWICE, ex("c", start=2.0, end=2.5), ex("d", start=2.0, end=2.5)]
    state = QueueState(requeued={"b", "c", "d"}, requeue_events=3)
    assert requeue_check(state, runs, batch=2) == {}
    assert requeue_check(state, runs, batch=1) == {"requeue_unfounded": ["c", "d"]}


def test_a_design_that_reports_requeues_and_misses_a_redelivery() -> None:
    found = requeue_check(QueueState(), B_TWICE)
    assert found == {"requeue_missed": ["b"], "requeue_events_below_redeliveries": []}
    assert requeue_check(QueueState(), B_TWICE, counts_requeues=False) == {}  # a design that does not say
    assert requeue_check(QueueState(), B_TWICE, broker_fault=True) == {}  # a lost ack brings a job back unrequeued


def test_poison_reported_for_a_job_whose_handler_never_raised() -> None:
    runs = [*B_TWICE, ex("c", failed=True)]
    state = QueueState(requeued={"b"}, requeue_events=1, poisoned={"a", "c"})
    assert requeue_check(state, runs) == {"poison_unfounded": ["a"]}


def test_a_family_event_that_names_slots_is_a_fault_the_requeue_check_allows_for() -> None:
    """A host partition cut two workers off mid-fetch: the job the server moved to one of them was given
    back and ran once, after the partition. The tally counts the event (its "slots") as a fault on each
    slot; without the event the same job is a requeue nothing could have caused, and the check fires."""
    from crashbench.evidence.tally import _redelivery
    from crashbench.model.counts import Counts
    from crashbench.model.spec import Scenario
    from crashbench.model.timeline import DesignFlags, FaultEvent, Timeline

    tl = Timeline(0, "reliable", "", "p:", 0, Scenario().to_dict(), DesignFlags(counts_requeues=True), 0.0, 0.0, 1.0)
    classes = {"redelivered": set()}
    quiet = _redelivery(tl, Scenario(), Counts(), classes)
    tl.fault_events.append(FaultEvent("hosts", "partition", 0.3, {"index": 0, "host": 1, "slots": [2, 3]}))
    tl.fault_events.append(FaultEvent("hosts", "heal", 0.9, {"index": 0, "host": 1}))
    cut = _redelivery(tl, Scenario(), Counts(), classes)
    assert (cut.first_fault, cut.faults) == (0.3, 2) and quiet.faults == 0
    runs = Executions.of([ex("c", "w0", start=1.2, end=1.25)])
    state = QueueState(requeued={"c"}, requeue_events=1)
    assert [p.check for p in requeues(state, IDS, runs, Located(), cut)] == []
    fired = requeues(state, IDS, runs, Located(), quiet)
    assert {p.check for p in fired} == {"requeue_unfounded", "requeue_events_unfounded"}
