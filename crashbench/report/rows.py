"""The counts a table shows, in order, and how: shared by the terminal table (render.py) and the HTML
report (tables.py). No rich here: the HTML report is core-side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crashbench.faults import registry
from crashbench.model.results import DesignRun, ThresholdResult, number

# (label, count field) in display order; outcome classes first, then events.
ROWS: tuple[tuple[str, str], ...] = (
    ("enqueued", "enqueued"),
    ("done", "done"),
    ("lost", "lost"),
    ("  trimmed", "trimmed"),
    ("    before any read", "trimmed_unread"),
    ("    while pending", "trimmed_pending"),
    ("unconfirmed", "unconfirmed"),
    ("stranded", "stranded"),
    ("failed", "failed"),
    ("dead-lettered", "dead_lettered"),
    ("  of which poison", "dead_lettered_poison"),
    ("duplicated", "duplicated"),
    ("  overlapping", "duplicated_overlapping"),
    ("  sequential", "duplicated_sequential"),
    ("extra executions", "extra_executions"),
    ("redelivered", "redelivered"),
    ("  empty acks", "empty_acks"),
    ("failed attempts", "failed_attempts"),
    ("retried", "retried"),
    ("  before their backoff", "early_retries"),
    ("delayed jobs started early", "early_starts"),
    ("unexpected", "unexpected"),
    ("interrupted", "interrupted"),
    ("  never ran again", "unrecovered"),
    ("indeterminate enqueues", "indeterminate"),
    ("  done all the same", "recovered"),
    ("acks lost", "acks_lost"),
    ("held at the fault, never done", "held_at_fault"),
    ("acked while the replica lagged", "acked_during_lag"),
    ("not replicated", "not_replicated"),
    ("undrained", "undrained"),
    ("worker crashes", "worker_crashes"),
    ("stuck workers", "stuck_workers"),
    ("library disagrees", "library_disagrees"),
    ("consumers left", "consumers"),
    ("your check: jobs checked", "effect_checked"),
    ("  effect missing", "effect_missing"),
    ("  effect duplicated", "effect_duplicated"),
    ("  disagrees with the ledger", "effect_disagrees"),
    ("jobs that crash their worker", "crash_jobs"),
    ("  attempts", "crash_attempts"),
    ("  still crashing at the end", "crash_looping"),
    # each fault family's own (crashbench.faults.family.FaultFamily.rows)
    *((label, key) for family in registry.FAMILIES for label, key, _ in family.rows),
)
ALARM = {
    "lost", "stranded", "failed", "duplicated", "extra_executions", "unexpected", "early_retries", "acks_lost",
    "undrained", "worker_crashes", "library_disagrees", "stuck_workers", "effect_missing", "effect_duplicated",
    "effect_disagrees", "early_starts", "crash_looping",
    *(key for family in registry.FAMILIES for _, key, alarm in family.rows if alarm),
}  # fmt: skip
# Shown only when some run has a non-zero value: a plain crash test keeps a short table.
OPTIONAL = {
    "unconfirmed", "indeterminate", "recovered", "acks_lost", "held_at_fault", "acked_during_lag", "not_replicated",
    "failed", "dead_lettered_poison", "duplicated_overlapping", "duplicated_sequential", "failed_attempts", "retried",
    "early_retries", "undrained", "worker_crashes", "unrecovered", "library_disagrees", "stuck_workers", "empty_acks",
    "trimmed", "trimmed_unread", "trimmed_pending", "consumers", "early_starts", "crash_jobs", "crash_attempts",
    "crash_looping", *(key for family in registry.FAMILIES for _, key, _ in family.rows),
}  # fmt: skip
# Shown whenever some run had the user's check ([app] check), zero or not: "no duplicate effect" is its answer.
WITH_CHECK = {"effect_checked", "effect_missing", "effect_duplicated", "effect_disagrees"}


def shown(key: str, runs: Sequence[DesignRun]) -> bool:
    """Whether the tables show count `key` for these runs."""
    if key in WITH_CHECK:
        return any(run.counts.effect_checked for run in runs)
    return key not in OPTIONAL or any(getattr(run.counts, key) for run in runs)


def threshold_detail(t: ThresholdResult) -> str:
    """ "got 5, bound 3, baseline 4; note": the value checked and what it was checked against."""
    unit = f" {t.unit}" if t.unit not in ("", "x") else ""
    got = "-" if t.actual is None else f"{number(t.actual)}{unit}"
    text = f"got {got}"
    if t.expected is not None and (t.baseline is not None or not t.threshold.endswith(number(t.expected))):
        text += f", bound {number(t.expected)}{unit}"
    if t.baseline is not None:
        text += f", baseline {number(t.baseline)}{unit}"
    if t.note:
        text += f"; {t.note}"
    return text


def effect_note(run: DesignRun, shown_ids: int = 10) -> str | None:
    """What the user's check and the ledger disagree on ([app] check), in one sentence; None when nothing."""
    c = run.counts
    if not c.effect_disagrees:
        return None
    ids = run.jobs.get("effect_disagrees", [])
    listed = ", ".join(ids[:shown_ids]) + (" ..." if len(ids) > shown_ids else "")
    return (
        f"your check and the ledger disagree on {c.effect_disagrees} jobs: the effect exists (none, once, more) "
        "otherwise than the task completed (an effect written by an attempt killed before it returned, or a re-run "
        f"the app absorbed): {listed}"
    )


def kills_phrase(sc: dict[str, Any], times: str = "×") -> str:
    """The scenario's worker kills in a few words: "no worker kills" when it has none."""
    if not sc.get("kills"):
        return "no worker kills"
    return f"{sc['kills']} {times} {sc['signal']} every {sc['interval']:g} s ({sc['kill_when']})"
