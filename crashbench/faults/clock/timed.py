"""A clock the run moves while it runs: a jump, Jepsen's strobe, and the server's clock.

An entry with `at` (the skew starts then: a jump; before it the clock is right), `duration` (it ends
then: the clock jumps back), `strobe` (a period: from `at` to `at + duration` the clock flips between
skewed and right every period, as Jepsen's clock nemesis strobes it) or `target = "server"` gives its
processes libfaketime with the offset read from a file (preload.timed_env), which this driver rewrites
at each change: every process reading it runs at the new offset from its next clock call.

What it did is crashbench's own reading, never the design's: a "moved" FaultEvent per change (the
offset written, when, on the harness clock); for the server, its TIME read right after each write
(measured: server wall clock minus the harness's); for workers, a "readings" event per slot, every
change of wall minus monotonic each worker saw (crashbench.control.clockprobe), on the timeline's clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from crashbench.faults.clock import preload
from crashbench.faults.family import Entry
from crashbench.model.timeline import FaultEvent, rel

OFFSET_FILE = "{dir}/clock-{slot}.faketime"  # a slot's offset file; "{dir}": the run's work directory
SEEN_WITHIN = 0.5  # a worker reading within this of the offset written is the change, seen


def is_timed(entry: Entry) -> bool:
    return any(k in entry for k in ("at", "duration", "strobe")) or entry.get("target") == "server"


def changes(entry: Entry) -> Iterator[tuple[float, float]]:
    """(seconds into the run, the offset from then on) for each change the entry makes, in order: 0.0
    is the real clock. Finite: a strobe has a duration (problems())."""
    skew, start = float(entry["skew"]), float(entry.get("at", 0.0))
    duration = entry.get("duration")
    if (period := entry.get("strobe")) is not None:
        n = 0
        while n * period < duration:
            yield start + n * period, skew if n % 2 == 0 else 0.0
            n += 1
    else:
        yield start, skew
    if duration is not None and (period is None or (n - 1) % 2 == 0):  # a strobe may have ended right already
        yield start + float(duration), 0.0


class Moves:
    """Every timed entry's changes, each written to its offset file at its time (stepped once a tick)."""

    fine = False

    def __init__(self, timed: list[tuple[Entry, list[Path]]], t0: float, clock: Any, server_url: str) -> None:
        self.pending = sorted(
            ((at, n, skew, entry, files) for n, (entry, files) in enumerate(timed) for at, skew in changes(entry)),
            key=lambda c: (c[0], c[1]),
        )
        self.t0, self.clock = t0, clock
        self.server_url = server_url
        self.events: list[FaultEvent] = []
        for _, files in timed:
            for f in files:
                if not f.exists():
                    preload.write_offset(f, 0.0)

    @property
    def done(self) -> bool:
        return not self.pending

    def step(self, now: float) -> None:
        while self.pending and now >= self.t0 + self.pending[0][0]:
            _, _, skew, entry, files = self.pending.pop(0)
            for f in files:
                preload.write_offset(f, skew)
            at = self.clock()
            data: dict[str, Any] = {"skew": skew}
            if entry.get("target") == "server":
                data |= {"target": "server", "measured": server_offset(self.server_url)}
            else:
                data |= {"target": "workers", "slots": list(entry.get("slots", [0]))}
            self.events.append(FaultEvent("clock", "moved", rel(at, self.t0), data))


def server_offset(url: str) -> float | None:
    """The server's TIME minus the harness's wall clock, in seconds (None: it did not answer)."""
    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        before = time.time()
        secs, micros = client.time()
        after = time.time()
        return round(secs + micros / 1e6 - (before + after) / 2, 3)
    except redis.RedisError:
        return None
    finally:
        with contextlib.suppress(redis.RedisError):
            client.close()


def worker_readings(slot: int, probe: Path, t0: float) -> FaultEvent:
    """A slot's workers' readings, each (worker, seconds into the run, skew measured)."""
    rows = [[name, rel(mono, t0), skew] for name, mono, skew in preload.readings(probe)]
    return FaultEvent("clock", "readings", 0.0, {"slot": slot, "readings": rows})


def seen(moved: FaultEvent, readings: list[list[Any]]) -> dict[str, float]:
    """For a change of workers' clocks: each worker's delay until its watch first read the new offset
    (a worker started after the change counts from its start)."""
    out: dict[str, float] = {}
    for name, t, skew in readings:
        if name not in out and t >= moved.t - 0.02 and abs(skew - moved.data["skew"]) <= SEEN_WITHIN:
            out[name] = round(max(0.0, t - moved.t), 3)
    return out
