"""From evidence to counts: the ledger (what ran), the harness's own reading of Redis (where each job
is: crashbench.evidence.inspector, through the design's `locate`) and the list of enqueued ids. Each outcome
class needs positive evidence of its own, decided per job in this order, so each enqueued job is in
exactly one: done (an end record), dead-lettered (found in a dead-letter key), stranded (found
anywhere else; undrained instead when the drain was cut off while the queue still made progress),
failed (found nowhere, and its last execution raised in a design that drops failed jobs, or the
library recorded it failed), then lost (found nowhere, its enqueue acknowledged) or
unconfirmed (its enqueue errored). Everything else counts events, not jobs. The design's own
`state()` decides nothing here; crashbench.evidence.checks checks it against the same reading.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from crashbench.designs import DesignSettings, Located, QueueState
from crashbench.evidence.ledger import Execution
from crashbench.run.workload import Workload


@dataclass(slots=True)
class Counts:
    enqueued: int = 0
    # outcome classes, one per enqueued job
    done: int = 0  # its handler ran to completion at least once
    dead_lettered: int = 0  # never completed; the queue dead-lettered it
    stranded: int = 0  # never completed, not dead; the queue still holds it after the final recovery
    failed: int = 0  # never completed, its handler raised or the queue recorded it failed, not dead-lettered
    lost: int = 0  # never completed, and the queue has no trace of it (its enqueue was acknowledged)
    unconfirmed: int = 0  # never completed, no trace, and its enqueue errored: it may never have been stored
    # events and anomalies
    duplicated: int = 0  # jobs completed more than once
    duplicated_overlapping: int = 0  # ... two of whose completions ran at the same time (a stolen live job)
    duplicated_sequential: int = 0  # ... run again only after a completion (e.g. killed before the ack)
    extra_executions: int = 0  # completions beyond the first, over all jobs
    failed_attempts: int = 0  # executions whose handler raised
    retried: int = 0  # jobs started again after a failed attempt
    early_retries: int = 0  # retries that started sooner after a failure than the backoff allows
    dead_lettered_poison: int = 0  # dead-lettered jobs the design dead-lettered for failing, not for crashing
    requeued: int = 0  # jobs recovery gave back at least once
    requeue_events: int = 0  # times recovery gave a job back
    empty_acks: int = 0  # acks that found nothing left to acknowledge (recovery, or a late ack, got there first)
    unexpected: int = 0  # ids executed that were never enqueued
    executions: int = 0  # handler starts, in all
    interrupted: int = 0  # handler starts that never finished (the worker died inside)
    kills: int = 0
    kills_mid_job: int = 0
    poison_jobs: int = 0  # enqueued jobs the workload makes fail on every attempt
    transient_jobs: int = 0  # enqueued jobs the workload makes fail on their first attempts
    failing_jobs: int = 0  # poison_jobs + transient_jobs: the jobs whose first attempt raises
    # broker faults (a killed or failed-over server)
    indeterminate: int = 0  # enqueues that errored or timed out (or were not replicated in time)
    recovered: int = 0  # ... of which the job was done all the same
    acks_lost: int = 0  # jobs completed (and acked) before the broker fault that ran again after it
    stranded_at: dict[str, int] = field(default_factory=dict)  # where the stranded jobs sit

    # the CI gate's own counts: 0 unless something went wrong that nobody injected
    undrained: int = 0  # jobs still held when the drain gave up (at least 1 when it did); 0 drained
    # jobs the library and the ledger disagree on: it recorded a failure (or timeout) of a job whose
    # handler completed, or a success of a job whose handler never completed
    library_disagrees: int = 0
    worker_crashes: int = 0  # workers that exited although no fault was aimed at them
    stuck_workers: int = 0  # worker slots a network fault hit that never started a handler again while jobs waited
    unrecovered: int = 0  # jobs a fault interrupted (mid-job) that never started again
    # broker-fault evidence, so an expectation can be exact ("lost == held_at_fault")
    held_at_fault: int = 0  # jobs the server held (harness's reading) when the fault struck, never completed
    acked_during_lag: int = 0  # enqueues the primary acknowledged after its replica stopped following, never completed


@dataclass(frozen=True, slots=True)
class Problem:
    """A check of the evidence that failed: crashbench, or the design's report of itself, is wrong.
    `check` names the check (crashbench.evidence.checks), `ids` the jobs involved (the first 100)."""

    check: str
    message: str
    ids: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        shown = f": {', '.join(self.ids[:10])}{' ...' if len(self.ids) > 10 else ''}" if self.ids else ""
        return f"[{self.check}] {self.message}{shown}"


@dataclass(slots=True)
class TotalQueue:
    """Jepsen's total-queue checker vocabulary over the same evidence: of the enqueues `attempted`, the
    `acknowledged` ones that completed (`ok`) or were `lost`; `recovered`: unacknowledged ones that
    completed all the same; `unexpected`: completed ids never enqueued; `duplicated`: completed more
    than once. `valid`: nothing lost, nothing unexpected, and no duplicate where the design promises
    exactly once."""

    attempted: int
    acknowledged: int
    ok: int
    lost: int
    unexpected: int
    duplicated: int
    recovered: int
    valid: bool


def classify(
    enqueued: Collection[str],
    completed: Counter[str],
    last_raised: set[str],
    located: Located,
    drops_failed: bool,
    indeterminate: Collection[str] = (),
    cut_off: bool = False,
) -> dict[str, set[str]]:
    """Each enqueued id in exactly one outcome class, by precedence (see the module's docstring).
    `last_raised`: ids whose last execution raised. `cut_off`: the drain hit its bound while the
    queue still made progress, so what it holds is a backlog (undrained), not stranded."""
    ids = set(enqueued)
    done = ids & {j for j, n in completed.items() if n > 0}
    dead = (set(located.dead) & ids) - done
    held = (set(located.held) & ids) - done - dead
    gone = ids - done - dead - held
    failed = gone & (located.failed | (last_raised if drops_failed else set()))
    unconfirmed = (gone - failed) & set(indeterminate)
    return {
        "done": done, "dead_lettered": dead, "stranded": set() if cut_off else held,
        "undrained": held if cut_off else set(), "failed": failed,
        "lost": gone - failed - unconfirmed, "unconfirmed": unconfirmed,
    }  # fmt: skip


class _Completions(Mapping[str, list[Execution]]):
    """Each completed job's completed executions, from count()'s compact form, without a list per job."""

    def __init__(self, first: dict[str, Execution], more: dict[str, list[Execution]]) -> None:
        self.first, self.more = first, more

    def __getitem__(self, job: str) -> list[Execution]:
        return self.more.get(job) or [self.first[job]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.first)

    def __len__(self) -> int:
        return len(self.first)


def library_disagrees(completed: Collection[str], located: Located) -> set[str]:
    """Jobs whose library record contradicts the ledger: recorded failed (or timed out) although a
    handler of the job completed, or recorded done although none did."""
    done = set(completed)
    return (located.failed & done) | (located.succeeded - done)


def _overlapping(runs: list[Execution]) -> bool:
    """Did two of these completed executions of one job run at the same time?"""
    runs = sorted(runs, key=lambda e: e.start)
    latest_end = runs[0].end or 0.0
    for ex in runs[1:]:
        if ex.start < latest_end:
            return True
        latest_end = max(latest_end, ex.end or 0.0)
    return False


def _early_retries(failed_runs: list[Execution], starts: dict[str, list[float]], settings: DesignSettings) -> int:
    """Retries that began before the backoff of their attempt had passed. The attempt number is taken as
    the number of executions so far, which is at most the design's own count (crashes the ledger did
    not see only add attempts), so the bound used is never stricter than the design's."""
    early = 0
    for ex in failed_runs:
        times = sorted(starts[ex.job])
        attempt = times.index(ex.start) + 1
        later = [t for t in times if t > ex.start]
        if later and ex.end is not None and later[0] - ex.end < settings.retry_delay(attempt, 0.0) - 1e-6:
            early += 1
    return early


