"""The worker-signal family: a signal to a worker process (SIGKILL, SIGTERM, SIGSTOP as a pause, ...),
timed by the seed, mid-job or on the clock. Its scenario section is `[faults]` (one periodic group);
its `[[faults]]` entries are `kind = "signal"` (the default kind). The driver is
crashbench.faults.injector.WorkerFaults, which the run builds first: its pauses thaw on every tick and
its faults timed from the drain fire after it."""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults.family import DEFAULT_KIND, Driver, Entry, FaultFamily, FaultRun, Mark
from crashbench.model.faults import Fault, SignalFault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline

KILL_WHEN = ("mid-job", "any")
# For workers that are process trees (library workers): the whole tree, only the worker process, or
# only the child running the job.
KILL_TARGETS = ("tree", "parent", "child")
# Signals that end a process, that a worker handles as a graceful stop (SIGTERM, SIGINT), or that
# pause it (SIGSTOP, resumed with SIGCONT after faults.pause seconds).
FAULT_SIGNALS = (
    "SIGKILL", "SIGTERM", "SIGINT", "SIGSTOP", "SIGQUIT", "SIGABRT", "SIGHUP", "SIGSEGV", "SIGUSR1", "SIGUSR2",
)  # fmt: skip
KEYS = ("kind", "signal", "at", "count", "every", "slot", "kill_when", "target", "pause", "after")
AFTER = ("start", "drained")  # what an entry's `at` counts from


def periodic(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
    """The [faults] group: `kills` signals `interval` apart, each victim's slot drawn from the seed."""
    f = sc.faults
    pause = f.pause if f.signal == "SIGSTOP" else 0.0
    return [
        SignalFault(start + i, round((i + 1) * f.interval, 6), slot=rng.randrange(sc.workload.workers),
                    signal=f.signal, kill_when=f.kill_when, target=f.kill_target, duration=pause)
        for i in range(f.kills)
    ]  # fmt: skip


def plan(entry: Entry, start: int, sc: Scenario, rng: random.Random) -> list[Fault]:
    out = []
    every = float(entry.get("every", 0.5))
    for n in range(int(entry.get("count", 1))):
        slot = entry["slot"] if "slot" in entry else rng.randrange(sc.workload.workers)
        signal = entry.get("signal", "SIGKILL")
        out.append(
            SignalFault(start + n, round(float(entry.get("at", 0.5)) + n * every, 6), slot=slot, signal=signal,
                        kill_when=entry.get("kill_when", "mid-job"), target=entry.get("target", "tree"),
                        duration=float(entry.get("pause", 1.0)) if signal == "SIGSTOP" else 0.0,
                        after=entry.get("after", "start"))
        )  # fmt: skip
    return out


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    where = f"[[faults]] signal entry {n}"
    p = []
    for key, whole, low in (("at", False, 0), ("count", True, 1), ("every", False, 0), ("pause", False, 0)):
        v = entry.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or (whole and not isinstance(v, int)):
            p.append(f"{where}: {key} must be {'a whole number' if whole else 'a number'}, not {v!r}")
        elif not v >= low or v != v or v in (float("inf"), float("-inf")) or v > 10**9:
            p.append(f"{where}: {key} must be at least {low} (and finite), not {v!r}")
    slot, workers = entry.get("slot"), sc.workload.workers
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < workers):
        p.append(f"{where}: slot must be a worker slot, 0 to {workers - 1}, not {slot!r}")
    if entry.get("signal", "SIGKILL") not in FAULT_SIGNALS:
        p.append(f"{where}: signal must be one of {', '.join(FAULT_SIGNALS)}, not {entry.get('signal')!r}")
    if entry.get("kill_when", "mid-job") not in KILL_WHEN:
        p.append(f"{where}: kill_when must be mid-job or any, not {entry.get('kill_when')!r}")
    if entry.get("target", "tree") not in KILL_TARGETS:
        p.append(f"{where}: target must be tree, parent or child, not {entry.get('target')!r}")
    after = entry.get("after", "start")
    if after not in AFTER:
        p.append(f"{where}: after must be start or drained, not {after!r}")
    elif after == "drained" and entry.get("kill_when", "mid-job") != "any":
        p.append(f'{where}: after = "drained" needs kill_when = "any": a drained queue has no job left to be inside')
    return p


def driver(run: FaultRun) -> Driver | None:
    return run.worker_faults  # type: ignore[attr-defined, no-any-return]  # built with the run: see above


def history(d: Driver) -> dict[str, Any]:
    return {"signals": d.records}  # type: ignore[attr-defined]


# A signal's look in the report: SIGKILL a kill, SIGTERM a stop asked for, SIGSTOP a pause (any other: a kill's).
LOOK = {"SIGKILL": "kill", "SIGTERM": "term", "SIGSTOP": "pause"}


def marks(tl: Timeline) -> list[Mark]:
    """Each signal on the lane of the slot it hit; a pause shaded for as long as it lasted (the planned
    fault's own: a [[faults]] entry may set its pause)."""
    lasts = {f.index: f.duration for f in tl.planned}
    out = []
    for k in tl.signals:
        look = LOOK.get(k.signal, "kill")
        hit = ", ".join(k.jobs) if k.jobs else (k.job or "no job")
        tip = f"{k.signal} {k.worker} at {k.at:.3f} s ({'mid-job: ' + hit if k.mid_job else 'between jobs'})"
        span = lasts.get(k.index, 0.0) if look == "pause" else 0.0
        out.append(Mark(k.at, k.slot, look, tip, k.job or "", span))
    return out


CSS = """.fault.kill line,.fault.kill path{stroke:#b00020}.fault.term line,.fault.term path{stroke:#e66100}
.fault.pause line,.fault.pause path{stroke:#6a3d9a}.pause-span{fill:#6a3d9a;fill-opacity:.16}"""

FAMILY = FaultFamily(
    name="signal",
    summary="a signal to a worker process: SIGKILL, SIGTERM, SIGSTOP (a pause), ...; mid-job or on the clock",
    kinds=(DEFAULT_KIND,),
    keys=KEYS,
    problems=problems,
    section=periodic,
    section_first=True,
    plan=plan,
    driver=driver,
    history=history,
    marks=marks,
    css=CSS,
)
