"""The migrate family: the guide's Step 6, a live migration from the reliable list queue to a stream, as a
fault of the run ("Migrate by dual-running: producers write to the stream, stream workers start, and list
workers drain the remaining list backlog … After the flag is fully on and LLEN jobs == 0 for a day,
remove list workers.").

Its `[[faults]]` entry (`kind = "migrate"`, design `migrating`: crashbench.designs.migrating) flips the
producer's flag at `at`, and not before the producer has enqueued `after_jobs` jobs (a flip placed by the
jobs, so that the list gets exactly that many whatever the machine's speed): every enqueue from then on goes
to the stream, where the stream workers (odd slots, deployed from the start and idle on an empty stream) take
it, while the list workers (even slots) drain the list. The list workers are then stopped (SIGTERM: each
finishes its job and hands back what it holds): by default once the harness reads the list side empty, the
guide's end condition with no day to wait (`stop_when = "empty"`: the list, the delayed retries and every
processing list, in one MULTI between two SCANs that agree, so that no job can move unseen between two reads);
with `stop_when = "llen"`, once the list alone is (the guide's `LLEN jobs == 0`, which does not see a job in a
dead worker's processing list that the reaper has yet to give back); with `stop_after`, that long after the
flip whatever the list still holds (stopping them too early). A list slot's worker started later (a kill's
replacement) is stopped as well, while the run's fault phase lasts (to its last fault and enqueue); the stop
itself waits for every worker fault planned for a list slot to have fired, so that each finds a list worker to
hit. Worker kills of either kind are `[[faults]]` signal entries beside it.

Where each job went is exact without asking the design: the producer and the flip run in the harness's
one loop, so the jobs enqueued before the flip (the first `to_list` ids, which the flip event records)
went to the list and the rest to the stream. The checker splits lost and duplicated by that, stranded by
where the harness found the job, and gives the list's drain time from the flip."""

from __future__ import annotations

import random
import signal
from typing import Any

from crashbench.designs.migrating import FLAG, LIST, MigratingQueue, on_stream
from crashbench.errors import UsageError
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun, Mark
from crashbench.model.faults import Fault, MigrateFault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline, rel

KEYS = ("kind", "at", "after_jobs", "stop_after", "stop_when")
STOP_WHEN = ("empty", "llen")
DESIGN = "migrating"


def plan(entry: Entry, start: int, sc: Scenario, rng: random.Random) -> list[Fault]:
    """One migration per entry; nothing drawn from the seed."""
    stop_after, stop_when = float(entry.get("stop_after", -1.0)), str(entry.get("stop_when", "empty"))
    return [
        MigrateFault(start, float(entry.get("at", 1.0)), stop_after=stop_after, stop_when=stop_when,
                     after_jobs=int(entry.get("after_jobs", 0)))
    ]  # fmt: skip


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    where, p = f"[[faults]] migrate entry {n}", []
    for key in ("at", "stop_after"):
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10**9):
            p.append(f"{where}: {key} must be a number of seconds from 0, not {v!r}")
    n_jobs, jobs = entry.get("after_jobs", 0), sc.workload.jobs
    bound = jobs if isinstance(jobs, int) and not isinstance(jobs, bool) else 10**9
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or not 0 <= n_jobs <= bound:
        p.append(f"{where}: after_jobs must be a number of jobs from 0 to {bound}, not {n_jobs!r}")
    if entry.get("stop_when", "empty") not in STOP_WHEN:
        p.append(f"{where}: stop_when must be empty or llen, not {entry.get('stop_when')!r}")
    if "stop_when" in entry and "stop_after" in entry:
        p.append(f"{where}: stop_after (a time) and stop_when (a reading) exclude each other")
    return p


