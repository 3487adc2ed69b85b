"""The deploy family: a rolling restart as an orchestrator makes it (Kubernetes' rollout of a
Deployment). Each worker slot in turn gets SIGTERM; if its worker is still alive `grace` seconds later
(terminationGracePeriodSeconds), its whole tree gets SIGKILL. Its replacement starts at the SIGTERM
("at-once", as with maxSurge=1) or once the old worker is gone ("after-exit", as with maxUnavailable=1);
the next slot's turn comes `pause` s after that replacement said READY.

The family assumes nothing about how a worker reacts to SIGTERM (crashbench's own loop finishes its job;
Celery's warm shutdown, RQ's horse, huey's hard stop, ...): it observes whether the worker exited
before the grace ended, and the ledger says which jobs it left unfinished. Its `[[faults]]` entries are
`kind = "deploy"`; its driver is stepped from the run's one loop (never a sleep); its events go into
the timeline's fault events; its checker counts what the deploys did and what they cost."""

from __future__ import annotations

import math
import random
import signal
from dataclasses import dataclass, field
from typing import Any

from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun, Mark, slot_problems
from crashbench.model.faults import DeployFault, Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline, rel

KEYS = ("kind", "at", "grace", "surge", "slots", "target", "pause")
SURGES = ("at-once", "after-exit")
TARGETS = ("parent", "tree")  # a process-tree worker's SIGTERM: the worker alone (a container's PID 1), or all
GRACE = 30.0  # Kubernetes' default terminationGracePeriodSeconds


def plan(entry: Entry, start: int, sc: Scenario, rng: random.Random) -> list[Fault]:
    """One rollout per entry; nothing in it is drawn (the seed's draws for other entries are untouched):
    the slots go in the order given, every slot in order by default."""
    slots = tuple(entry.get("slots", range(sc.workload.workers)))
    return [
        DeployFault(start, float(entry.get("at", 1.0)), slots=slots, grace=float(entry.get("grace", GRACE)),
                    surge=entry.get("surge", "at-once"), target=entry.get("target", "parent"),
                    pause=float(entry.get("pause", 0.0)))
    ]  # fmt: skip


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    where, workers = f"[[faults]] deploy entry {n}", sc.workload.workers
    p = []
    for key in ("at", "grace", "pause"):
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10**9):
            p.append(f"{where}: {key} must be a number of seconds from 0, not {v!r}")
    if entry.get("surge", "at-once") not in SURGES:
        p.append(f"{where}: surge must be at-once or after-exit, not {entry.get('surge')!r}")
    if entry.get("target", "parent") not in TARGETS:
        p.append(f"{where}: target must be parent or tree, not {entry.get('target')!r}")
    if (slots := entry.get("slots")) is not None:
        p += slot_problems(where, slots, workers)
    return p


def deploy_option(text: str) -> dict[str, Any]:
    """`--deploy 30` or `--deploy 2,surge=after-exit,at=1`: a deploy [[faults]] entry from the command
    line, its grace first, then the entry's keys (checked with the rest of the scenario). Raises ValueError."""
    entry: dict[str, Any] = {"kind": "deploy"}
    for n, part in enumerate(p.strip() for p in text.split(",")):
        key, sep, raw = part.partition("=")
        if not sep and n == 0:
            key, raw = "grace", part
        elif not sep or not key.strip() or not raw.strip():
            raise ValueError(f"{part!r} is not KEY=VALUE")
        value: Any = raw.strip()
        if key.strip() == "slots":
            value = [int(s) for s in value.split("+")]
        else:
            for kind in (int, float):
                try:
                    value = kind(value)
                    break
                except ValueError:
                    continue
        entry[key.strip()] = value
    return entry


@dataclass(slots=True)
class Turn:
    """One slot's restart: its old worker, the SIGTERM, its end, its replacement."""

    slot: int
    old: Any = None  # the WorkerProcess stopped (crashbench.control.supervisor)
    new: Any = None  # its replacement
    termed: float = 0.0  # harness clock
    ended: bool = False  # the old worker is gone (exited, or SIGKILLed and dead)
    ready: float | None = None  # the replacement's READY, harness clock


