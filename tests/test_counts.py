"""Pure unit tests of counting: in-memory evidence, no server (counting, not survival)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crashbench.evidence.counts import count, total_queue
from crashbench.model.ledger import Execution
from crashbench.model.queue import DesignSettings, Located, QueueState, carry
from crashbench.model.results import SCHEMA
from crashbench.model.workload import Workload, job_ids
from crashbench.report import recount, store


def ex(job: str, done: bool = True, start: float = 1.0, failed: bool = False) -> Execution:
    return Execution(job, "w0", start, start + 1.0 if done or failed else None, failed=failed)


def where(held: dict[str, str] | None = None, dead: set[str] | None = None, failed: set[str] | None = None) -> Located:
    located = Located()
    for j, place in (held or {}).items():
        located.add(j, place)
    for j in dead or ():
        located.add(j, "dead", "dead")
    located.failed |= failed or set()
    return located


def test_each_enqueued_job_lands_in_exactly_one_outcome_class() -> None:
    enqueued = ["a", "b", "c", "d", "e", "f", "g"]
    executions = [ex("a"), ex("b"), ex("b", start=5.0), ex("c", done=False), ex("x"), ex("g", failed=True)]
    # "a" completed but is also still held and dead-lettered: done wins, it is counted once. "g"'s
    # last execution raised in a design that drops failed jobs.
    located = where({"a": "pending", "d": "processing:w1", "c": "pel:w2"}, dead={"a", "e"})
    queue = QueueState(requeued={"c", "zz"}, requeue_events=3)
    c, classes = count(enqueued, executions, located, queue, drops_failed=True, kills=2, kills_mid_job=1)
    assert (c.done, c.dead_lettered, c.stranded, c.failed, c.lost) == (2, 1, 2, 1, 1)
    assert classes == {
        "done": {"a", "b"},
        "dead_lettered": {"e"},
        "stranded": {"c", "d"},
        "undrained": set(),
        "failed": {"g"},
        "lost": {"f"},
        "unconfirmed": set(),
        "library_disagrees": set(),
        "duplicated": {"b"},  # not an outcome class: completed more than once
        "redelivered": {"b"},  # ... nor this: started again after a start that did not raise
        "taken_by_stop": set(),  # ... nor this: held before the workers were stopped, nowhere after
    }
    assert (c.failed_attempts, c.retried) == (1, 0)
    assert c.stranded_at == {"pel": 1, "processing": 1}
    assert (c.duplicated, c.extra_executions) == (1, 1)
    assert c.unexpected == 1  # "x" ran but was never enqueued
    assert (c.executions, c.interrupted) == (6, 1)
    assert (c.requeued, c.requeue_events) == (1, 3)  # "zz" is not ours


def test_redeliveries_come_from_the_ledger_and_retries_after_a_failure_are_not_among_them() -> None:
    """r: interrupted, then run again twice (a second loss of its ack): 2 redeliveries. s: failed, then
    retried and completed: a retry, no redelivery. t: failed, retried, interrupted, run again: 1. u: once.
    The design's own figures (3 requeue events for v, which never ran twice) decide nothing here."""
    runs = [
        ex("r", done=False, start=1.0), ex("r", start=2.0), ex("r", start=4.0),
        ex("s", failed=True, start=1.0), ex("s", start=3.0),
        ex("t", failed=True, start=1.0), ex("t", done=False, start=3.0), ex("t", start=5.0),
        ex("u"), ex("v"),
    ]  # fmt: skip
    c, classes = count(["r", "s", "t", "u", "v"], runs, where(), QueueState(requeued={"v"}, requeue_events=3))
    assert classes["redelivered"] == {"r", "t"}
    assert (c.redelivered, c.redeliveries, c.retried) == (2, 3, 2)
    assert (c.requeued, c.requeue_events) == (1, 3)  # the design's word, kept as it said


def test_poison_is_a_dead_letter_whose_last_execution_raised_whatever_the_design_says() -> None:
    # p failed and was dead-lettered: poison. k was killed, then dead-lettered by recovery: not poison,
    # though the design says it is. q failed once, then was killed and dead-lettered: not poison either.
    runs = [ex("p", failed=True), ex("k", done=False), ex("q", failed=True), ex("q", done=False, start=3.0)]
    c, _ = count(["p", "k", "q"], runs, where(dead={"p", "k", "q"}), QueueState(poisoned={"k"}))
    assert (c.dead_lettered, c.dead_lettered_poison) == (3, 1)


def test_the_design_s_state_decides_no_outcome() -> None:
    """Only the harness's reading (Located) places a job: a state() that claims "c" is held or "d" is
    dead-lettered changes nothing; both are lost."""
    queue = QueueState(held={"c": "pending"}, dead_lettered={"d"})
    c, classes = count(["a", "c", "d"], [ex("a")], where(), queue)
    assert classes["lost"] == {"c", "d"} and (c.stranded, c.dead_lettered) == (0, 0)


