"""A skewed worker's own reading of its clocks (crashbench.faults.clock), in the worker.

At start the worker appends one line, `<name> <wall> <monotonic>`, to the probe file its environment
names (CLOCK_PROBE_ENV). A worker whose clock the run moves while it runs (a jump, a strobe: libfaketime
reading its offset from a file) also watches its own clock: a daemon thread reads both clocks every
WATCH_EVERY_S and appends a line whenever wall minus monotonic moved by more than WATCH_STEP_S since the
last line, so the file holds each change the process really saw, and when (CLOCK_MONOTONIC is one clock
for the whole machine, and libfaketime leaves it alone). A forked child of the worker (a pool's) has no
such thread: it reads the same offset file, so the parent's reading stands for it.
"""

from __future__ import annotations

import os
import threading
import time

from crashbench.control.interpreter import CLOCK_PROBE_ENV

CLOCK_WATCH_ENV = "CRASHBENCH_CLOCK_WATCH"  # set: the clock moves while the worker runs; watch it
WATCH_EVERY_S = 0.01
WATCH_STEP_S = 0.05


def _append(probe: str, name: str) -> float:
    wall, mono = time.time(), time.monotonic()
    with open(probe, "a") as f:
        f.write(f"{name} {wall!r} {mono!r}\n")
    return wall - mono


def _watch(probe: str, name: str, last: float) -> None:
    while True:
        time.sleep(WATCH_EVERY_S)
        if abs(time.time() - time.monotonic() - last) > WATCH_STEP_S:
            last = _append(probe, name)


def start(name: str) -> None:
    """In the worker, first thing: its reading, and its watch when the run moves its clock."""
    if not (probe := os.environ.get(CLOCK_PROBE_ENV)):
        return
    offset = _append(probe, name)
    if os.environ.get(CLOCK_WATCH_ENV):
        threading.Thread(target=_watch, args=(probe, name, offset), name="clock-watch", daemon=True).start()
