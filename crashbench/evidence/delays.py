"""Delayed jobs ([workload] delay_s): when each delayed job was due, on the harness's own clock (the
time the harness sent its enqueue, plus the job's delay: crashbench.model.workload), against the
ledger's starts, which the queue does not control.

    early_starts      handler starts before their job was due: a queue that runs a delayed job early
    lateness          how long after it was due each delayed job first started (timings:
                      delay_lateness_ms_p50 / p95 / max); a delayed job that never started is in none

The enqueue's time is taken before the library computes its own due time, so a start at the library's
due time is never early here. Duplicates and losses of delayed jobs are the outcome counts'.
"""

from __future__ import annotations

from crashbench import jobids
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.model.faults import JOB_SAMPLE
from crashbench.model.timeline import Timeline
from crashbench.model.workload import Workload


def due_times(tl: Timeline, workload: Workload) -> dict[int, float]:
    """Each delayed job's due time (timeline clock), by job code; its first enqueue's, if sent twice."""
    due: dict[int, float] = {}
    for e in tl.enqueues:
        for job in e.ids:
            if (delay := workload.delay_of(job)) and (c := jobids.code(job)) not in due:
                due[c] = e.t + delay
    return due


@checker("delays")
def delays(h: History, before: Sections) -> Section:
    """Early starts and lateness of the delayed jobs; nothing without a delayed workload."""
    workload = h.scenario.workload_model()
    if not workload.delay_s:
        return Section("delays")
    due = due_times(h.timeline, workload)
    first: dict[int, float] = {}
    early: set[int] = set()
    starts = 0
    for c, start in zip(h.runs.jobs, h.runs.starts, strict=True):
        if (at := due.get(c)) is None:
            continue
        if start < at:
            starts += 1
            early.add(c)
        if c not in first or start < first[c]:
            first[c] = start
    lateness = sorted(round((start - due[c]) * 1000, 3) for c, start in first.items())
    jobs = {"early_starts": sorted(jobids.name(c) for c in early)[:JOB_SAMPLE]} if early else {}
    return Section("delays", counts={"early_starts": starts}, jobs=jobs, facts={"lateness": lateness})
