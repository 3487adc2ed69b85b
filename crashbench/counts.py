"""From evidence to counts: the ledger (what ran), the queue's final state (what it holds) and the
list of enqueued ids. Outcome classes are decided per job, in this order, so each enqueued job is
in exactly one: done, dead-lettered, stranded, lost. Everything else counts events, not jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field

from crashbench.designs import QueueState
from crashbench.ledger import Execution


@dataclass(slots=True)
class Counts:
    enqueued: int = 0
    # outcome classes, one per enqueued job
    done: int = 0  # its handler ran to completion at least once
    dead_lettered: int = 0  # never completed; the queue dead-lettered it
    stranded: int = 0  # never completed, not dead; the queue still holds it after the final recovery
    lost: int = 0  # never completed, and the queue has no trace of it
    # events and anomalies
    duplicated: int = 0  # jobs completed more than once
    extra_executions: int = 0  # completions beyond the first, over all jobs
    requeued: int = 0  # jobs recovery gave back at least once
    requeue_events: int = 0  # times recovery gave a job back
    unexpected: int = 0  # ids executed that were never enqueued
    executions: int = 0  # handler starts, in all
    interrupted: int = 0  # handler starts that never finished (the worker died inside)
    kills: int = 0
    kills_mid_job: int = 0
    stranded_at: dict[str, int] = field(default_factory=dict)  # where the stranded jobs sit

    def outcome_total(self) -> int:
        return self.done + self.dead_lettered + self.stranded + self.lost

    def problems(self) -> list[str]:
        """Arithmetic that must hold for any run; a non-empty list means crashbench itself is wrong."""
        p = []
        if self.outcome_total() != self.enqueued:
            p.append(
                f"done {self.done} + dead-lettered {self.dead_lettered} + stranded {self.stranded} "
                f"+ lost {self.lost} = {self.outcome_total()}, not enqueued {self.enqueued}"
            )
        if sum(self.stranded_at.values()) != self.stranded:
            p.append(f"stranded {self.stranded} but the locations add up to {sum(self.stranded_at.values())}")
        if self.duplicated > self.extra_executions:
            p.append(f"duplicated {self.duplicated} > extra executions {self.extra_executions}")
        if self.kills_mid_job > self.kills:
            p.append(f"kills mid-job {self.kills_mid_job} > kills {self.kills}")
        return p

    def as_numbers(self) -> dict[str, int]:
        d = asdict(self)
        d.pop("stranded_at")
        return d


def classify(enqueued: Collection[str], completed: Counter[str], queue: QueueState) -> dict[str, set[str]]:
    """Each enqueued id in exactly one outcome class, by precedence: done, dead-lettered, stranded, lost."""
    ids = set(enqueued)
    done = {j for j in ids if completed[j] > 0}
    dead = (queue.dead_lettered & ids) - done
    stranded = (set(queue.held) & ids) - done - dead
    return {"done": done, "dead_lettered": dead, "stranded": stranded, "lost": ids - done - dead - stranded}


def count(
    enqueued: Collection[str],
    executions: Iterable[Execution],
    queue: QueueState,
    kills: int = 0,
    kills_mid_job: int = 0,
) -> tuple[Counts, dict[str, set[str]]]:
    """The counts, and the ids behind each outcome class."""
    completed: Counter[str] = Counter()
    started: set[str] = set()
    n_exec = interrupted = 0
    for ex in executions:
        n_exec += 1
        started.add(ex.job)
        if ex.end is None:
            interrupted += 1
        else:
            completed[ex.job] += 1
    ids = set(enqueued)
    classes = classify(ids, completed, queue)
    where = Counter(queue.held[j].split(":")[0] for j in classes["stranded"])
    counts = Counts(
        enqueued=len(ids),
        done=len(classes["done"]),
        dead_lettered=len(classes["dead_lettered"]),
        stranded=len(classes["stranded"]),
        lost=len(classes["lost"]),
        duplicated=sum(1 for j in ids if completed[j] > 1),
        extra_executions=sum(c - 1 for j, c in completed.items() if j in ids and c > 1),
        requeued=len(queue.requeued & ids),
        requeue_events=queue.requeue_events,
        unexpected=len(started - ids),
        executions=n_exec,
        interrupted=interrupted,
        kills=kills,
        kills_mid_job=kills_mid_job,
        stranded_at=dict(sorted(where.items())),
    )
    return counts, classes
