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

from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from collections.abc import Set as AbstractSet

from crashbench import jobids
from crashbench.jobids import JobIds
from crashbench.model.counts import Counts, TotalQueue
from crashbench.model.executions import FAILED, Execution, Executions
from crashbench.model.queue import DesignSettings, Located, QueueState
from crashbench.model.workload import Workload


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


class _Enqueued:
    """The enqueued ids as positions 0..n-1, and per position how many times the job completed (a
    byte, saturating at 255; exact counts come from the rows): no set or dict of a million ids."""

    def __init__(self, enqueued: Collection[str]) -> None:
        ids = JobIds.of(enqueued)
        if isinstance(ids.codes, range):
            self.codes: range | array[int] = ids.codes
            self.base, self.lookup = ids.codes.start, None
        else:  # a test's ids, or enqueues that did not follow each other: a dict, once per id
            self.codes = array("q", dict.fromkeys(ids.codes))
            self.base, self.lookup = 0, {c: p for p, c in enumerate(self.codes)}
        self.n = len(self.codes)
        self.times = bytearray(self.n)

    def pos(self, c: int) -> int:
        if self.lookup is not None:
            return self.lookup.get(c, -1)
        p = c - self.base
        return p if 0 <= p < self.n else -1

    def has(self, job: str) -> bool:
        c = jobids.known(job)
        return c is not None and self.pos(c) >= 0

    def done(self, job: str) -> bool:
        c = jobids.known(job)
        p = -1 if c is None else self.pos(c)
        return p >= 0 and self.times[p] > 0

    def where(self, value_is: Callable[[int], bool]) -> Iterator[int]:
        """The codes at the positions whose count satisfies `value_is`, found by bytes.find (C speed):
        the jobs not done, or done twice, are few."""
        table = bytes(1 if value_is(v) else 0 for v in range(256))
        marks = self.times.translate(table)
        p = marks.find(1)
        while p >= 0:
            yield self.codes[p]
            p = marks.find(1, p + 1)


class _Done(AbstractSet[str]):
    """The enqueued jobs that completed, as a set view over the counts."""

    def __init__(self, enq: _Enqueued) -> None:
        self.enq = enq

    def __contains__(self, job: object) -> bool:
        return isinstance(job, str) and self.enq.done(job)

    def __len__(self) -> int:
        return self.enq.n - self.enq.times.count(0)

    def __iter__(self) -> Iterator[str]:
        return map(jobids.name, self.enq.where(lambda v: v > 0))


