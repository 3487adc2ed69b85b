"""A fault's verdict settled from the final ledger and the handlers' own times (crashbench.evidence.signaled),
on executions made by hand: the races of issue 25 item 4, each with a known answer."""

from __future__ import annotations

import math
import signal

import pytest

from crashbench.evidence.signaled import caught, recovery_ms, settle
from crashbench.model.executions import Execution, Executions
from crashbench.model.faults import SignalRecord
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs


def kill(signal: str, at: float, claimed: list[str], worker: str = "w0", child: int = 0) -> SignalRecord:
    """A record as the injector wrote it: `claimed` is its look at the ledger, which may be stale."""
    return SignalRecord(
        index=0, planned_at=at, at=at, slot=0, worker=worker, pid=100, signal=signal, target="worker",
        mid_job=bool(claimed), job=claimed[-1] if claimed else None, waited_ms=0.0, replacement=None,
        jobs=list(claimed), child=child,
    )  # fmt: skip


def test_a_handler_that_returned_before_the_pause_is_not_caught_although_its_end_was_written_after() -> None:
    # The handler of 000001 took its end time 0.4 ms before the freeze; its end record was written only
    # after the pause (the injector saw it open). It finished once, where it was: not interrupted.
    runs = Executions.of(
        [Execution("000001", "w0", 1.000, 1.0096, pid=100), Execution("000002", "w0", 1.2, 1.21, pid=100)]
    )
    (k,) = settle([kill("SIGSTOP", 1.010, ["000001"])], runs)
    assert (k.mid_job, k.job, k.jobs) == (False, None, [])
    assert recovery_ms(k, [runs[0]]) is None


def test_a_pause_inside_a_handler_is_caught_and_the_job_finished_where_it_was() -> None:
    runs = Executions.of([Execution("000001", "w0", 1.000, 1.060, pid=100)])
    (k,) = settle([kill("SIGSTOP", 1.010, [])], runs)  # whatever the look said, the times say inside
    assert (k.mid_job, k.job, k.jobs) == (True, "000001", ["000001"])
    assert recovery_ms(k, list(runs)) is None


def test_a_fatal_signal_catches_what_never_ended_and_not_what_ended_before_it() -> None:
    # SIGQUIT under kill_when "any": the look was taken while 000003 was still open; it ended before the
    # signal's time. 000004 started before and never ended: the victim died inside it. 000005 is the
    # replacement's, later.
    runs = Executions.of([
        Execution("000003", "w0", 2.000, 2.004, pid=100),
        Execution("000004", "w0", 2.0045, None, pid=100),
        Execution("000004", "w1", 2.300, 2.310, pid=101),
        Execution("000005", "w1", 2.006, 2.016, pid=101),
    ])  # fmt: skip
    (k,) = settle([kill("SIGQUIT", 2.005, ["000003"])], runs)
    assert (k.mid_job, k.job, k.jobs) == (True, "000004", ["000004"])
    assert recovery_ms(k, [runs[1], runs[2]]) == 295.0


def test_a_graceful_stop_catches_the_handler_it_lets_finish() -> None:
    runs = Executions.of([Execution("000007", "w0", 3.0, 3.5, pid=100), Execution("000008", "w0", 3.5, None, pid=100)])
    (k,) = settle([kill("SIGTERM", 3.2, ["000007"])], runs)
    assert (k.mid_job, k.jobs) == (True, ["000007"])


def test_a_job_that_never_ran_again_is_unrecovered() -> None:
    runs = Executions.of([Execution("000009", "w0", 4.0, None, pid=100)])
    (k,) = settle([kill("SIGKILL", 4.1, ["000009"])], runs)
    assert math.isinf(recovery_ms(k, list(runs)) or 0.0)


def test_a_child_only_kill_catches_only_that_process_and_every_handler_of_it() -> None:
    runs = Executions.of([
        Execution("000010", "w0", 5.0, None, pid=201),  # the pool process hit
        Execution("000011", "w0", 5.01, None, pid=201, xid=2),  # ... its second thread
        Execution("000012", "w0", 5.0, 5.5, pid=202),  # another pool process of the same worker
    ])  # fmt: skip
    assert caught([kill("SIGKILL", 5.1, [], child=201)], runs) == [["000010", "000011"]]
    assert caught([kill("SIGKILL", 5.1, [])], runs) == [["000010", "000012", "000011"]]  # by start


def test_each_kill_reads_its_own_victim_only() -> None:
    runs = Executions.of([Execution("000013", "w0", 6.0, None, pid=100), Execution("000014", "w1", 6.0, None, pid=101)])
    assert caught([kill("SIGKILL", 6.1, [], "w1"), kill("SIGKILL", 6.2, [], "w0")], runs) == [["000014"], ["000013"]]


def test_a_mid_job_fault_waits_for_its_victim_while_handlers_still_start_anywhere() -> None:
    """A library's workers may say READY seconds before they consume (their start-up on a loaded
    machine): the wait for the victim to be inside a handler counts from the latest handler start seen
    anywhere, so it never runs out while the queue still makes progress; before any start it is three
    times as long."""
    from types import SimpleNamespace

    from crashbench.faults.injector import WorkerFaults

    ledger = SimpleNamespace(executions=[])
    faults = WorkerFaults([], None, ledger, lambda: 0.0, own_worker=False, longest_job_s=0.01)  # type: ignore[arg-type]
    assert faults._give_up_at(since=1.0, now=2.0) == 1.0 + 3 * 5.0  # nothing ran yet
    ledger.executions = [object()]
    assert faults._give_up_at(since=1.0, now=4.0) == 4.0 + 5.0  # the first start, seen at 4.0
    assert faults._give_up_at(since=10.0, now=12.0) == 10.0 + 5.0  # due (and READY) later than that
    assert faults._give_up_at(since=1.0, now=8.0) == 4.0 + 5.0  # no start since 4.0: the wait runs out
    ledger.executions = [object(), object()]
    assert faults._give_up_at(since=1.0, now=8.5) == 8.5 + 5.0  # another start, at 8.5: still work about


@pytest.mark.slow
def test_a_worker_starts_with_the_fault_signals_crashbench_itself_may_ignore_at_their_defaults(
    small: Scenario,
) -> None:
    """Started in the background by a shell without job control (`make test &`, a CI step), crashbench
    ignores SIGQUIT and SIGINT, and a worker would inherit that: every SIGQUIT fault would be shrugged
    off. Workers start with the defaults, so each mid-job SIGQUIT kills its victim inside its job."""
    previous = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        run = run_designs(small.replace(signal="SIGQUIT", kills=3), ["reliable"], Options()).runs[0]
    finally:
        signal.signal(signal.SIGQUIT, previous)
    c = run.counts
    assert run.problems == [] and c.kills == c.kills_mid_job == c.interrupted == 3, run.kills
    assert c.done == c.enqueued and c.lost == 0


def test_the_signals_reset_in_workers_are_every_fault_signal_a_process_can_ignore() -> None:
    from crashbench.control.supervisor import DEFAULT_IN_WORKERS
    from crashbench.scenario.settings import FAULT_SIGNALS

    ignorable = {signal.Signals[s] for s in FAULT_SIGNALS} - {signal.SIGKILL, signal.SIGSTOP}
    assert set(DEFAULT_IN_WORKERS) == (ignorable - {signal.SIGHUP}) | {signal.SIGCHLD}  # SIGHUP: see there
