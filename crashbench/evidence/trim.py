"""Why a lost job of a trimmed stream is lost: its entry was trimmed before anyone read it, or while it
was pending (delivered, never acknowledged).

A trimmed entry takes its job id with it, so Redis alone cannot name the job afterwards. The evidence
is three records, none of them the design's account of itself:

- the entry id XADD answered for each job, returned by the design's enqueue and kept in the
  timeline's enqueue events (`Enqueue.entries`);
- the harness's own reading of the stream at the end (crashbench.model.queue.StreamEnd): an entry
  id below its first entry was removed from its head, which only trimming (or XDEL) does; and its
  pending entries whose data is gone;
- the ledgers: a job some worker started was delivered, and one that never completed was never
  acknowledged (crashbench's worker acks after the end record), so it was pending when its entry went.

Pending: the job started in some worker (or its entry is still in the final PEL, data gone). Unread:
neither. A job that ever raised is in neither class: its retry is a later entry no receipt names. A
delivery that no ledger saw (a kill between XREADGROUP and the start record: `kill_when = "any"`; the
unstarted rest of a killed batch) counts as unread.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from crashbench import jobids
from crashbench.model.executions import FAILED, Executions
from crashbench.model.timeline import Timeline


@dataclass(slots=True)
class Trimmed:
    unread: set[str] = field(default_factory=set)  # lost, its entry trimmed before any delivery
    pending: set[str] = field(default_factory=set)  # lost, its entry trimmed while delivered and unacknowledged


def trimmed(tl: Timeline, lost: AbstractSet[str]) -> Trimmed | None:
    """The lost jobs whose entries the stream trimmed, split as above; None when no enqueue returned
    receipts (a design that returns none, or a timeline saved before receipts were kept), or when a
    broker fault may have lost entries itself (a restart without persistence, a failover): an entry
    missing below the first is then not proof of a trim."""
    if tl.broker_fault is not None or all(e.entries is None for e in tl.enqueues):
        return None
    out = Trimmed()
    # One stream: receipts do not name their key, and a design with several streams would need them to.
    if len(tl.located.streams) != 1 or not lost:
        return out
    (end,) = tl.located.streams.values()
    removed: dict[int, str] = {}  # job code -> its entry id, for the lost jobs whose entry is gone
    for e in tl.enqueues:
        if e.entries is None:
            continue
        for job, eid in zip(e.ids, e.entries, strict=True):
            if job in lost and end.removed(eid):
                removed[jobids.code(job)] = eid
    started: set[int] = set()
    raised: set[int] = set()
    runs = Executions.of(tl.executions)
    for c, flags in zip(runs.jobs, runs.flags, strict=True):
        if c in removed:
            started.add(c)
            if flags & FAILED:
                raised.add(c)
    gone = set(end.gone)
    for c, eid in removed.items():
        if c in raised:
            continue
        (out.pending if c in started or eid in gone else out.unread).add(jobids.name(c))
    return out
