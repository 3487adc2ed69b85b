"""How the workers around a sentinel fault are told (crashbench.faults.sentinel.liveness): the handlers
running as the primary died and whether their jobs ran again, each slot's resume after the promotion,
stuck slots, and a promotion while the quorum was lost. Pure counting on a hand-made timeline; the real
faults are in test_sentinel.py."""

from __future__ import annotations

from types import SimpleNamespace

from crashbench.faults.sentinel.liveness import settle
from crashbench.model.faults import BrokerFaultRecord
from crashbench.report.render import promotion_resumed

SLOTS = {"w0": 0, "w1": 1, "w2": 2}


def _timeline(runs: list[tuple[str, str, float, float | None]], pending_after: float | None = None) -> SimpleNamespace:
    """Executions as (job, worker, start, end); a depth reading with pending jobs at `pending_after`."""
    executions = [SimpleNamespace(job=j, worker=w, start=s, end=e) for j, w, s, e in runs]
    depth = [SimpleNamespace(t=pending_after, pending=3)] if pending_after is not None else []
    return SimpleNamespace(executions=executions, depth=depth, slot_of=lambda: SLOTS)


def _record(kind: str = "sentinel-kill", back_at: float | None = 4.0, quorum_back_at: float | None = None):
    return BrokerFaultRecord(kind, "none", 1.5, 10, [], 100, back_at=back_at, quorum_back_at=quorum_back_at)


def test_the_handlers_running_at_the_kill_are_counted_and_those_that_ran_again() -> None:
    tl = _timeline([
        ("a", "w0", 1.2, 1.6),  # running at 1.5, ended after: mid-job, and ran again below
        ("b", "w1", 1.3, None),  # running at 1.5, never ended
        ("c", "w2", 1.0, 1.4),  # done before the kill: not mid-job
        ("a", "w1", 4.1, 4.2), ("d", "w0", 4.05, 4.1), ("e", "w2", 4.3, 4.4),
    ])  # fmt: skip
    settled, counts = settle(_record(), tl, 3)  # type: ignore[arg-type]
    assert counts == {"mid_job_at_fault": 2, "mid_job_ran_again": 1}
    assert settled.slot_resume_ms == [50.0, 100.0, 300.0] and settled.stuck == []
    assert "0.30 s after the promotion at the latest" in promotion_resumed(settled)


def test_a_slot_that_never_runs_a_job_after_the_promotion_while_others_do_is_stuck() -> None:
    settled, _ = settle(_record(), _timeline([("d", "w0", 4.05, 4.1), ("x", "w1", 1.0, 1.1)]), 3)  # type: ignore[arg-type]
    assert settled.slot_resume_ms == [50.0, None, None] and settled.stuck == [1, 2]
    assert "not every worker ran a job" in promotion_resumed(settled)


def test_no_slot_is_stuck_when_nothing_waited_and_every_slot_is_when_the_harness_read_pending_jobs() -> None:
    idle, _ = settle(_record(), _timeline([("x", "w0", 1.0, 1.1)]), 3)  # type: ignore[arg-type]
    assert idle.stuck == []  # the queue was empty after the promotion: nobody had anything to do
    waiting, _ = settle(_record(), _timeline([("x", "w0", 1.0, 1.1)], pending_after=5.0), 3)  # type: ignore[arg-type]
    assert waiting.stuck == [0, 1, 2]


def test_a_promotion_before_the_quorum_was_back_is_counted_and_one_after_is_not() -> None:
    tl = _timeline([])
    _, held = settle(_record("sentinel-quorum", back_at=6.7, quorum_back_at=4.5), tl, 3)  # type: ignore[arg-type]
    _, early = settle(_record("sentinel-quorum", back_at=3.0, quorum_back_at=4.5), tl, 3)  # type: ignore[arg-type]
    _, never_back = settle(_record("sentinel-quorum", back_at=3.0), tl, 3)  # type: ignore[arg-type]
    assert held["promoted_without_quorum"] == 0
    assert early["promoted_without_quorum"] == 1 and never_back["promoted_without_quorum"] == 1
    _, kill = settle(_record("sentinel-kill", back_at=3.0), tl, 3)  # type: ignore[arg-type]
    assert "promoted_without_quorum" not in kill  # no quorum was lost: nothing to say