def combinations(sc: Scenario) -> list[str]:
    entries = [e for e in sc.faults.schedule if e.get("kind") == "migrate"]
    if not entries:
        return []
    p = []
    if len(entries) > 1:
        p.append("[[faults]] migrate: one migration per run, not " + str(len(entries)))
    designs, workers = sc.run.designs, sc.workload.workers  # their own types are checked elsewhere
    if isinstance(designs, tuple) and designs and set(designs) != {DESIGN}:
        p.append(f"[[faults]] migrate needs the {DESIGN} design alone, not {', '.join(map(str, designs))}")
    if isinstance(workers, int) and workers < 2:
        p.append("[[faults]] migrate needs at least 2 workers: a list worker (even slot) and a stream worker (odd)")
    if any(e.get("after") == "drained" for e in sc.faults.schedule if e.get("kind", "signal") == "signal"):
        p.append("[[faults]] migrate: a signal timed from the drain would find the list workers stopped")
    if sc.workload.produce != "during":
        p.append('[[faults]] migrate needs workload.produce = "during": the flip moves the producer while it runs')
    return p


def list_side_empty(raw: Any, prefix: str) -> bool:
    """The harness's own reading (its connection, not the design's): the list side holds no job. One
    MULTI reads pending, delayed and every processing list a SCAN found; a SCAN after it that finds a
    processing list the first did not (a worker's first move) makes it read again."""
    base = prefix + LIST
    while True:
        before = set(raw.scan_iter(match=base + "processing:*", count=1000))
        pipe = raw.pipeline(transaction=True)
        pipe.llen(base + "pending")
        pipe.zcard(base + "delayed")
        for key in sorted(before):
            pipe.llen(key)
        held = sum(pipe.execute())
        if set(raw.scan_iter(match=base + "processing:*", count=1000)) <= before:
            return held == 0


class Migration:
    """The run's migration, stepped from its loop: the flip, then the watch of the list side, then the stop."""

    fine = False

    def __init__(self, fault: MigrateFault, run: Any) -> None:
        self.fault, self.run = fault, run
        self.sup, self.clock, self.t0 = run.sup, run.clock, run.t0
        self.events: list[FaultEvent] = []
        self.flipped_at: float | None = None
        self.stopped_at: float | None = None
        self.stopped: set[str] = set()

    @property
    def done(self) -> bool:
        return self.stopped_at is not None

    def _event(self, what: str, t: float, **data: Any) -> None:
        self.events.append(FaultEvent("migrate", what, rel(t, self.t0), data))

    def step(self, now: float) -> None:
        design = self.run.design
        if self.flipped_at is None:
            sent = self.run.producer.next if self.run.producer is not None else 0
            if now >= self.t0 + self.fault.at and sent >= self.fault.after_jobs:
                design.flip()
                self.flipped_at = self.clock()
                self._event("flip", self.flipped_at, to_list=sent, flag=design.key(FLAG))
            return
        if self.stopped_at is None:
            early = self.fault.stop_after >= 0
            if early and now < self.flipped_at + self.fault.stop_after:
                return
            if self._list_faults_due():
                return
            llen = self.fault.stop_when == "llen"
            if llen and not early and self.run.raw.llen(self.run.prefix + LIST + "pending"):
                return
            empty = list_side_empty(self.run.raw, self.run.prefix)
            if empty:
                t = self.clock()
                self._event("drained", t, after_ms=round((t - self.flipped_at) * 1000))
            elif not early and not llen:
                return
            self.stopped_at = self.clock()
            self._event("stop", self.stopped_at, early=early, when=self.fault.stop_when, empty=empty)
        self._stop_list_workers()

    def _list_faults_due(self) -> bool:
        """Whether a worker fault aimed at a list slot is yet to fire: the stop waits for it, since a fault
        planned for a list worker needs one there (a stopped slot has none to hit)."""
        pending = getattr(self.run, "worker_faults", None)
        return pending is not None and any(not on_stream(f.slot) for f in pending.queue)

    def _stop_list_workers(self) -> None:
        for slot, w in sorted(self.sup.slots.items()):
            if not on_stream(slot) and w.alive and w.name not in self.stopped and w.signalled is None:
                self.sup.deliver(w, signal.SIGTERM, "worker", 0, frozen=False)  # marks it signalled: no respawn
                self.stopped.add(w.name)
                self._event("sigterm", self.clock(), slot=slot, worker=w.name)


def driver(run: FaultRun) -> Driver | None:
    fault = next((f for f in run.planned if isinstance(f, MigrateFault)), None)
    if fault is None:
        return None
    design = run.design_cls  # type: ignore[attr-defined]
    if not issubclass(design, MigratingQueue):  # a --designs given on the command line, past combinations()
        raise UsageError(f"the migrate fault needs the {DESIGN} design, not {design.name or design.__name__}")
    return Migration(fault, run)