def test_a_job_that_failed_then_was_killed_in_its_retry_is_lost_not_failed() -> None:
    runs = [ex("j", failed=True), ex("j", done=False, start=3.0)]
    for drops in (True, False):
        c, classes = count(["j"], runs, where(), drops_failed=drops)
        assert classes["lost"] == {"j"} and c.failed == 0


def test_a_failed_job_that_vanished_is_lost_unless_the_design_drops_failed_jobs() -> None:
    runs = [ex("j", failed=True)]
    assert count(["j"], runs, where(), drops_failed=True)[1]["failed"] == {"j"}
    assert count(["j"], runs, where(), drops_failed=False)[1]["lost"] == {"j"}
    # ... or unless the library recorded it failed (its failed registry, read by the harness)
    assert count(["j"], [], where(failed={"j"}))[1]["failed"] == {"j"}


def test_total_queue_vocabulary() -> None:
    c, _ = count(["a", "b", "c"], [ex("a"), ex("a", start=3.0), ex("c"), ex("x")], where(), indeterminate={"c"})
    tq = total_queue(c)
    assert (tq.attempted, tq.acknowledged, tq.ok, tq.lost, tq.recovered, tq.unexpected, tq.duplicated) == (
        3, 2, 1, 1, 1, 1, 1,
    )  # fmt: skip
    assert not tq.valid
    clean, _ = count(["a"], [ex("a"), ex("a", start=3.0)], where())
    assert total_queue(clean).valid and not total_queue(clean, exactly_once=True).valid


def test_extra_executions_count_every_completion_beyond_the_first() -> None:
    c, _ = count(["a", "b"], [ex("a"), ex("a", start=3.0), ex("a", start=5.0), ex("b")], where())
    assert (c.done, c.duplicated, c.extra_executions, c.executions) == (2, 1, 2, 4)
    assert (c.duplicated_overlapping, c.duplicated_sequential) == (0, 1)


def test_duplicates_are_overlapping_when_two_completions_ran_at_once() -> None:
    # "a": 1.0-2.0 and 1.5-2.5 overlap (a live job taken over); "b": 1.0-2.0 then 3.0-4.0 do not.
    runs = [ex("a"), ex("a", start=1.5), ex("b"), ex("b", start=3.0)]
    c, _ = count(["a", "b"], runs, where())
    assert (c.duplicated, c.duplicated_overlapping, c.duplicated_sequential) == (2, 1, 1)


def test_failed_attempts_and_retries_come_from_the_ledger() -> None:
    poison = [ex("p", failed=True, start=t) for t in (1.0, 3.0, 6.0)]
    runs = [*poison, ex("t", failed=True), ex("t", start=4.0)]
    c, classes = count(["p", "t"], runs, where(dead={"p"}), QueueState(poisoned={"p"}))
    assert (c.failed_attempts, c.retried, c.done, c.dead_lettered, c.dead_lettered_poison) == (4, 2, 1, 1, 1)
    assert classes["done"] == {"t"} and classes["dead_lettered"] == {"p"}


def test_a_retry_sooner_than_its_backoff_is_counted() -> None:
    settings = DesignSettings(retry_base=1.0, retry_factor=2.0)
    # Fails 1.0-2.0; retried at 2.5 (0.5 s later, backoff 1 s: early), fails again 2.5-3.5, retried at
    # 6.0 (2.5 s later, backoff for attempt 2 is 2 s: fine).
    runs = [ex("j", failed=True), ex("j", failed=True, start=2.5), ex("j", start=6.0)]
    c, _ = count(["j"], runs, where(), settings=settings)
    assert (c.early_retries, c.retried, c.done) == (1, 1, 1)


def test_failing_jobs_are_a_deterministic_share_of_the_workload() -> None:
    w = Workload(poison_rate=0.01, transient_rate=0.05, seed=7)
    ids = job_ids(20_000)
    poison = [j for j in ids if w.is_poison(j)]
    transient = [j for j in ids if w.is_transient(j)]
    assert poison == [j for j in ids if Workload(poison_rate=0.01, transient_rate=0.05, seed=7).is_poison(j)]
    assert 150 < len(poison) < 250 and 850 < len(transient) < 1150
    assert not set(poison) & set(transient)
    assert all(w.fails(j, 99) for j in poison)
    assert all(w.fails(j, 1) and not w.fails(j, 2) for j in transient)
    other_seed = Workload(poison_rate=0.01, seed=8)
    assert poison != [j for j in ids if other_seed.is_poison(j)]


