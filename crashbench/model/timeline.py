"""The run's timeline: every event of one crash run on one clock, the record its counts are computed
from (crashbench.evidence.tally reads a Timeline and nothing else) and that `crashbench recount` reads back.

The clock is seconds since the run's workers were started (`t0`, a time.monotonic() value kept in the
header with the wall-clock start), rounded to the microsecond. Saved as gzipped JSON lines beside the
result (`<result>.timeline.jsonl.gz`), one JSON object per line, `e` naming the event; the runs of one
result follow each other, each opened by its `run` line:

    run        the header: index, design spec and flags, scenario, t0, wall-clock start, window
    enqueue    a chunk of ids sent to the queue: t, ids, ok (acknowledged; false: indeterminate), lag,
               and entries when the design returned receipts (a stream's entry ids, one per id)
    spawn      a worker process started: t, worker, slot, pid         ready   its READY: t, worker
    x          one handler execution from the ledgers: j(ob), w(orker), s(tart), d (end; null: the
               worker died inside), f (1: it raised), p(id), x (thread), a (its ack returned; null:
               not acked, or a library's worker, which cannot tell), n (1: the ack found nothing)
    ledger_problem  a ledger record that did not fit (crashbench.model.ledger)
    planned    the fault schedule the seed gave
    signal     a worker signal as executed (SignalRecord; "kill" in older files)
    net        a network fault as executed: index, toxic, slots, at, healed_at, target
    mark       t, what, n: a recovery pass ("recover", n = what it gave back by the design's own figure,
               -1 when it does not tell), the server ("down", "up", "failover", "replica_cut",
               "rejoined"), the drain's start ("drain"), a pause healed ("resume <worker>")
    broker_fault   the broker fault as executed
    fault_event    a fault family's own event: family, what, t, data (crashbench.faults.family: a
               family whose history has no field here writes these)
    depth      the harness's reading of the queue: t, pending, inflight, delayed, dead
    exit       a worker that ended on its own
    held_at_fault   the ids the server held when the broker fault struck (the harness's reading)
    held_after_promotion  a cluster fault: the ids the promoted replica held as it was promoted (ditto)
    located    the harness's final reading of Redis (with "streams": each stream's first entry, last
               generated id and pending entries whose data is gone, when it read a stream; and the
               streams' consumers), corrected by its own search for the run's token
               (crashbench.evidence.keyspace); "stopped": the jobs held before the workers were
               stopped and nowhere after, counted where they were (crashbench.run.reading)
    reading_problem  where that search and the design's reading disagreed: check, message, ids
    state      the design's own final report
    effects    the user's own evidence ([app] check): check, checked, counts (job -> times its effect
               exists, for each job where that is not once)
    end        the run's end: faults_end, drained_at (the drain's end), drained, cut_off, inspect_s, workdir;
               after a drain, settled_at, backlog_after and held_at_drain (the watch after it, and the ids
               Redis held as it began: crashbench.run.drain)

Size: one `x` line per execution (start and end together) is about 30 bytes gzipped.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring_ascii as _string  # type: ignore[attr-defined]
from pathlib import Path
from typing import IO, Any

from crashbench import files
from crashbench.jobids import JobIds
from crashbench.model.counts import Problem
from crashbench.model.executions import EMPTY_ACK, FAILED, Execution, Executions
from crashbench.model.faults import (
    BrokerFaultRecord,
    Fault,
    NetworkFaultRecord,
    SignalRecord,
    WorkerExit,
    fault_dict,
    fault_of,
)
from crashbench.model.ledger import LedgerProblem
from crashbench.model.queue import Located, QueueState, Receipts, StreamEnd
from crashbench.model.stored import Consumer

SCHEMA = "crashbench.timeline"
SCHEMA_VERSION = 1


def rel(t: float, t0: float) -> float:
    """A harness-clock time on the timeline's clock."""
    return round(t - t0, 6)


@dataclass(frozen=True, slots=True)
class Enqueue:
    t: float
    ids: JobIds  # read as a sequence of id strings
    ok: bool = True  # acknowledged; False: it errored or timed out (indeterminate)
    lag: bool = False  # acknowledged by a primary whose replica had stopped following
    entries: Receipts = None  # what the design's enqueue returned, one per id: a stream's entry ids


@dataclass(frozen=True, slots=True)
class Spawn:
    t: float
    worker: str
    slot: int
    pid: int


@dataclass(frozen=True, slots=True)
class Depth:
    """The harness's own reading of the queue (crashbench.evidence.inspector through the design's `locate`)."""

    t: float
    pending: int
    inflight: int  # jobs inside a handler, by the ledgers
    delayed: int
    dead: int


