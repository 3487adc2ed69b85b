"""The `clock` family: a worker whose wall clock is wrong (issue 31). Several libraries trust their
workers' wall clocks in recovery (RQ's abandoned-job detection, kombu's visibility restore, Dramatiq's
heartbeats, saq's sweep, arq's deferred jobs): a worker ahead can fail or requeue jobs others still
run, one behind can stall the queue.

An entry `kind = "clock"`, `skew = 30.0` (seconds: + ahead, - behind), `slots = [0]` (the worker slots it
skews; the first by default) starts those slots' workers, every time they start, with libfaketime
preloaded (crashbench.faults.clock.preload): exec'd into a fresh interpreter, their wall clock `skew`
off from the start, their monotonic clock left alone. It plans no timed fault: the skew holds the whole
run. A jump later in the run (`at`), a strobe and the server's clock are not made yet.

The history is crashbench's own reading, not the design's: each skewed worker appends its wall and
monotonic clocks at start to a probe file in the run's directory, and the harness turns them into the
skew it really had (a FaultEvent "skewed" per slot: the planned skew and each start's measured one).
The report shades a skewed slot's lane for the whole run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashbench.faults.clock import preload
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun, slot_problems
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline

KEYS = ("kind", "skew", "slots")
MAX_SKEW = 10 * 365 * 86400.0  # ten years either way: a typo's bound, not libfaketime's


def _entries(sc: Scenario) -> list[Entry]:
    return [e for e in sc.faults.schedule if isinstance(e, dict) and e.get("kind") == "clock"]


def slots_of(entry: Entry) -> tuple[int, ...]:
    return tuple(entry.get("slots", (0,)))


def skews(sc: Scenario) -> dict[int, float]:
    """Each skewed slot's planned skew, in seconds."""
    return {s: float(e["skew"]) for e in _entries(sc) for s in slots_of(e)}


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    where, workers, p = f"[[faults]] clock entry {n}", sc.workload.workers, []
    skew = entry.get("skew")
    if isinstance(skew, bool) or not isinstance(skew, int | float) or not 0 < abs(skew) <= MAX_SKEW:
        p.append(f"{where}: skew must be a number of seconds, not 0 (+ ahead, - behind), not {skew!r}")
    return p + slot_problems(where, entry.get("slots", [0]), workers)


def combinations(sc: Scenario) -> list[str]:
    seen: dict[int, int] = {}
    p = []
    for n, e in enumerate(_entries(sc), 1):
        for s in slots_of(e) if isinstance(e.get("slots", [0]), list | tuple) else ():
            if s in seen:
                p.append(f"[[faults]] clock entry {n}: slot {s} is already skewed by clock entry {seen[s]}")
            seen.setdefault(s, n)
    return p


def probe_file(slot: int) -> str:
    return f"{{dir}}/clock-{slot}"  # "{dir}": the harness's work directory (crashbench.run.harness.Workers)


def worker_env(sc: Scenario, slot: int) -> dict[str, str]:
    skew = skews(sc).get(slot)
    return {} if skew is None else preload.env(skew, probe_file(slot))


class Skewed:
    """Nothing to step: the skew holds from each skewed worker's start. Keeps where the probes are."""

    fine = False
    done = True

    def __init__(self, planned: dict[int, float], workdir: Path) -> None:
        self.planned, self.workdir = planned, workdir

    def step(self, now: float) -> None:
        return None


def driver(run: FaultRun) -> Driver | None:
    planned = skews(run.sc)  # type: ignore[attr-defined]
    return Skewed(planned, run.dir) if planned else None  # type: ignore[attr-defined]


def history(d: Driver) -> dict[str, Any]:
    assert isinstance(d, Skewed)
    events = []
    for slot, skew in sorted(d.planned.items()):
        starts = preload.read_probe(Path(probe_file(slot).replace("{dir}", str(d.workdir))))
        data = {"slot": slot, "skew": skew, "measured": [m for _, m in starts], "workers": [w for w, _ in starts]}
        events.append(FaultEvent("clock", "skewed", 0.0, data))
    return {"fault_events": events}


def bands(tl: Timeline) -> list[Band]:
    """A skewed slot's lane, shaded for the whole run."""
    out = []
    for e in (e for e in tl.fault_events if e.family == "clock" and e.what == "skewed"):
        measured = ", ".join(f"{m:+.3f}" for m in e.data["measured"]) or "no start read"
        tip = f"clock: slot {e.data['slot']} {e.data['skew']:+g} s (measured at each start: {measured})"
        out.append(Band(0.0, None, "clock", f"clock {e.data['skew']:+g} s", tip, (e.data["slot"],)))
    return out


FAMILY = FaultFamily(
    "clock",
    "a worker's wall clock skewed ahead or behind (libfaketime preloaded), the skew measured at each start",
    kinds=("clock",),
    keys=KEYS,
    problems=problems,
    combinations=combinations,
    worker_env=worker_env,
    driver=driver,
    history=history,
    bands=bands,
    css=".band.clock rect{fill:#c6dbef;fill-opacity:.35}.band-label.clock{fill:#08519c}",
)