def test_broker_fault_counts_indeterminate_enqueues_and_lost_acks() -> None:
    # a: acknowledged, done before the fault (t=2), run again after the server came back (t=3): ack lost.
    # b: acknowledged, no trace: lost. c: indeterminate, done all the same: recovered. d: indeterminate,
    # no trace: unconfirmed, not lost (it may never have been stored).
    executions = [
        Execution("a", "w0", 0.5, 1.0),
        Execution("a", "w1", 3.5, 3.6),
        Execution("c", "w0", 2.5, 2.6),
    ]
    c, classes = count(["a", "b", "c", "d"], executions, where(), indeterminate={"c", "d"}, broker_fault=(2.0, 3.0))
    assert (classes["lost"], classes["unconfirmed"], classes["done"]) == ({"b"}, {"d"}, {"a", "c"})
    assert (c.lost, c.unconfirmed, c.indeterminate, c.recovered, c.acks_lost) == (1, 1, 2, 1, 1)
    assert c.duplicated == 1


def test_a_drain_cut_off_while_the_queue_still_ran_jobs_counts_its_backlog_undrained_not_stranded() -> None:
    located = where({"b": "queue", "c": "in-progress"})
    stuck, classes = count(["a", "b", "c"], [ex("a")], located)
    assert (stuck.stranded, stuck.undrained, classes["stranded"]) == (2, 0, {"b", "c"})
    cut, classes = count(["a", "b", "c"], [ex("a")], located, cut_off=True)
    assert (cut.stranded, cut.undrained, classes["undrained"], cut.stranded_at) == (0, 2, {"b", "c"}, {})


def test_library_disagrees_names_failures_of_completed_jobs_and_successes_never_completed() -> None:
    # "a" completed but the library recorded it failed (arq's job_timeout cancelled it while its
    # thread finished); "b" the library says succeeded with no end record; "c" failed on both sides.
    located = where(failed={"a", "c"})
    located.succeeded |= {"b", "d", "zz"}
    executions = [ex("a"), ex("c", failed=True), ex("d"), ex("b", done=False)]
    c, classes = count(["a", "b", "c", "d"], executions, located)
    assert (c.library_disagrees, classes["library_disagrees"]) == (2, {"a", "b"})
    agreeing, _ = count(["a", "d"], [ex("a"), ex("d")], where())
    assert agreeing.library_disagrees == 0


TIMELINED = [p for p in sorted(Path("results/readme").rglob("*.json")) if p.with_suffix(".timeline.jsonl.gz").exists()]


def test_the_readme_s_results_have_timelines_to_recount() -> None:
    assert len(TIMELINED) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("path", TIMELINED, ids=lambda p: str(p.relative_to("results/readme")))
def test_every_saved_result_with_a_timeline_recounts_to_what_the_code_of_its_day_saved(path: Path) -> None:
    """The README's result files were counted by the code of their day (before the counts moved to
    columns and job codes): counting their timelines again today gives every count, timing and id,
    and computing their verdict again from those gives their status, thresholds and summary. One test
    per file, so the test processes share them."""
    found = recount.verify(path, store.load(str(path)), path.parent)
    assert found.runs and found.reproduced, (path, [r.differences for r in found.runs], found.verdict)


def test_every_saved_result_without_a_timeline_has_the_verdict_its_saved_runs_give() -> None:
    """The older ones, saved before timelines (and the CI example's baseline, before summaries and
    the default thresholds): their counts cannot be recounted, their verdict is computed again."""
    saved = [*sorted(Path("results/readme").rglob("*.json")), Path("examples/ci/baseline.json")]
    files = {p: json.loads(p.read_text()) for p in saved}
    bare = [p for p, data in files.items() if data.get("schema") == SCHEMA and not data.get("timeline")]
    assert len(bare) >= 20
    for path in bare:
        found = recount.verify(path, store.load(str(path)), path.parent, need_timeline=False)
        assert found.unrecounted and found.reproduced, (path, found.verdict)


def test_a_job_the_stop_took_counts_where_it_was_held_before() -> None:
    """saq's stop cancels its sweep mid-abort, leaving the job in no list: read before the stop, it was
    in "active"; a job that completed during the stop, or that the after-reading has, is not carried."""
    enqueued = ["a", "b", "c", "d"]
    before = where({"a": "active", "b": "active", "c": "queued", "d": "queued"})
    after = where({"c": "queued"})
    located = carry(before, after, done=lambda j: j == "b")  # b completed as its worker stopped
    assert located.stopped == {"a", "d"} and located.held["a"] == ["active"]
    executions = [ex("b"), ex("a", done=False)]
    c, classes = count(enqueued, executions, located, QueueState(held={"c": "queued"}), kills=0, kills_mid_job=0)
    assert (c.done, c.stranded, c.lost, c.taken_by_stop) == (1, 3, 0, 2)
    assert classes["taken_by_stop"] == {"a", "d"} and c.stranded_at == {"active": 1, "queued": 2}
    # Without the reading before the stop, both would be lost: the harness would count its own doing.
    c, _ = count(
        enqueued, executions, where({"c": "queued"}), QueueState(held={"c": "queued"}), kills=0, kills_mid_job=0
    )
    assert (c.lost, c.taken_by_stop) == (2, 0)
