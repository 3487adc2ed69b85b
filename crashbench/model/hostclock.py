"""The harness clock as a worker reads it: time.monotonic(), shared by every process on one machine, less
the offset of its host's clock when the worker runs on another host (crashbench.run.remote measures it
with its stub, crashbench.control.sshworker, and sets OFFSET_ENV before anything imports this module). So
a worker over SSH writes its ledger, and hands its design the times it stores (heartbeats, leases), on
the harness's clock, as a local worker does; a library's processes inherit the variable.

`now` is time.monotonic itself where there is no offset: the hot path pays nothing for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

OFFSET_ENV = "CRASHBENCH_CLOCK_OFFSET"


def _clock(offset: float) -> Callable[[], float]:
    if not offset:
        return time.monotonic
    mono = time.monotonic

    def shifted() -> float:
        return mono() - offset

    return shifted


try:
    OFFSET = float(os.environ.get(OFFSET_ENV) or 0.0)
except ValueError:
    OFFSET = 0.0
now = _clock(OFFSET)
