"""Pure unit tests of counting: in-memory evidence, no server (counting, not survival)."""

from __future__ import annotations

from crashbench.counts import Counts, count
from crashbench.designs import QueueState
from crashbench.ledger import Execution


def ex(job: str, done: bool = True, worker: str = "w0") -> Execution:
    return Execution(job, worker, 1.0, 2.0 if done else None)


def test_each_enqueued_job_lands_in_exactly_one_outcome_class() -> None:
    enqueued = ["a", "b", "c", "d", "e", "f"]
    executions = [ex("a"), ex("b"), ex("b"), ex("c", done=False), ex("x")]
    # "a" completed but is also still held and dead-lettered: done wins, it is counted once.
    queue = QueueState(
        held={"a": "pending", "d": "processing:w1", "c": "pel:w2"},
        dead_lettered={"a", "e"},
        requeued={"c", "zz"},
        requeue_events=3,
    )
    c, classes = count(enqueued, executions, queue, kills=2, kills_mid_job=1)
    assert (c.done, c.dead_lettered, c.stranded, c.lost) == (2, 1, 2, 1)
    assert classes == {"done": {"a", "b"}, "dead_lettered": {"e"}, "stranded": {"c", "d"}, "lost": {"f"}}
    assert c.stranded_at == {"pel": 1, "processing": 1}
    assert (c.duplicated, c.extra_executions) == (1, 1)
    assert c.unexpected == 1  # "x" ran but was never enqueued
    assert (c.executions, c.interrupted) == (5, 1)
    assert (c.requeued, c.requeue_events) == (1, 3)  # "zz" is not ours
    assert c.problems() == []


def test_problems_catch_counts_that_do_not_add_up() -> None:
    c = Counts(enqueued=10, done=8, lost=1, stranded=0, kills=1, kills_mid_job=2, stranded_at={"pending": 1})
    problems = c.problems()
    assert any("not enqueued 10" in p for p in problems)
    assert any("locations add up to 1" in p for p in problems)
    assert any("mid-job 2 > kills 1" in p for p in problems)


def test_extra_executions_count_every_completion_beyond_the_first() -> None:
    c, _ = count(["a", "b"], [ex("a"), ex("a"), ex("a"), ex("b")], QueueState())
    assert (c.done, c.duplicated, c.extra_executions, c.executions) == (2, 1, 2, 4)
