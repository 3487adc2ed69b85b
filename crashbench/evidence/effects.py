"""The user's own evidence against the ledger ([app] check: crashbench.run.effects records it).

The check reads the user's system of record (a row exists; exists once) after the run, so its counts
come from outside the queue and outside crashbench's ledger: `effect_missing` (no effect),
`effect_duplicated` (more than one), and `effect_disagrees`, the jobs where the effect count and the
ledger's completions fall in different classes (none, once, more than once). Those name what neither
source shows alone: a task killed after its write and before it returned (effects 2, completions 1),
or an idempotent app absorbing a re-run (effects 1, completions 2).
"""

from __future__ import annotations

from collections import Counter

from crashbench import jobids
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.model.executions import FAILED
from crashbench.model.faults import JOB_SAMPLE


def _class(n: int) -> int:
    return min(n, 2)  # none, once, more than once


@checker("effects")
def effects(h: History, before: Sections) -> Section:
    """effect_missing, effect_duplicated and effect_disagrees from the check's answers and the ledger."""
    recorded = h.timeline.effects
    if recorded is None:
        return Section("effects")
    answers: dict[str, int] = recorded["counts"]  # the jobs whose effect is not there exactly once
    runs = h.runs
    completions: Counter[int] = Counter(
        c for c, end, flags in zip(runs.jobs, runs.ends, runs.flags, strict=True) if end == end and not flags & FAILED
    )
    disagree = [
        job for job in h.timeline.ids if _class(answers.get(job, 1)) != _class(completions.get(jobids.code(job), 0))
    ]
    missing = sorted(j for j, n in answers.items() if n == 0)
    duplicated = sorted(j for j, n in answers.items() if n > 1)
    counts = {
        "effect_checked": int(recorded["checked"]),
        "effect_missing": len(missing),
        "effect_duplicated": len(duplicated),
        "effect_disagrees": len(disagree),
    }
    jobs = {"effect_missing": missing[:JOB_SAMPLE], "effect_duplicated": duplicated[:JOB_SAMPLE],
            "effect_disagrees": sorted(disagree)[:JOB_SAMPLE]}  # fmt: skip
    return Section("effects", counts=counts, jobs=jobs, facts={"answers": answers})