def history(d: Driver) -> dict[str, Any]:
    return {"fault_events": d.events}  # type: ignore[attr-defined]


def events(tl: Timeline, what: str) -> list[FaultEvent]:
    return [e for e in tl.fault_events if e.family == "migrate" and e.what == what]


@checker("migrate")
def _migrate(h: History, before: Sections) -> Section:
    """Per job, across both structures: where it was enqueued (before or after the flip), which of the
    lost and duplicated jobs were the list's and which the stream's, where the stranded ones sit, and how
    long the list side took to empty after the flip."""
    tl = h.timeline
    flips = events(tl, "flip")
    if not flips:
        return Section("migrate")
    flip, ids = flips[0], list(tl.ids)
    to_list = set(ids[: flip.data["to_list"]])
    classes = before.fact("outcomes", "classes")
    completions: dict[str, int] = {}
    for ex in h.runs:
        if ex.completed:
            completions[ex.job] = completions.get(ex.job, 0) + 1
    duplicated = {j for j, n in completions.items() if n > 1}
    stranded = classes["stranded"]
    in_list = {j for j in stranded if any(w.startswith(LIST) for w in tl.located.held.get(j, []))}
    drained = events(tl, "drained")
    counts = {
        "migrations": len(flips),
        "enqueued_list": len(to_list),
        "enqueued_stream": len(ids) - len(to_list),
        "list_drained": int(bool(drained)),
        "list_drain_ms": drained[0].data["after_ms"] if drained else 0,
        "list_workers_stopped": len(events(tl, "sigterm")),
        "lost_list": len(classes["lost"] & to_list),
        "lost_stream": len(classes["lost"] - to_list),
        "stranded_list": len(in_list),
        "stranded_stream": len(stranded - in_list),
        "duplicated_list": len(duplicated & to_list),
        "duplicated_stream": len(duplicated - to_list),
    }
    return Section("migrate", counts=counts)


def bands(tl: Timeline) -> list[Band]:
    """From the flip to the list workers' stop, across every lane: the dual run."""
    flips, stops = events(tl, "flip"), events(tl, "stop")
    if not flips:
        return []
    until = stops[0].t if stops else None
    early = bool(stops and stops[0].data.get("early"))
    tip = f"migrate: producer on the stream from {flips[0].t:.3f} s" + (
        f", list workers stopped at {until:.3f} s" + (" (early)" if early else " (list drained)") if until else ""
    )
    return [Band(flips[0].t, until, "migrate", "dual run", tip)]


def marks(tl: Timeline) -> list[Mark]:
    """A cross on each list worker's lane where the migration stopped it."""
    return [
        Mark(e.t, e.data["slot"], "migrate-stop", f"migrate: SIGTERM {e.data['worker']} at {e.t:.3f} s")
        for e in events(tl, "sigterm")
    ]


CSS = """.band.migrate rect{fill:#c7e9c0;fill-opacity:.4;stroke:#31a354}.band-label.migrate{fill:#006d2c}
.fault.migrate-stop line,.fault.migrate-stop path{stroke:#31a354}"""

ROWS = (
    ("migrations", "migrations", False), ("  enqueued onto the list", "enqueued_list", False),
    ("  enqueued onto the stream", "enqueued_stream", False), ("  list drained", "list_drained", False),
    ("  list drain ms after the flip", "list_drain_ms", False),
    ("  list workers stopped", "list_workers_stopped", False),
    ("  lost (list)", "lost_list", True), ("  lost (stream)", "lost_stream", True),
    ("  stranded (list)", "stranded_list", True), ("  stranded (stream)", "stranded_stream", True),
    ("  duplicated (list)", "duplicated_list", True), ("  duplicated (stream)", "duplicated_stream", True),
)  # fmt: skip

FAMILY = FaultFamily(
    name="migrate",
    summary="a live migration: the producer's flag moves it from the list to the stream, list workers stopped after",
    kinds=("migrate",),
    keys=KEYS,
    problems=problems,
    combinations=combinations,
    plan=plan,
    driver=driver,
    history=history,
    checkers=(_migrate,),
    marks=marks,
    bands=bands,
    css=CSS,
    rows=ROWS,
)