def library_disagrees(completed: Collection[str], located: Located) -> set[str]:
    """Jobs whose library record contradicts the ledger: recorded failed (or timed out) although a
    handler of the job completed, or recorded done although none did."""
    return {j for j in located.failed if j in completed} | {j for j in located.succeeded if j not in completed}


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
    queue: QueueState | None = None,  # the design's report: only its requeue figures are used, as its word
    drops_failed: bool = False,
    kills: int = 0,
    kills_mid_job: int = 0,
    workload: Workload | None = None,
    settings: DesignSettings | None = None,
    indeterminate: Collection[str] = (),
    broker_fault: tuple[float, float] | None = None,  # (struck, server back), harness clock
    drained: bool = True,  # False: the drain gave up with jobs still held
    cut_off: bool = False,  # the drain hit its bound while the queue still made progress (not drained)
) -> tuple[Counts, dict[str, AbstractSet[str]]]:
    """The counts, and the ids behind each outcome class (and behind library_disagrees and duplicated,
    which are not outcome classes)."""
    queue = queue or QueueState()
    runs = Executions.of(executions)
    enq = _Enqueued(enqueued)
    # One pass over the columns counts each enqueued job's completions in a byte (a million jobs:
    # most run once). The jobs that need their executions one by one are few: those completed twice,
    # those with an execution that did not complete; their rows are gathered in a second pass (all
    # jobs' with a broker fault, whose acks_lost looks at every completed job).
    times, stray = enq.times, Counter[int]()
    others: set[int] = set()  # codes with an execution that did not complete
    failed_rows: list[int] = []
    interrupted = 0
    pos = enq.pos
    for row, (c, end, flags) in enumerate(zip(runs.jobs, runs.ends, runs.flags, strict=True)):
        if end != end:  # NaN: interrupted
            interrupted += 1
            others.add(c)
        elif flags & FAILED:
            failed_rows.append(row)
            others.add(c)
        elif (p := pos(c)) < 0:
            stray[c] += 1
        elif times[p] < 255:
            times[p] += 1
    twice = {*enq.where(lambda v: v > 1), *(c for c, n in stray.items() if n > 1)}
    # A job started twice completed twice, or has an execution that did not complete.
    need = None if broker_fault is not None else twice | others
    starts: dict[int, list[float]] = {}
    rows_of: dict[int, list[int]] = {}  # code -> its rows, in the order they started
    last: dict[int, int] = {}  # code -> its last-started row
    completions: dict[int, list[int]] = {}  # code -> its completed rows
    if need is None or need:
        for row, (c, start, end, flags) in enumerate(zip(runs.jobs, runs.starts, runs.ends, runs.flags, strict=True)):
            if need is None or c in need:
                starts.setdefault(c, []).append(start)
                rows_of.setdefault(c, []).append(row)
                if c not in last or start >= runs.starts[last[c]]:
                    last[c] = row
                if end == end and not flags & FAILED:
                    completions.setdefault(c, []).append(row)
    name = jobids.name
    done = _Done(enq)
    last_raised = {name(c) for c, row in last.items() if runs.flags[row] & FAILED}
    # Every class but done is decided among the jobs not done, which are few.
    undone = [name(c) for c in enq.where(lambda v: v == 0)]
    classes: dict[str, AbstractSet[str]] = {
        **classify(undone, Counter(), last_raised, located, drops_failed, indeterminate, cut_off),
        "done": done,
    }
    classes["library_disagrees"] = {j for j in library_disagrees(done, located) if enq.has(j)}
    acks_lost = 0
    if broker_fault is not None:
        # Completed before the server was back, started again after the fault and after that
        # completion: the server never kept (or never got) the ack.
        fault, back = broker_fault
        for c, rows in completions.items():
            ends = [runs.ends[r] for r in rows if runs.ends[r] < back]
            if ends and any(t > max(fault, min(ends)) for t in starts[c]):
                acks_lost += 1
    where = Counter(located.held[j][0].split(":")[0] for j in classes["stranded"])
    dups = [c for c in twice if pos(c) >= 0]
    overlapping = sum(1 for c in dups if _overlapping([runs.row(r) for r in completions[c]]))
    classes["duplicated"] = {name(c) for c in twice}  # not an outcome class: every job completed more than once
    first_failure: dict[int, float] = {}
    for row in failed_rows:
        c, start = runs.jobs[row], runs.starts[row]
        first_failure[c] = min(first_failure.get(c, start), start)
    retried = {c for c, t in first_failure.items() if any(s > t for s in starts[c]) and pos(c) >= 0}
    failed_execs = [runs.row(r) for r in failed_rows]
    early = _early_retries(failed_execs, {name(c): ts for c, ts in starts.items()}, settings) if settings else 0
    again = _redelivered(runs, rows_of, pos)
    classes["redelivered"] = {name(c) for c in again}  # not an outcome class
    classes["taken_by_stop"] = (classes["stranded"] | classes["dead_lettered"]) & located.stopped  # nor this
    indeterminate_ids = {j for j in set(indeterminate) if enq.has(j)}
    # Nothing to hash when the workload fails nothing (most runs; a million ids take seconds).
    failing = workload if workload is not None and (workload.poison_rate or workload.transient_rate) else None
    ids = JobIds(enq.codes)
    crash_codes = {c for c in enq.codes if workload.crashes(name(c))} if workload and workload.crash_rate else set()
    held = classes["stranded"] | classes["undrained"]
    bound = settings.max_attempts if settings else DesignSettings().max_attempts
    counts = Counts(
        enqueued=enq.n,
        done=len(done),
        dead_lettered=len(classes["dead_lettered"]),
        stranded=len(classes["stranded"]),
        failed=len(classes["failed"]),
        lost=len(classes["lost"]),
        unconfirmed=len(classes["unconfirmed"]),
        duplicated=len(dups),
        duplicated_overlapping=overlapping,
        duplicated_sequential=len(dups) - overlapping,
        extra_executions=sum(len(completions[c]) - 1 for c in dups),
        failed_attempts=len(failed_rows),
        retried=len(retried),
        early_retries=early,
        dead_lettered_poison=len(classes["dead_lettered"] & last_raised),
        redelivered=len(again),
        redeliveries=sum(again.values()),
        requeued=sum(1 for j in queue.requeued if enq.has(j)),
        requeue_events=queue.requeue_events,
        unexpected=len({*stray, *(c for c in others if pos(c) < 0)}),
        executions=len(runs),
        interrupted=interrupted,
        kills=kills,
        kills_mid_job=kills_mid_job,
        poison_jobs=sum(1 for j in ids if failing.is_poison(j)) if failing else 0,
        transient_jobs=sum(1 for j in ids if failing.is_transient(j)) if failing else 0,
        failing_jobs=sum(1 for j in ids if failing.fails(j, 1)) if failing else 0,
        crash_jobs=len(crash_codes),
        crash_attempts=sum(1 for c in runs.jobs if c in crash_codes) if crash_codes else 0,
        crash_looping=sum(1 for c in crash_codes if name(c) in held and len(starts.get(c, ())) > bound),
        stranded_at=dict(sorted(where.items())),
        taken_by_stop=len(classes["taken_by_stop"]),
        indeterminate=len(indeterminate_ids),
        recovered=sum(1 for j in indeterminate_ids if j in done),
        acks_lost=acks_lost,
        # Every entry still held, a completed job's included (a stream entry never acked): at least 1.
        undrained=0 if drained and not cut_off else max(1, len(located.held)),
        library_disagrees=len(classes["library_disagrees"]),
    )
    return counts, classes


def _redelivered(runs: Executions, rows_of: dict[int, list[int]], pos: Callable[[int], int]) -> Counter[int]:
    """Per enqueued job started more than once, its starts that followed a start that did not raise."""
    out: Counter[int] = Counter()
    for c, rows in rows_of.items():
        if len(rows) > 1 and pos(c) >= 0:
            rows = sorted(rows, key=runs.starts.__getitem__)
            if n := sum(1 for r in rows[:-1] if not runs.flags[r] & FAILED):
                out[c] = n
    return out


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
