"""A power cut's history event and its checker: by id, what the cut took from the disk, read from
evidence the server does not control (the AOF's bytes, the lazy file system's account of its fsyncs,
and a reading of the durable state: crashbench.faults.power.broker).

The event ("power", "cut", at the cut) holds:
    shortened   the files the cut shortened: [length before, after]
    aof         the run's persistence keeps an AOF, and `exact`: every command of the data set was read
                (no RDB base holding data); `torn`: bytes at its end no server loads
    synced      the AOF's last fsync before the cut (seconds of the run: just before and just after its
                length was read; None: never fsynced); with no AOF, the RDB snapshot's
    durable     the jobs the durable AOF names (by the run's token: crashbench.evidence.aof.mentions)
    cut         the jobs only the part the cut took named
    held        the jobs the durable state holds (None: not read)

The checker's counts:
    enqueues_cut    acknowledged enqueues (before the cut) whose job no durable command names
    acks_cut        jobs the durable state holds that the server no longer held as it died (the
                    harness's reading then, writes paused): their take or acknowledgement did not reach
                    the disk, so they come back
    acks_cut_reran  ... of them, the jobs that ran again after the cut

and its check (`power_fsync`), of the disk model against the server's bytes and the producer's clock:
an enqueue acknowledged before the AOF's last fsync (the producer's next send, or the cut, bounds its
acknowledgement) must be in the durable AOF; one sent after that fsync must not be, unless the cut
tore a page (`tear`) or it was sent `writeback` seconds before the cut or earlier (the kernel's
writeback made it durable without an fsync).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from crashbench.evidence.aof import mentions
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.evidence.search import Needle
from crashbench.faults.family import Driver
from crashbench.model.counts import Problem
from crashbench.model.faults import JOB_SAMPLE
from crashbench.model.timeline import FaultEvent, Timeline, rel

FAMILY = "power"


def event(broker: Any, needle: Needle, t0: float) -> FaultEvent:
    """The cut's event, from a PowerBroker after its kill."""
    before, after = broker.aof_before, broker.aof_after
    durable = set(mentions(after, needle))
    named = set(mentions(before, needle))
    synced = broker.aof_synced_at()
    data: dict[str, Any] = {
        "shortened": {name: list(v) for name, v in sorted(broker.shortened.items())},
        "aof": bool(before.files),
        "exact": before.exact and after.exact,
        "torn": sum(after.torn().values()),
        "tear": broker.tear,
        "writeback": broker.writeback,
        "synced": None if synced is None else [rel(synced[0], t0), rel(synced[1], t0)],
        "durable": sorted(durable),
        "cut": sorted(named - durable),
        "held": None if broker.held_after_cut is None else sorted(broker.held_after_cut),
    }
    return FaultEvent(FAMILY, "cut", rel(broker.cut_at, t0), data)


def history(d: Driver) -> dict[str, Any]:
    broker = d.broker  # type: ignore[attr-defined]
    if broker.cut_at is None or broker.needle is None:
        return {}
    return {"fault_events": [event(broker, broker.needle, d.t0)]}  # type: ignore[attr-defined]


def cut_event(tl: Timeline) -> FaultEvent | None:
    return next((e for e in tl.fault_events if e.family == FAMILY and e.what == "cut"), None)


def acknowledged_before(tl: Timeline, at: float) -> list[tuple[float, float, list[str]]]:
    """The enqueues acknowledged before `at`: (sent, acknowledged by, ids). The producer sends one chunk a
    call, from the runner's loop, the fault's step after it: a chunk's acknowledgement came before the
    next chunk was sent, and before the cut."""
    sent = [e for e in tl.enqueues if e.t < at]
    out = []
    for i, e in enumerate(sent):
        if e.ok:
            out.append((e.t, sent[i + 1].t if i + 1 < len(sent) else at, list(e.ids)))
    return out


@checker("power")
def power(h: History, before: Sections) -> Section:
    """What a power cut took, by id: acknowledged enqueues, and completions whose record the disk lost."""
    tl = h.timeline
    ev = cut_event(tl)
    if ev is None:
        return Section(FAMILY)
    at, d = ev.t, ev.data
    durable, counts, problems = set(d["durable"]), {}, []
    acked = acknowledged_before(tl, at)
    fields: dict[str, Any] = {}
    if d["aof"] and d["exact"]:
        cut_ids = sorted(j for _, _, ids in acked for j in ids if j not in durable)
        counts["enqueues_cut"] = len(cut_ids)
        problems += _fsync_problems(acked, durable, d, at)
        oldest = min((sent for sent, _, ids in acked if any(j not in durable for j in ids)), default=None)
        fields["lost_window_ms"] = None if oldest is None else round((at - oldest) * 1000, 3)
    if tl.broker_fault is not None:
        fields = {
            "broker_fault": dataclasses.replace(
                tl.broker_fault,
                held_ids=list(tl.broker_fault.held_ids),
                unsynced_ms=None if d["synced"] is None else round((at - d["synced"][1]) * 1000, 3),
                lost_window_ms=fields.get("lost_window_ms"),
            )
        }
    if d["held"] is not None:
        # Held by the durable state, not by the server as it died (the harness's reading, writes paused):
        # taken or acknowledged in memory, and not on the disk.
        back = set(d["held"]) - set(tl.held_at_fault)
        reran = {ex.job for ex in tl.executions if ex.job in back and ex.start > at}
        counts["acks_cut"], counts["acks_cut_reran"] = len(back), len(reran)
    return Section(FAMILY, counts=counts, problems=problems, fields=fields)


def _fsync_problems(
    acked: list[tuple[float, float, list[str]]], durable: set[str], d: dict[str, Any], at: float
) -> list[Problem]:
    synced = d["synced"]
    lo, hi = (synced[0], synced[1]) if synced is not None else (float("-inf"), float("-inf"))
    missing = sorted(j for _, by, ids in acked if by <= lo for j in ids if j not in durable)
    out = []
    if missing:
        out.append(
            Problem(
                "power_fsync",
                f"{len(missing)} enqueues acknowledged before the AOF's last fsync are not in the AOF the cut "
                "left: the disk lost what was fsynced",
                missing[:JOB_SAMPLE],
            )
        )
    if not d.get("tear"):
        # Written back without an fsync: a write `writeback` s old at the cut (it came after its sending).
        since = at - d["writeback"] if d.get("writeback") else float("-inf")
        kept = sorted(j for sent, _, ids in acked if sent >= hi and sent > since for j in ids if j in durable)
        if kept:
            out.append(
                Problem(
                    "power_fsync",
                    f"{len(kept)} enqueues sent after the AOF's last fsync are in the AOF the cut left: the disk "
                    "kept what was never fsynced",
                    kept[:JOB_SAMPLE],
                )
            )
    return out
