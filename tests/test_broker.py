"""Broker faults: the server itself is SIGKILLed (and restarted with what its persistence kept) or
failed over to its replica, mid-run. Real servers, real signals."""

from __future__ import annotations

from pathlib import Path

import pytest

from crashbench.errors import UsageError
from crashbench.model.spec import Scenario
from crashbench.report import recount
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow


@pytest.fixture
def backlog(small: Scenario) -> Scenario:
    """Production done in 0.5 s and workers far behind it: the queue holds a backlog at the fault."""
    return small.replace(jobs=600, job_ms=20, kills=0, fault="broker-kill", fault_at=0.8, downtime=0.3, produce_s=0.5)


def test_with_aof_always_a_server_kill_loses_no_acknowledged_job(backlog: Scenario, tmp_path: Path) -> None:
    sc = backlog.replace(persistence="aof-always")
    result = run_designs(sc, ["reliable"], Options())
    run = result.runs[0]
    c, bf = run.counts, run.broker_fault
    assert run.problems == []
    assert bf is not None and bf.kind == "broker-kill" and bf.held_at_fault > 0 and bf.back_at is not None
    assert c.lost == 0 and c.stranded == 0
    assert c.done + c.unconfirmed == c.enqueued == 600
    assert c.done >= bf.acknowledged_before  # everything acknowledged was done, kill or not
    # The ledger is files, not the server: executions from before the kill are all still counted.
    assert c.executions >= c.done and run.timings.drained
    # While the server was down the harness's loop (the producer's, the faults') waited on nothing of
    # it: no recovery pass, no depth reading began; both went on once it was back.
    _, (tl,) = recount.load(str(result.write(tmp_path)))
    down, up = (next(m.t for m in tl.marks if m.what == what) for what in ("down", "up"))
    assert up - down >= sc.broker.downtime
    assert [m.t for m in tl.marks if m.what == "recover" and down < m.t < up] == []
    assert [d.t for d in tl.depth if down < d.t < up] == []
    assert [m.t for m in tl.marks if m.what == "recover" and m.t > up] and [d.t for d in tl.depth if d.t > up]


def test_without_persistence_every_job_the_queue_held_at_the_kill_is_lost(backlog: Scenario) -> None:
    # naive holds only waiting jobs (a popped job is in its worker's hands, not in Redis), and production
    # ended before the fault: exactly the jobs in the queue at that moment must be reported lost. The
    # fault at 1.5 s, a second after production's planned end, however late a loaded machine paces it.
    run = run_designs(backlog.replace(fault_at=1.5), ["naive"], Options()).runs[0]
    c, bf = run.counts, run.broker_fault
    assert run.problems == []
    # Production usually ended before the fault; a loaded machine's producer may still be pacing (580 of 600
    # once, in a clean clone's run): the record counts what was acknowledged before the kill, as sent.
    assert bf is not None
    sent_before = sum(len(e.ids) for e in run.timeline.enqueues if e.ok and e.t < bf.at)
    assert bf.acknowledged_before == sent_before > 100
    assert bf.held_at_fault > 100  # what the harness read from Redis itself just before the SIGKILL
    # Lost: exactly the jobs held at the kill that never ran. A few held ones may still be done: popped
    # by a worker while the harness read Redis, just before the SIGKILL; being first in line, they
    # have the lowest ids, so past them the two samples (first 100 ids, sorted) agree.
    assert c.lost == c.held_at_fault <= bf.held_at_fault
    lost = run.jobs["lost"]
    shown = [j for j in bf.held_ids if j >= lost[0]]
    assert shown == lost[: len(shown)] and len(shown) > 50
    assert c.done + c.lost + c.unconfirmed == 600


def test_a_failover_loses_what_the_replica_never_got_unless_enqueues_wait_for_it(
    backlog: Scenario, tmp_path: Path
) -> None:
    # The replica stops following 0.3 s before the primary dies; production goes on past the fault.
    sc = backlog.replace(jobs=300, fault="failover", fault_at=0.8, replica_lag=0.3, produce_s=1.2)
    result = run_designs(sc, ["reliable"], Options())
    assert_recounts(result, tmp_path)  # enqueues acknowledged during the lag, from the timeline alone
    plain = result.runs[0]
    c, bf = plain.counts, plain.broker_fault
    assert plain.problems == [] and bf is not None and bf.kind == "failover"
    # Lost: exactly what the primary alone acknowledged during the lag and no worker ran before it died.
    assert c.lost == c.acked_during_lag > 0 and c.indeterminate == 0
    assert c.stranded == 0
    waiting = run_designs(sc.replace(wait_replicas=1, wait_ms=100), ["reliable"], Options()).runs[0]
    c = waiting.counts
    assert waiting.problems == []
    assert c.lost == c.acked_during_lag == 0 and c.stranded == 0  # what WAIT did not confirm was never acknowledged
    # Not confirmed: during the lag, and after the failover (the promoted replica has no replica).
    assert c.indeterminate > 0 and c.recovered + c.unconfirmed == c.indeterminate


def test_broker_faults_and_persistence_are_refused_on_a_server_crashbench_does_not_own(
    valkey_url: str, backlog: Scenario
) -> None:
    with pytest.raises(UsageError, match="only to a server it started"):
        run_designs(backlog, ["reliable"], Options(redis_url=valkey_url))
    sc = backlog.replace(fault="none", persistence="aof-always")
    with pytest.raises(UsageError, match="only to a server it started"):
        run_designs(sc, ["reliable"], Options(redis_url=valkey_url))


