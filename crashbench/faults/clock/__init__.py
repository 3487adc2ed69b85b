"""The `clock` family: a worker whose wall clock is wrong, or the server's (issue 31). Several libraries
trust their workers' wall clocks in recovery (RQ's abandoned-job detection, kombu's visibility restore,
Dramatiq's heartbeats, saq's sweep, arq's deferred jobs): a worker ahead can fail or requeue jobs others
still run, one behind can stall the queue; the server's clock decides when a TTL'd key expires.

An entry `kind = "clock"`, `skew = 30.0` (seconds: + ahead, - behind), `slots = [0]` (the worker slots it
skews; the first by default) starts those slots' workers, every time they start, with libfaketime
preloaded (crashbench.faults.clock.preload): exec'd into a fresh interpreter, their wall clock `skew`
off from the start, their monotonic clock left alone. It plans no timed fault: the skew holds the whole
run. With `at` (a jump: the clock is right until then), `duration` (it jumps back after that long),
`strobe` (a period: it flips between skewed and right every period for `duration`, Jepsen's strobe) or
`target = "server"` (the embedded server's clock: crashbench.faults.clock.server), the offset is read from
a file the run rewrites at each change (crashbench.faults.clock.timed).

The history is crashbench's own reading, not the design's: each skewed worker appends its wall and
monotonic clocks at start to a probe file in the run's directory, and the harness turns them into the
skew it really had (a FaultEvent "skewed" per slot: the planned skew and each start's measured one); a
moved clock's changes and what the workers (their watch) and the server (TIME) then read, in
"moved" and "readings" events. The report shades a skewed slot's lane (the server's: every lane).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crashbench.faults.clock import preload, timed
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun, slot_problems
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline

KEYS = ("kind", "skew", "slots", "target", "at", "duration", "strobe", "monotonic")
# A monotonic offset (a Linux time namespace: `unshare --time --monotonic N`, as root, works here: a child's
# CLOCK_MONOTONIC measured 30.0 s ahead) is refused: the ledger's times are each worker's CLOCK_MONOTONIC, taken
# as the harness's own (crashbench.model.ledger), so every execution of such a worker would land N s off on the
# timeline and its counts with it; the libraries keep wall clocks in Redis, not monotonic ones; and the
# namespace takes effect for a child of the process that enters it, so the worker would be a grandchild of
# the pid the supervisor signals. docs/findings/clocks.md#monotonic-offsets.
NO_MONOTONIC = (
    "monotonic offsets are not offered: a worker's ledger times are its CLOCK_MONOTONIC, read as the harness's, "
    "so a time namespace's offset would move its every execution on the timeline (docs/findings/clocks.md)"
)
TARGETS = ("workers", "server")
MAX_SKEW = 10 * 365 * 86400.0  # ten years either way: a typo's bound, not libfaketime's
MIN_STROBE = 0.05  # seconds: below the watch's resolution, a flip would go unmeasured


def _entries(sc: Scenario) -> list[Entry]:
    return [e for e in sc.faults.schedule if isinstance(e, dict) and e.get("kind") == "clock"]


def slots_of(entry: Entry) -> tuple[int, ...]:
    return () if entry.get("target") == "server" else tuple(entry.get("slots", (0,)))


def skews(sc: Scenario) -> dict[int, float]:
    """Each slot skewed for the whole run, its planned skew in seconds."""
    return {s: float(e["skew"]) for e in _entries(sc) if not timed.is_timed(e) for s in slots_of(e)}


def moved(sc: Scenario) -> dict[int, Entry]:
    """Each slot whose clock the run moves (a jump, a strobe), and its entry."""
    return {s: e for e in _entries(sc) if timed.is_timed(e) for s in slots_of(e)}


def on_server(sc: Scenario) -> Entry | None:
    """The entry that moves the server's clock, if any (crashbench.faults.clock.server runs the server)."""
    return next((e for e in _entries(sc) if e.get("target") == "server"), None)


def _seconds(v: object, low: float, strict: bool) -> bool:
    ok = not isinstance(v, bool) and isinstance(v, int | float)
    return ok and (v > low if strict else v >= low) and v <= 10**9  # type: ignore[operator]


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    where, workers, p = f"[[faults]] clock entry {n}", sc.workload.workers, []
    skew = entry.get("skew")
    if isinstance(skew, bool) or not isinstance(skew, int | float) or not 0 < abs(skew) <= MAX_SKEW:
        p.append(f"{where}: skew must be a number of seconds, not 0 (+ ahead, - behind), not {skew!r}")
    if "monotonic" in entry:
        p.append(f"{where}: {NO_MONOTONIC}")
    if (target := entry.get("target", "workers")) not in TARGETS:
        p.append(f"{where}: target must be workers or server, not {target!r}")
    for key, low, strict in (("at", 0.0, False), ("duration", 0.0, True)):
        if key in entry and not _seconds(entry[key], low, strict):
            p.append(
                f"{where}: {key} must be a number of seconds{' above 0' if strict else ' from 0'}, not {entry[key]!r}"
            )
    if "strobe" in entry:
        if not _seconds(entry["strobe"], MIN_STROBE, False):
            p.append(f"{where}: strobe must be a period of at least {MIN_STROBE:g} s, not {entry['strobe']!r}")
        elif "duration" not in entry:
            p.append(f"{where}: strobe needs a duration (how long the clock flips, then it is right again)")
    if target == "server" and "slots" in entry:
        p.append(f"{where}: a server clock takes no slots (it moves the server's clock, not a worker's)")
        return p
    return p + slot_problems(where, entry.get("slots", [0]), workers)