@dataclass(slots=True)
class Rollout:
    fault: DeployFault
    turns: list[Turn] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.turns) == len(self.fault.slots) and all(t.ended and t.ready is not None for t in self.turns)


class Deploys:
    """Every deploy of a run, one rollout after another (a later one starts at its `at`, or once the one
    before it is over), stepped once a tick."""

    fine = False

    def __init__(self, planned: list[Fault], run: Any) -> None:
        self.rollouts = [Rollout(f) for f in planned if isinstance(f, DeployFault)]
        self.sup, self.ledger, self.clock, self.t0 = run.sup, run.ledger, run.clock, run.t0
        self.own_worker = run.design_cls.own_worker
        self.events: list[FaultEvent] = []

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rollouts)

    def _event(self, what: str, t: float, **data: Any) -> None:
        self.events.append(FaultEvent("deploy", what, rel(t, self.t0), data))

    def step(self, now: float) -> None:
        r = next((r for r in self.rollouts if not r.done), None)
        if r is None or now < self.t0 + r.fault.at:
            return
        if not r.turns:
            self._event("rollout", now, index=r.fault.index, grace=r.fault.grace, surge=r.fault.surge)
        for turn in r.turns:
            self._follow(r.fault, turn, now)
        if len(r.turns) < len(r.fault.slots):
            last = r.turns[-1] if r.turns else None
            if last is None or (last.ready is not None and now >= last.ready + r.fault.pause):
                r.turns.append(self._stop(r.fault, r.fault.slots[len(r.turns)], now))

    def _stop(self, f: DeployFault, slot: int, now: float) -> Turn:
        """SIGTERM to the slot's worker (the worker alone, or its tree: `target`); its replacement at once
        with surge at-once."""
        old = self.sup.slots[slot]
        turn = Turn(slot, old, termed=self.clock())
        if old.alive:
            target = f.target if self.own_worker else "worker"
            self.sup.deliver(old, signal.SIGTERM, target, 0, frozen=False)  # marks it signalled: no crash
            self._event("sigterm", turn.termed, index=f.index, slot=slot, worker=old.name, pid=old.pid, target=target)
        else:
            turn.ended = True  # gone already (its slot's respawn is the run's)
        if f.surge == "at-once" or turn.ended:
            self._replace(f, turn)
        return turn

    def _replace(self, f: DeployFault, turn: Turn) -> None:
        turn.new = self.sup.spawn(turn.slot)
        old = turn.old.name if turn.old is not None else None
        self._event("replacement", turn.new.spawned_at, index=f.index, slot=turn.slot, worker=turn.new.name, old=old)

    def _follow(self, f: DeployFault, turn: Turn, now: float) -> None:
        old = turn.old
        if not turn.ended and old.alive and now >= turn.termed + f.grace:
            below = self.sup.below(old)
            self.sup.send(old, signal.SIGKILL)  # the whole tree, as a container's end takes every process in it
            self.sup.wait_dead(old, below)
            turn.ended = True
            self.ledger.poll(old.name)  # final: nothing it started can end any more
            jobs = [ex.job for ex in self.ledger.open_in(old.name)]
            self._event("killed", self.clock(), index=f.index, slot=turn.slot, worker=old.name, jobs=jobs)
        elif not turn.ended and not old.alive:  # reaped by the run's loop
            turn.ended = True
            self.ledger.poll(old.name)
            jobs = [ex.job for ex in self.ledger.open_in(old.name)]
            t = old.exited_at if old.exited_at is not None else now
            self._event("exited", t, index=f.index, slot=turn.slot, worker=old.name, jobs=jobs,
                        status=old.describe_exit(), after_s=round(t - turn.termed, 6))  # fmt: skip
        if turn.ended and turn.new is None:
            self._replace(f, turn)
        if turn.new is not None and turn.ready is None and (ready := self.ledger.ready_at(turn.new.name)) is not None:
            turn.ready = ready
            self._event("ready", ready, index=f.index, slot=turn.slot, worker=turn.new.name)


