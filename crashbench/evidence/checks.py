"""Checks of the evidence: where the design's own report, the ledger and the harness's reading of
Redis disagree, crashbench or the design is wrong, and the run must say so (exit 4), naming the ids.

Every check compares two sources that are produced independently: the design's `state()` and
`backlog()` against the inspector's snapshot; the ids in Redis against the ids the harness
enqueued; the worker signals' records against the victims' final ledgers; the design's requeued ids against its
own event counter, and its requeue and poison figures against the ledger (`requeues`); the producer's
two id sets against the job list. None restates how a count was
computed, so each can fire (tests/test_evidence.py shows each one firing).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from crashbench import jobids
from crashbench.jobids import JobIds
from crashbench.model.counts import Problem
from crashbench.model.executions import FAILED, Execution, Executions
from crashbench.model.ledger import LedgerProblem
from crashbench.model.queue import Located, QueueState

CAP = 100  # ids named per problem


def _ids(ids: Iterable[str]) -> list[str]:
    return sorted(ids)[:CAP]


@dataclass(slots=True)
class SignalFact:
    """What a worker signal's record claims, as far as the checks need it."""

    worker: str
    signal: str
    mid_job: bool
    job: str | None


@dataclass(slots=True)
class Evidence:
    enqueued: Collection[str]
    executions: Sequence[Execution]
    located: Located  # the harness's reading of Redis
    state: QueueState  # the design's own report
    drained: bool
    own_worker: bool  # the handler runs in a library's worker, not crashbench's loop
    signals: Sequence[SignalFact] = ()
    ledger_problems: Sequence[LedgerProblem] = ()
    acknowledged: Collection[str] | None = None  # with a producer during the run (broker faults)
    indeterminate: Collection[str] | None = None
    # the watch after the drain (crashbench.run.drain.watch): the drain's time, the watch's end (None:
    # no watch, a timeline from before it), the most backlog() said during it
    drained_at: float = 0.0
    settled_at: float | None = None
    backlog_after: int = -1
    held_at_drain: Collection[str] | None = None  # the ids Redis held as the watch began (None: not read)


def check(ev: Evidence) -> list[Problem]:
    out: list[Problem] = []
    enqueued = JobIds.of(ev.enqueued)  # `in` without a set of every id
    runs = Executions.of(ev.executions)
    out += _state_types(ev.state)
    out += _state_against_snapshot(ev.state, ev.located)
    out += _held_twice(ev.located)
    out += _backlog(ev, runs)
    found = set(ev.located.held) | set(ev.located.dead) | ev.located.failed
    if stray := {j for j in found if j not in enqueued}:
        out.append(
            Problem("never_enqueued", f"Redis holds {len(stray)} job id(s) the harness never enqueued", _ids(stray))
        )
    out += _requeues(ev.state)
    if not ev.own_worker:
        out += _failed_without_record(ev.state, ev.located, runs)
    out += _signals(ev.signals, runs)
    out += [_ledger(p) for p in ev.ledger_problems]
    if ev.acknowledged is not None and ev.indeterminate is not None:
        out += _enqueues(enqueued, set(ev.acknowledged), set(ev.indeterminate))
    return out


def _state_types(state: QueueState) -> list[Problem]:
    bad = [j for j, where in state.held.items() if not isinstance(j, str) or not isinstance(where, str)]
    if not bad:
        return []
    return [Problem("state_types", "state().held must map str job ids to str locations", _ids(map(repr, bad)))]


def _when(check: str, ids: Collection[str], message: str) -> list[Problem]:
    """One problem naming `ids`, if there are any; `message` may say {n}, how many (and nothing else is
    read as a field: key names in it carry braces, a cluster's hash tags)."""
    return [Problem(check, message.replace("{n}", str(len(ids))), _ids(ids))] if ids else []


def _state_against_snapshot(state: QueueState, located: Located) -> list[Problem]:
    claimed = {j for j in state.held if isinstance(j, str)}
    held, dead, claimed_dead = set(located.held), set(located.dead), set(state.dead_lettered)
    return [
        *_when("state_claims_absent", claimed - held, "state() says {n} job(s) are held; Redis holds them nowhere"),
        # (a job the stop took out of Redis is held as read before it: state(), read after, cannot see it)
        *_when("state_misses", held - claimed - located.stopped, "Redis holds {n} job(s) that state() does not report"),
        *_when(
            "state_claims_dead", claimed_dead - dead, "state() says {n} job(s) are dead-lettered; no dead letter is"
        ),
        *_when("state_misses_dead", dead - claimed_dead, "the dead letters hold {n} job(s) state() does not report"),
    ]