@dataclass(frozen=True, slots=True)
class Mark:
    """A point event: a recovery pass (`what` "recover", `n` what it gave back by the design's own
    figure, -1 unknown), a broker event (down, up, failover, replica_cut), the drain's start, a paused
    worker resumed ("resume w3": the pause healed)."""

    t: float
    what: str
    n: int = -1


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """A fault family's own event, for what its history holds beyond the fields below (a new family
    needs no field of its own): the family's name, what happened, when, and its details (JSON values).
    A "slots" list in the details names the worker slots the event struck (evidence.tally counts it a fault)."""

    family: str
    what: str
    t: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class DesignFlags:
    drops_failed: bool = False
    own_worker: bool = False
    exactly_once: bool = False
    counts_requeues: bool = False


@dataclass(slots=True)
class Timeline:
    index: int
    spec: str
    variant: str
    prefix: str
    repeat: int
    scenario: dict[str, Any]
    design: DesignFlags
    t0: float  # the harness clock (time.monotonic()) at the timeline's 0
    started: float  # wall clock (time.time()) at the timeline's 0
    window: float
    produced: bool = False  # jobs were enqueued while the run went on (a broker scenario's producer)
    configuration: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    enqueues: list[Enqueue] = field(default_factory=list)
    spawns: list[Spawn] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)
    executions: Sequence[Execution] = field(default_factory=Executions)  # Executions, or a test's list
    ledger_problems: list[LedgerProblem] = field(default_factory=list)
    planned: list[Fault] = field(default_factory=list)
    signals: list[SignalRecord] = field(default_factory=list)  # worker signals as executed: kills, stops, pauses
    network: list[NetworkFaultRecord] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    fault_events: list[FaultEvent] = field(default_factory=list)
    depth: list[Depth] = field(default_factory=list)
    broker_fault: BrokerFaultRecord | None = None
    exits: list[WorkerExit] = field(default_factory=list)
    held_at_fault: list[str] = field(default_factory=list)
    held_after_promotion: list[str] = field(default_factory=list)  # a cluster fault: the promoted replica's reading
    located: Located = field(default_factory=Located)
    reading_problems: list[Problem] = field(default_factory=list)  # crashbench.evidence.keyspace
    state: QueueState = field(default_factory=QueueState)
    faults_end: float = 0.0
    drained_at: float = 0.0
    drained: bool = False
    cut_off: bool = False
    # the watch after a drain (crashbench.run.drain.watch): its end, and the most backlog() said during it
    # (-1: it could not tell); None: no watch (not drained, or a timeline from before it)
    settled_at: float | None = None
    backlog_after: int = -1
    held_at_drain: list[str] | None = None  # the ids Redis held as the watch began (None: not read)
    inspect_s: float = 0.0
    workdir: str | None = None
    effects: dict[str, Any] | None = None  # the user's check's answers (crashbench.run.effects); None: no check

    # -- what the counts read ------------------------------------------------------------------

    @property
    def ids(self) -> JobIds:
        """Every enqueued id, in order: one range of codes when the enqueues followed each other."""
        return JobIds.concat(JobIds.of(e.ids) for e in self.enqueues)

    @property
    def acknowledged(self) -> set[str]:
        return {j for e in self.enqueues if e.ok for j in e.ids}

    @property
    def indeterminate(self) -> set[str]:
        return {j for e in self.enqueues if not e.ok for j in e.ids}

    @property
    def acked_during_lag(self) -> set[str]:
        return {j for e in self.enqueues if e.ok and e.lag for j in e.ids}

    def fault_window(self) -> tuple[float, float] | None:
        """(struck, server back) of the broker fault, on the timeline's clock."""
        f = self.broker_fault
        if f is None:
            return None
        return (f.at, f.back_at if f.back_at is not None else f.at)

    def slot_of(self) -> dict[str, int]:
        return {s.worker: s.slot for s in self.spawns}

    # -- saving and reading ----------------------------------------------------------------------

    def lines(self) -> Iterator[dict[str, Any] | Executions]:
        yield {
            "e": "run", "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "index": self.index,
            "spec": self.spec, "variant": self.variant, "prefix": self.prefix, "repeat": self.repeat,
            "scenario": self.scenario, "design": asdict(self.design), "t0": self.t0, "started": self.started,
            "window": self.window, "produced": self.produced, "configuration": self.configuration,
            "warnings": self.warnings,
        }  # fmt: skip
        for e in self.enqueues:
            extra = {} if e.entries is None else {"entries": list(e.entries)}  # older timelines have none
            yield {"e": "enqueue", "t": e.t, "ids": list(e.ids), "ok": e.ok, "lag": e.lag, **extra}
        for s in self.spawns:
            yield {"e": "spawn", "t": s.t, "worker": s.worker, "slot": s.slot, "pid": s.pid}
        for worker, t in self.ready.items():
            yield {"e": "ready", "t": t, "worker": worker}
        for p in self.planned:
            yield {"e": "planned", **fault_dict(p)}
        for k in self.signals:  # as executed: what the counting derives from them is not evidence
            yield {"e": "signal", **asdict(k), "replacement_ready_ms": None, "recovered_after_ms": None}
        for nf in self.network:  # as executed: what the counting derives from them is not evidence
            yield {"e": "net", "index": nf.index, "toxic": nf.toxic, "slots": nf.slots, "at": nf.at,
                   "healed_at": nf.healed_at, "target": nf.target}  # fmt: skip
        for m in self.marks:
            yield {"e": "mark", "t": m.t, "what": m.what, "n": m.n}
        if self.broker_fault is not None:
            yield {"e": "broker_fault", **asdict(self.broker_fault)}
        for ev in self.fault_events:
            yield {"e": "fault_event", **asdict(ev)}
        for d in self.depth:
            yield {"e": "depth", "t": d.t, "p": d.pending, "i": d.inflight, "l": d.delayed, "d": d.dead}
        yield Executions.of(self.executions)  # the bulk: written by _x_lines, without a dict each
        for lp in self.ledger_problems:
            yield {"e": "ledger_problem", **asdict(lp)}
        for x in self.exits:
            yield {"e": "exit", **asdict(x)}
        yield {"e": "held_at_fault", "ids": self.held_at_fault}
        if self.held_after_promotion:
            yield {"e": "held_after_promotion", "ids": self.held_after_promotion}
        loc = self.located
        streams = {"streams": {k: asdict(s) for k, s in loc.streams.items()}} if loc.streams else {}
        yield {
            "e": "located", "held": loc.held, "dead": loc.dead, "delayed": sorted(loc.delayed),
            "failed": sorted(loc.failed), "succeeded": sorted(loc.succeeded), **streams,
            "consumers": [asdict(c) for c in loc.consumers],
            **({"stopped": sorted(loc.stopped)} if loc.stopped else {}),
        }  # fmt: skip
        for p in self.reading_problems:
            yield {"e": "reading_problem", **asdict(p)}
        st = self.state
        yield {
            "e": "state", "held": st.held, "dead_lettered": sorted(st.dead_lettered), "failed": sorted(st.failed),
            "poisoned": sorted(st.poisoned), "requeued": sorted(st.requeued), "requeue_events": st.requeue_events,
        }  # fmt: skip
        if self.effects is not None:
            yield {"e": "effects", **self.effects}
        yield {
            "e": "end", "faults_end": self.faults_end, "drained_at": self.drained_at, "drained": self.drained,
            "cut_off": self.cut_off, "inspect_s": self.inspect_s, "workdir": self.workdir,
            **({} if self.settled_at is None else {"settled_at": self.settled_at, "backlog_after": self.backlog_after}),
            **({} if self.held_at_drain is None else {"held_at_drain": self.held_at_drain}),
        }  # fmt: skip