def driver(run: FaultRun) -> Driver | None:
    if not any(isinstance(f, DeployFault) for f in run.planned):
        return None
    return Deploys(run.planned, run)


def history(d: Driver) -> dict[str, Any]:
    return {"fault_events": d.events}  # type: ignore[attr-defined]


def events(tl: Timeline, what: str) -> list[FaultEvent]:
    return [e for e in tl.fault_events if e.family == "deploy" and e.what == what]


@checker("deploy")
def _deploy(h: History, before: Sections) -> Section:
    """What the deploys did (rollouts, workers stopped, of which exited within the grace or SIGKILLed at
    its end) and cost: the jobs started in a stopped worker that never ended there, by the final ledger,
    and of those the lost ones."""
    tl, runs = h.timeline, h.runs
    stopped = {e.data["worker"] for e in events(tl, "sigterm")}
    interrupted = {runs.job(r) for r, end in enumerate(runs.ends) if math.isnan(end) and runs.worker(r) in stopped}
    lost = interrupted & set(before.fact("outcomes", "classes")["lost"])
    counts = {
        "rollouts": len(events(tl, "rollout")),
        "deploy_stops": len(stopped),
        "deploy_graceful": len(events(tl, "exited")),
        "deploy_killed": len(events(tl, "killed")),
        "deploy_interrupted": len(interrupted),
        "deploy_lost": len(lost),
    }
    return Section("deploy", counts=counts, jobs={"deploy_lost": sorted(lost)[:100]} if lost else {})


def bands(tl: Timeline) -> list[Band]:
    """Each stopped worker's grace on its lane: from the SIGTERM to its exit (or the SIGKILL)."""
    ends = {e.data["worker"]: e for e in tl.fault_events if e.family == "deploy" and e.what in ("exited", "killed")}
    out = []
    for term in events(tl, "sigterm"):
        end = ends.get(term.data["worker"])
        how = "never ended" if end is None else ("SIGKILLed at the grace's end" if end.what == "killed" else "exited")
        until = end.t if end is not None else None
        tip = f"deploy: SIGTERM {term.data['worker']} at {term.t:.3f} s, {how}" + (
            f" at {until:.3f} s" if until is not None else ""
        )
        look = "killed" if end is not None and end.what == "killed" else "graceful"
        out.append(Band(term.t, until, f"deploy {look}", "deploy", tip, (term.data["slot"],)))
    return out


def marks(tl: Timeline) -> list[Mark]:
    """A cross where the grace ended in a SIGKILL, on the lane of the slot it hit."""
    out = []
    for e in events(tl, "killed"):
        jobs = e.data.get("jobs", [])
        tip = f"deploy: SIGKILL {e.data['worker']} at {e.t:.3f} s ({', '.join(jobs) if jobs else 'no job'})"
        out.append(Mark(e.t, e.data["slot"], "deploy-kill", tip, jobs[-1] if jobs else ""))
    return out


CSS = """.band.deploy rect{fill:#fdd0a2;fill-opacity:.4;stroke:#e6550d}.band.deploy.killed rect{fill:#fc9272}
.band-label.deploy{fill:#a63603}.fault.deploy-kill line,.fault.deploy-kill path{stroke:#b00020}"""

ROWS = (
    ("rollouts", "rollouts", False), ("  workers stopped", "deploy_stops", False),
    ("    exited within the grace", "deploy_graceful", False), ("    SIGKILLed at its end", "deploy_killed", False),
    ("  jobs interrupted", "deploy_interrupted", False), ("  lost", "deploy_lost", True),
)  # fmt: skip

FAMILY = FaultFamily(
    name="deploy",
    summary="a rolling restart: SIGTERM each worker in turn, SIGKILL at the grace's end, its replacement started",
    kinds=("deploy",),
    keys=KEYS,
    problems=problems,
    plan=plan,
    driver=driver,
    history=history,
    checkers=(_deploy,),
    marks=marks,
    bands=bands,
    css=CSS,
    rows=ROWS,
)