def _held_twice(located: Located) -> list[Problem]:
    places = {j: located.held.get(j, []) + located.dead.get(j, []) for j in set(located.held) | set(located.dead)}
    twice = {j for j, where in places.items() if len(where) > 1}
    shown = "; ".join(f"{j} in {', '.join(places[j])}" for j in sorted(twice)[:5])
    return _when("held_twice", twice, f"{{n}} job(s) are stored more than once ({shown})")


def _backlog(ev: Evidence, runs: Executions) -> list[Problem]:
    """The drain's 0 was wrong when something was still delivered after it: a job Redis held as the
    drain ended started during the watch after it, or backlog() said more than 0 again. A job a worker
    had already taken out of Redis (a library's read-ahead, waiting for a thread) is no lie of
    backlog(). Held jobs that nothing delivers are stranded, the design's own finding. A timeline from
    before the watch: jobs held, not delayed."""
    if not ev.drained:
        return []
    if ev.settled_at is None:
        waiting = set(ev.located.held) - ev.located.delayed
        return _when(
            "backlog_wrong", waiting, "the run drained (backlog() said 0), yet Redis holds {n} job(s) not delayed"
        )
    lo, hi = ev.drained_at, ev.settled_at
    started = {runs.job(r) for r, t in enumerate(runs.starts) if lo < t <= hi}
    if ev.held_at_drain is not None:  # a job a worker had already taken (a library's read-ahead) is no lie
        held = set(ev.held_at_drain)
        started = {j for j in started if j in held}
    if not started and ev.backlog_after <= 0:
        return []
    again = f"; backlog() said {ev.backlog_after} again" if ev.backlog_after > 0 else ""
    message = f"backlog() said 0 (drained), yet {len(started)} job(s) started in the {hi - lo:.2f} s after{again}"
    return [Problem("backlog_wrong", message, _ids(started))]


def _requeues(state: QueueState) -> list[Problem]:
    short = set(state.requeued) if state.requeue_events < len(state.requeued) else set()
    return _when("requeue_events_below", short, f"{{n}} job(s) reported requeued by {state.requeue_events} requeue(s)")


def _failed_without_record(state: QueueState, located: Located, runs: Executions) -> list[Problem]:
    none = (set(state.failed) | located.failed) - {runs.job(r) for r, f in enumerate(runs.flags) if f & FAILED}
    return _when("failed_without_record", none, "{n} job(s) recorded failed whose handler never raised")


def _signals(signals: Sequence[SignalFact], runs: Executions) -> list[Problem]:
    interrupted_rows = [r for r, end in enumerate(runs.ends) if end != end]  # NaN: never ended
    open_at = {(runs.worker(r), runs.job(r)) for r in interrupted_rows}
    hits = [k for k in signals if k.signal == "SIGKILL" and k.mid_job]
    missing = [k for k in hits if (k.worker, k.job) not in open_at]
    names = ", ".join(f"{k.worker}/{k.job}" for k in missing)
    out = _when(
        "kill_without_open_execution",
        {str(k.job) for k in missing},
        f"{len(missing)} mid-job SIGKILL(s) left no unfinished execution of the job in the victim's ledger ({names})",
    )
    interrupted = len(interrupted_rows)
    if interrupted < len(hits):
        message = f"{interrupted} interrupted execution(s) for {len(hits)} mid-job SIGKILL(s)"
        out.append(Problem("interrupted_below_kills", message))
    return out


def _ledger(p: LedgerProblem) -> Problem:
    return Problem(f"ledger_{p.kind}", f"{p.worker}: {p.detail}", [p.job] if p.job else [])