def count(
    enqueued: Collection[str],
    executions: Iterable[Execution],
    located: Located,
    queue: QueueState | None = None,  # the design's report: only its requeue and poison bookkeeping is used
    drops_failed: bool = False,
    kills: int = 0,
    kills_mid_job: int = 0,
    workload: Workload | None = None,
    settings: DesignSettings | None = None,
    indeterminate: Collection[str] = (),
    broker_fault: tuple[float, float] | None = None,  # (struck, server back), harness clock
    drained: bool = True,  # False: the drain gave up with jobs still held
    cut_off: bool = False,  # the drain hit its bound while the queue still made progress (not drained)
) -> tuple[Counts, dict[str, set[str]]]:
    """The counts, and the ids behind each outcome class (and behind library_disagrees and duplicated,
    which are not outcome classes)."""
    queue = queue or QueueState()
    runs = executions if isinstance(executions, list) else list(executions)
    # One pass, one dict entry per completed job (a million jobs: most run once). A job's other
    # executions (interrupted, raised) are few; starts and the last execution are gathered in a second
    # pass only for the jobs that need them: those that raised, or all with a broker fault.
    first: dict[str, Execution] = {}  # a job's first completed execution
    more: dict[str, list[Execution]] = {}  # every completed execution of a job completed more than once
    failed_runs: list[Execution] = []
    others: set[str] = set()  # jobs with an execution that did not complete
    interrupted = 0
    for ex in runs:
        if ex.end is None:
            interrupted += 1
            others.add(ex.job)
        elif ex.failed:
            failed_runs.append(ex)
            others.add(ex.job)
        elif ex.job not in first:
            first[ex.job] = ex
        elif ex.job in more:
            more[ex.job].append(ex)
        else:
            more[ex.job] = [first[ex.job], ex]
    need = None if broker_fault is not None else {ex.job for ex in failed_runs}
    starts: dict[str, list[float]] = {}
    last: dict[str, Execution] = {}
    if need is None or need:
        for ex in runs:
            if need is None or ex.job in need:
                starts.setdefault(ex.job, []).append(ex.start)
                if ex.job not in last or ex.start >= last[ex.job].start:
                    last[ex.job] = ex
    ids = set(enqueued)
    # Nothing to hash when the workload fails nothing (most runs; a million ids take seconds).
    failing = workload if workload is not None and (workload.poison_rate or workload.transient_rate) else None
    completed: Counter[str] = Counter()
    completed.update(dict.fromkeys(first, 1))
    completed.update({j: len(r) - 1 for j, r in more.items()})
    completions = _Completions(first, more)
    last_raised = {j for j, ex in last.items() if ex.failed}
    classes = classify(ids, completed, last_raised, located, drops_failed, indeterminate, cut_off)
    classes["library_disagrees"] = library_disagrees(completions, located) & ids
    acks_lost = 0
    if broker_fault is not None:
        # Completed before the server was back, started again after the fault and after that
        # completion: the server never kept (or never got) the ack.
        fault, back = broker_fault
        for j in first:
            ends = [r.end for r in completions[j] if r.end is not None and r.end < back]
            if ends and any(t > max(fault, min(ends)) for t in starts[j]):
                acks_lost += 1
    where = Counter(located.held[j][0].split(":")[0] for j in classes["stranded"])
    dups = [j for j in more if j in ids]
    overlapping = sum(1 for j in dups if _overlapping(more[j]))
    classes["duplicated"] = set(more)  # not an outcome class: every job completed more than once
    first_failure: dict[str, float] = {}
    for ex in failed_runs:
        first_failure[ex.job] = min(first_failure.get(ex.job, ex.start), ex.start)
    retried = {j for j, t in first_failure.items() if any(s > t for s in starts[j])}
    early = _early_retries(failed_runs, starts, settings) if settings else 0
    counts = Counts(
        enqueued=len(ids),
        done=len(classes["done"]),
        dead_lettered=len(classes["dead_lettered"]),
        stranded=len(classes["stranded"]),
        failed=len(classes["failed"]),
        lost=len(classes["lost"]),
        unconfirmed=len(classes["unconfirmed"]),
        duplicated=len(dups),
        duplicated_overlapping=overlapping,
        duplicated_sequential=len(dups) - overlapping,
        extra_executions=sum(completed[j] - 1 for j in dups),
        failed_attempts=len(failed_runs),
        retried=len(retried & ids),
        early_retries=early,
        dead_lettered_poison=len(classes["dead_lettered"] & queue.poisoned),
        requeued=len(queue.requeued & ids),
        requeue_events=queue.requeue_events,
        unexpected=len((first.keys() | others) - ids),
        executions=len(runs),
        interrupted=interrupted,
        kills=kills,
        kills_mid_job=kills_mid_job,
        poison_jobs=sum(1 for j in ids if failing.is_poison(j)) if failing else 0,
        transient_jobs=sum(1 for j in ids if failing.is_transient(j)) if failing else 0,
        failing_jobs=sum(1 for j in ids if failing.fails(j, 1)) if failing else 0,
        stranded_at=dict(sorted(where.items())),
        indeterminate=len(set(indeterminate) & ids),
        recovered=len(set(indeterminate) & classes["done"]),
        acks_lost=acks_lost,
        # Every entry still held, a completed job's included (a stream entry never acked): at least 1.
        undrained=0 if drained and not cut_off else max(1, len(located.held)),
        library_disagrees=len(classes["library_disagrees"]),
    )
    return counts, classes


def total_queue(c: Counts, exactly_once: bool = False) -> TotalQueue:
    """The counts in Jepsen's total-queue terms (see TotalQueue)."""
    acknowledged = c.enqueued - c.indeterminate
    return TotalQueue(
        attempted=c.enqueued,
        acknowledged=acknowledged,
        ok=c.done - c.recovered,
        lost=c.lost,
        unexpected=c.unexpected,
        duplicated=c.duplicated,
        recovered=c.recovered,
        valid=c.lost == 0 and c.unexpected == 0 and not (exactly_once and c.duplicated),
    )