def combinations(sc: Scenario) -> list[str]:
    seen: dict[int, int] = {}
    server: int | None = None
    p = []
    for n, e in enumerate(_entries(sc), 1):
        if e.get("target") == "server":
            if server is not None:
                p.append(f"[[faults]] clock entry {n}: the server's clock is already moved by clock entry {server}")
            server = server or n
            continue
        for s in slots_of(e) if isinstance(e.get("slots", [0]), list | tuple) else ():
            if s in seen:
                p.append(f"[[faults]] clock entry {n}: slot {s} is already skewed by clock entry {seen[s]}")
            seen.setdefault(s, n)
    return p


def probe_file(slot: int) -> str:
    return f"{{dir}}/clock-{slot}"  # "{dir}": the harness's work directory (crashbench.run.harness.Workers)


def offset_file(slot: int) -> str:
    return timed.OFFSET_FILE.replace("{slot}", str(slot))


def worker_env(sc: Scenario, slot: int) -> dict[str, str]:
    if slot in moved(sc):
        return preload.timed_env(offset_file(slot), probe_file(slot))
    skew = skews(sc).get(slot)
    return {} if skew is None else preload.env(skew, probe_file(slot))


class Clocks:
    """The run's clocks: the skews held from each start (nothing to step) and the moves (timed.Moves)."""

    fine = False

    def __init__(self, run: Any) -> None:
        sc, self.workdir, self.t0 = run.sc, Path(run.dir), run.t0
        self.planned, self.moved = skews(sc), moved(sc)
        entries = [e for e in _entries(sc) if timed.is_timed(e)]
        files = {id(e): [self._in_dir(offset_file(s)) for s in slots_of(e)] for e in entries}
        if (server := on_server(sc)) is not None:
            files[id(server)] = [Path(run.target.clock_file)]
        self.moves = timed.Moves([(e, files[id(e)]) for e in entries], run.t0, run.clock, run.target.url)

    def _in_dir(self, path: str) -> Path:
        return Path(path.replace("{dir}", str(self.workdir)))

    @property
    def done(self) -> bool:
        return self.moves.done

    def step(self, now: float) -> None:
        self.moves.step(now)


def driver(run: FaultRun) -> Driver | None:
    sc = run.sc  # type: ignore[attr-defined]
    return Clocks(run) if _entries(sc) else None


def history(d: Driver) -> dict[str, Any]:
    assert isinstance(d, Clocks)
    events = []
    for slot, skew in sorted(d.planned.items()):
        starts = preload.read_probe(d._in_dir(probe_file(slot)))
        data = {"slot": slot, "skew": skew, "measured": [m for _, m in starts], "workers": [w for w, _ in starts]}
        events.append(FaultEvent("clock", "skewed", 0.0, data))
    readings = [timed.worker_readings(s, d._in_dir(probe_file(s)), d.t0) for s in sorted(d.moved)]
    for e in d.moves.events:
        if e.data["target"] == "workers":
            rows = [r for ev in readings if ev.data["slot"] in e.data["slots"] for r in ev.data["readings"]]
            e.data["seen"] = timed.seen(e, rows)
    return {"fault_events": [*events, *d.moves.events, *readings]}


def bands(tl: Timeline) -> list[Band]:
    """A skewed slot's lane, shaded for the whole run; a moved clock's lanes (the server's: every lane)
    while it was off."""
    out = []
    for e in (e for e in tl.fault_events if e.family == "clock" and e.what == "skewed"):
        measured = ", ".join(f"{m:+.3f}" for m in e.data["measured"]) or "no start read"
        tip = f"clock: slot {e.data['slot']} {e.data['skew']:+g} s (measured at each start: {measured})"
        out.append(Band(0.0, None, "clock", f"clock {e.data['skew']:+g} s", tip, (e.data["slot"],)))
    moves = [e for e in tl.fault_events if e.family == "clock" and e.what == "moved"]
    for e in moves:
        if not e.data["skew"]:
            continue
        server = e.data["target"] == "server"
        key = (server, tuple(e.data.get("slots", ())))
        end = next(
            (n.t for n in moves if n.t > e.t and (n.data["target"] == "server", tuple(n.data.get("slots", ()))) == key),
            None,
        )
        who = "server" if server else f"slots {e.data['slots']}"
        tip = f"clock: {who} {e.data['skew']:+g} s from {e.t:.3f} s" + (
            f" (TIME {e.data['measured']:+.3f} s)" if server and e.data.get("measured") is not None else ""
        )
        out.append(
            Band(
                e.t,
                end,
                "clock",
                f"{'server ' if server else ''}clock {e.data['skew']:+g} s",
                tip,
                None if server else key[1],
            )
        )
    return out


FAMILY = FaultFamily(
    "clock",
    "a worker's or the embedded server's wall clock skewed, jumped or strobed (libfaketime preloaded), as measured",
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