def test_worker_kills_and_a_broker_kill_overlap_in_one_schedule(backlog: Scenario, tmp_path: Path) -> None:
    """One scheduler fires both kinds: a worker is SIGKILLed while the server is down, and the counts
    stay exact (no persistence: what the server held at its kill and never ran is what is lost)."""
    entry = {"signal": "SIGKILL", "at": 0.5, "count": 4, "every": 0.3, "kill_when": "any"}
    sc = backlog.replace(schedule=(entry,), downtime=0.5)  # the server is down from 0.8 s to ~1.3 s
    result = run_designs(sc, ["reliable"], Options())
    assert_recounts(result, tmp_path)  # a mixed schedule, from the timeline alone
    run = result.runs[0]
    c, bf = run.counts, run.broker_fault
    assert run.problems == [] and bf is not None and bf.back_at is not None
    assert [k.planned_at for k in run.kills] == [0.5, 0.8, 1.1, 1.4]
    during = [k for k in run.kills if bf.at < k.at < bf.back_at]
    assert 1.1 in [k.planned_at for k in during], (bf, run.kills)
    # Its replacement waited for the server to come back before it said READY: the server is started
    # again `downtime` after its kill (the harness's own look, back_at, may come a moment after the
    # replacement's connection).
    late = next(k for k in during if k.planned_at == 1.1)
    assert (
        late.replacement_ready_ms is not None
        and late.at + late.replacement_ready_ms / 1000 > bf.at + sc.broker.downtime
    )
    assert [f.kind for f in run.schedule] == ["signal", "signal", "broker-kill", "signal", "signal"]
    assert c.kills == 4 and c.worker_crashes == 0
    # Enqueues the down server refused (a loaded machine's producer meets the outage) are unconfirmed.
    assert c.lost == c.held_at_fault > 0 and c.done + c.lost + c.unconfirmed == 600
    assert c.unconfirmed == c.indeterminate - c.recovered and c.stranded == 0


def test_a_failover_that_keeps_the_address_is_followed_by_a_library_s_workers(backlog: Scenario) -> None:
    """failover_address "kept": the promoted replica takes the primary's port, and RQ's workers, which never
    re-read an address, reconnect to it and run what is enqueued after the failover; told the replica's new
    address instead ("new"), they could not, and the run is refused before it starts."""
    sc = backlog.replace(jobs=200, fault="failover", fault_at=0.8, produce_s=1.6, drain_timeout=4)
    with pytest.raises(UsageError, match="cannot follow a failover") as err:
        run_designs(sc, ["rq:reliable"], Options())
    assert 'failover_address = "kept"' in (err.value.hint or "")
    run = run_designs(sc.replace(failover_address="kept"), ["rq:reliable"], Options()).runs[0]
    bf, tl = run.broker_fault, run.timeline
    assert bf is not None and bf.kind == "failover" and bf.acknowledged_before < 200 and tl is not None
    # Jobs enqueued after the failover (the producer goes on to 1.6 s) reached the promoted replica only,
    # and the ledger shows the library's workers running them: they found it at the old address.
    after = [ex for ex in tl.executions if ex.start > bf.at and ex.completed]
    assert len(after) > 0
    # What is lost is only what the primary held as it died (the tail replication had not sent yet): every
    # job enqueued after the failover was done at the address the workers were started with.
    # (The record keeps the first 100 ids; the timeline keeps them all: a loaded machine's primary held 102.)
    assert len(tl.held_at_fault) == bf.held_at_fault and bf.held_ids == sorted(tl.held_at_fault)[:100]
    assert run.counts.lost <= bf.held_at_fault and set(run.jobs["lost"]) <= set(tl.held_at_fault)


@pytest.mark.parametrize("design", ["celery", "taskiq"])
def test_a_library_s_enqueue_that_fails_with_the_server_down_is_indeterminate(backlog: Scenario, design: str) -> None:
    """Celery's kombu and taskiq wrap the connection error in their own (OperationalError, SendTaskError):
    the producer looks through the wrapper, as it does for a plain redis-py error, and records the enqueue
    indeterminate; before, the wrapper ended the run (exit 5)."""
    sc = backlog.replace(jobs=300, fault_at=0.3, downtime=0.5, produce_s=1.0, drain_timeout=10)
    run = run_designs(sc, [design], Options()).runs[0]
    bf, c = run.broker_fault, run.counts
    assert bf is not None and bf.back_at is not None
    assert c.indeterminate > 0 and bf.acknowledged_before + c.indeterminate <= c.enqueued == 300


def test_only_an_error_caused_by_an_unanswered_write_makes_an_enqueue_indeterminate() -> None:
    import redis

    from crashbench.run.producer import unanswered

    class LibraryError(Exception):
        pass

    def wrapped(cause: BaseException, explicit: bool) -> LibraryError:
        try:
            try:
                raise cause
            except Exception as exc:
                if explicit:
                    raise LibraryError("wrapped") from exc
                raise LibraryError("wrapped")  # noqa: B904 (a library that chains only implicitly)
        except LibraryError as err:
            return err

    assert unanswered(wrapped(redis.ConnectionError("refused"), explicit=True))
    assert unanswered(wrapped(redis.exceptions.OutOfMemoryError("OOM"), explicit=False))  # its context
    assert not unanswered(wrapped(ValueError("a bug in the adapter"), explicit=True))
    assert not unanswered(LibraryError("no cause"))