def _enqueues(enqueued: JobIds, acknowledged: set[str], indeterminate: set[str]) -> list[Problem]:
    return [
        *_when("enqueue_both", acknowledged & indeterminate, "{n} enqueue(s) both acknowledged and indeterminate"),
        *_when(
            "enqueue_unaccounted",
            {j for j in enqueued if j not in acknowledged and j not in indeterminate},
            "{n} job(s) neither acknowledged nor indeterminate",
        ),
        *_when(
            "enqueue_extra",
            {j for j in acknowledged | indeterminate if j not in enqueued},
            "{n} enqueue(s) of ids not in the job list",
        ),
    ]


@dataclass(slots=True)
class Redelivery:
    """What the ledger says recovery did, for checking the design's requeue and poison figures."""

    redelivered: AbstractSet[str]  # jobs started again after a start that did not raise (counts.count)
    redeliveries: int  # ... such starts, in all
    first_fault: float  # the first fault on a worker or the server (timeline clock); inf: none
    faults: int  # faults that can leave a worker's fetched jobs to recovery (kills, cut slots, the server's)
    batch: int  # jobs a worker may hold fetched and not yet started (a batching design's batch size)
    counts_requeues: bool  # the design says it reports every job its recovery gives back
    broker_fault: bool  # a server fault: a job may come back without any requeue (an ack the server lost)


def requeues(
    state: QueueState, enqueued: Collection[str], runs: Executions, located: Located, r: Redelivery
) -> list[Problem]:
    """The design's requeue and poison figures against the ledger and the harness's reading.

    requeue_unfounded          a job reported requeued that never started again, nor is held or
                               dead-lettered, and either never started at all or first started before
                               any fault (a worker can only hand back what it fetched); or more such jobs
                               whose only start followed a fault than the faults could have held
    requeue_events_unfounded   more requeue events than the ledger and the reading allow: every one is
                               followed by a start, a held or dead-lettered job, or a fetched job's loss
    requeue_missed             a design that reports its requeues did not report a job the ledger shows
                               redelivered (no server fault: a lost ack brings a job back unrequeued)
    requeue_events_below_redeliveries  ... or reports fewer requeue events than redeliveries
    poison_unfounded           a job reported dead-lettered for failing whose handler never raised
    """
    ids = JobIds.of(enqueued)
    claimed = {j for j in state.requeued if isinstance(j, str) and j in ids}
    poisoned = {j for j in state.poisoned if isinstance(j, str) and j in ids}
    codes = {jobids.code(j) for j in claimed | poisoned}
    starts: dict[int, list[float]] = {}
    raised: set[int] = set()
    if codes:
        for row, c in enumerate(runs.jobs):
            if c in codes:
                starts.setdefault(c, []).append(runs.starts[row])
                if runs.flags[row] & FAILED:
                    raised.add(c)
    kept = located.held.keys() | located.dead.keys()
    loose = {j for j in claimed if j not in kept and len(starts.get(jobids.code(j), ())) < 2}
    never = {
        j
        for j in loose
        if min(starts.get(jobids.code(j), [math.inf])) < r.first_fault or not starts.get(jobids.code(j))
    }
    allowance = r.faults * max(1, r.batch)
    out = _when(
        "requeue_unfounded", never, "{n} job(s) reported requeued never started again after a fault, nor are held"
    )
    if not never and len(loose) > allowance:
        message = (
            f"{len(loose)} job(s) reported requeued ran once only, more than {r.faults} fault(s) could leave fetched"
        )
        out.append(Problem("requeue_unfounded", message, _ids(loose)))
    bound = r.redeliveries + len(claimed & kept) + min(len(loose - never), allowance) + allowance
    if state.requeue_events > bound:
        message = f"{state.requeue_events} requeue event(s) reported; the ledger and the reading allow {bound} at most"
        out.append(Problem("requeue_events_unfounded", message))
    if r.counts_requeues and not r.broker_fault:
        out += _when(
            "requeue_missed", set(r.redelivered) - claimed, "{n} job(s) redelivered the design did not report requeued"
        )
        if state.requeue_events < r.redeliveries:
            message = (
                f"{state.requeue_events} requeue event(s) reported for {r.redeliveries} redeliveries in the ledger"
            )
            out.append(Problem("requeue_events_below_redeliveries", message))
    out += _when(
        "poison_unfounded",
        {j for j in poisoned if jobids.code(j) not in raised},
        "{n} job(s) reported poison whose handler never raised",
    )
    return out