def _x_lines(runs: Executions) -> Iterator[str]:
    """Each execution's line, as json.dumps would write it (floats by repr, so they read back exactly),
    formatted directly from the columns: a run's executions are most of its timeline, and the file's
    cost is theirs."""
    contexts = [(_string(w), pid, xid) for w, pid, xid in runs.contexts]
    for row, (ctx, start, end, acked, flags) in enumerate(
        zip(runs.ctx, runs.starts, runs.ends, runs.acks, runs.flags, strict=True)
    ):
        worker, pid, xid = contexts[ctx]
        d = "null" if end != end else repr(end)
        a = "null" if acked != acked else repr(acked)
        yield (
            f'{{"e":"x","j":{_string(runs.job(row))},"w":{worker},"s":{start!r},"d":{d},'
            f'"f":{flags & FAILED},"p":{pid},"x":{xid},"a":{a},"n":{(flags & EMPTY_ACK) >> 1}}}'
        )


def write(timelines: Iterable[Timeline], path: Path) -> Path:
    """Every run's timeline, one after the other, to one gzipped JSON-lines file, in blocks of lines;
    whole or not at all (crashbench.files)."""
    with files.replacing(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
        for tl in timelines:
            block: list[str] = []
            for line in tl.lines():
                if isinstance(line, Executions):
                    for x in _x_lines(line):
                        block.append(x)
                        if len(block) >= 10_000:
                            f.write("\n".join(block) + "\n")
                            block = []
                    continue
                block.append(json.dumps(line, separators=(",", ":")))
            if block:
                f.write("\n".join(block) + "\n")
    return path


class TimelineError(ValueError):
    """A timeline file that cannot be read back."""


def read(path: Path) -> list[Timeline]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return _parse(f)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise TimelineError(f"{path}: not a readable crashbench timeline ({exc})") from None


def _parse(f: IO[str]) -> list[Timeline]:
    out: list[Timeline] = []
    tl: Timeline | None = None
    for n, text in enumerate(f, 1):
        d = json.loads(text)
        e = d.pop("e")
        if e == "run":
            if d.get("schema") != SCHEMA or d.get("schema_version") != SCHEMA_VERSION:
                raise ValueError(f"line {n}: schema {d.get('schema')} {d.get('schema_version')}")
            tl = Timeline(
                index=d["index"], spec=d["spec"], variant=d["variant"], prefix=d["prefix"], repeat=d["repeat"],
                scenario=d["scenario"], design=DesignFlags(**d["design"]), t0=d["t0"], started=d["started"],
                window=d["window"], produced=d["produced"], configuration=d["configuration"], warnings=d["warnings"],
            )  # fmt: skip
            out.append(tl)
            continue
        if tl is None:
            raise ValueError(f"line {n}: {e!r} before any run header")
        _apply(tl, e, d)
    return out


def _apply(tl: Timeline, e: str, d: dict[str, Any]) -> None:
    if e == "x":
        runs = tl.executions
        assert isinstance(runs, Executions)  # a timeline read back holds columns
        row = runs.append(d["j"], runs.context(d["w"], d["p"], d["x"]), d["s"])
        if d["d"] is not None:
            runs.ends[row] = d["d"]
        if d["a"] is not None:
            runs.acks[row] = d["a"]
        runs.flags[row] = (FAILED if d["f"] else 0) | (EMPTY_ACK if d.get("n") else 0)  # "n": since empty acks
    elif e == "enqueue":
        entries = tuple(d["entries"]) if "entries" in d else None
        tl.enqueues.append(Enqueue(d["t"], JobIds.of(d["ids"]), d["ok"], d["lag"], entries))
    elif e == "spawn":
        tl.spawns.append(Spawn(d["t"], d["worker"], d["slot"], d["pid"]))
    elif e == "ready":
        tl.ready[d["worker"]] = d["t"]
    elif e == "planned":
        tl.planned.append(fault_of(d))
    elif e in ("signal", "kill"):  # "kill": its name before issue 27
        tl.signals.append(SignalRecord(**d))
    elif e == "net":
        tl.network.append(
            NetworkFaultRecord(d["index"], d["toxic"], d["slots"], d["at"], d["healed_at"], d.get("target", "workers"))
        )
    elif e == "mark":
        tl.marks.append(Mark(d["t"], d["what"], d["n"]))
    elif e == "broker_fault":
        tl.broker_fault = BrokerFaultRecord(**d)
    elif e == "fault_event":
        tl.fault_events.append(FaultEvent(d["family"], d["what"], d["t"], d.get("data", {})))
    elif e == "depth":
        tl.depth.append(Depth(d["t"], d["p"], d["i"], d["l"], d["d"]))
    elif e == "ledger_problem":
        tl.ledger_problems.append(LedgerProblem(**d))
    elif e == "exit":
        tl.exits.append(WorkerExit(**d))
    elif e == "held_at_fault":
        tl.held_at_fault = d["ids"]
    elif e == "held_after_promotion":
        tl.held_after_promotion = d["ids"]
    elif e == "located":
        streams = {k: StreamEnd(**s) for k, s in d.get("streams", {}).items()}
        tl.located = Located(
            d["held"], d["dead"], set(d["delayed"]), set(d["failed"]), set(d["succeeded"]), streams=streams,
            consumers=[Consumer(**c) for c in d.get("consumers", [])],  # since the consumers were read
            stopped=set(d.get("stopped", [])),  # since Redis is read before the workers are stopped too
        )  # fmt: skip
    elif e == "reading_problem":
        tl.reading_problems.append(Problem(**d))
    elif e == "state":
        tl.state = QueueState(
            d["held"], set(d["dead_lettered"]), set(d["failed"]), set(d["poisoned"]), set(d["requeued"]),
            d["requeue_events"],
        )  # fmt: skip
    elif e == "effects":
        counts = {str(job): int(n) for job, n in d["counts"].items() if not isinstance(n, bool)}
        if len(counts) != len(d["counts"]) or any(n < 0 for n in counts.values()) or int(d["checked"]) < 0:
            raise ValueError("effects: counts must be whole numbers of 0 or more")
        tl.effects = {"check": str(d["check"]), "checked": int(d["checked"]), "counts": counts}
    elif e == "end":
        tl.faults_end, tl.drained_at, tl.drained = d["faults_end"], d["drained_at"], d["drained"]
        tl.cut_off, tl.inspect_s, tl.workdir = d["cut_off"], d["inspect_s"], d["workdir"]
        tl.settled_at, tl.backlog_after = d.get("settled_at"), d.get("backlog_after", -1)  # older ones: no watch
        tl.held_at_drain = d.get("held_at_drain")
    else:
        raise ValueError(f"unknown event {e!r}")
