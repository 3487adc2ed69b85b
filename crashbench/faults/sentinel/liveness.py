"""What the workers did around a sentinel fault, from the ledgers and the harness's readings alone (the
queue's own word is not asked): which handlers were running when the primary died and whether their jobs
ran again; and after the promotion (the record's back_at), how soon each worker slot started a handler
again, and which never did although jobs waited (stuck_workers). A worker told only the sentinels has to
find the promoted replica itself: its slot's resume time is how long that took it.
"""

from __future__ import annotations

import dataclasses

from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.model.faults import BrokerFaultRecord
from crashbench.model.timeline import Timeline

KINDS_PREFIX = "sentinel-"  # the family's kinds (crashbench.faults.sentinel)
QUORUM = "sentinel-quorum"  # crashbench.faults.sentinel.quorum's kind


def settle(bf: BrokerFaultRecord, tl: Timeline, workers: int) -> tuple[BrokerFaultRecord, dict[str, int]]:
    """The record with its slots' resume times and stuck slots; the mid-job counts."""
    running = [ex for ex in tl.executions if ex.start < bf.at and (ex.end is None or ex.end > bf.at)]
    later = {ex.job for ex in tl.executions if ex.start > bf.at}
    counts = {"mid_job_at_fault": len(running), "mid_job_ran_again": len({ex.job for ex in running} & later)}
    if bf.kind == QUORUM:  # promoted before the killed sentinels were back: the quorum did not hold the failover
        early = bf.back_at is not None and (bf.quorum_back_at is None or bf.back_at < bf.quorum_back_at)
        counts["promoted_without_quorum"] = int(early)
    settled = dataclasses.replace(bf, held_ids=list(bf.held_ids), slot_resume_ms=[], stuck=[])
    if bf.back_at is None:
        return settled, counts
    back, slot_of = bf.back_at, tl.slot_of()
    first: dict[int, float] = {}
    for ex in tl.executions:
        slot = slot_of.get(ex.worker)
        if slot is not None and ex.start >= back and (slot not in first or ex.start < first[slot]):
            first[slot] = ex.start
    settled.slot_resume_ms = [round((first[s] - back) * 1000, 3) if s in first else None for s in range(workers)]
    waited = bool(first) or any(d.t >= back and d.pending for d in tl.depth)
    settled.stuck = [s for s in range(workers) if waited and s not in first]
    return settled, counts


@checker("failover")
def failover(h: History, before: Sections) -> Section:
    bf = h.timeline.broker_fault
    if bf is None or not bf.kind.startswith(KINDS_PREFIX):
        return Section("failover")
    settled, counts = settle(bf, h.timeline, h.scenario.workload.workers)
    counts["stuck_workers"] = len(settled.stuck)
    return Section("failover", counts=counts, fields={"broker_fault": settled})
