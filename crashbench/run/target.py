"""What identifies one crash run (`RunTarget`: its design, server and place in the session) and what the
session watches and steers it with (`RunHooks`), as crashbench.run.runner.CrashRun takes them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from crashbench.control.stopflag import StopFlag
from crashbench.run.progress import Progress

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RunTarget:
    """What identifies one crash run: its design, its server, and its place in the session."""

    design: str  # the design's spec, as load_design takes it
    url: str  # the run's server (a broker fault's own, when the run has one)
    run_id: str  # the session's: the hash tag every key of the session carries
    index: int = 0  # the run's place in the session (its key prefix's too)
    variant: str = ""  # a sweep's value ("stale_after=2"), else ""
    repeat: int = 0
    external: bool = False  # a server crashbench did not start: the run's keys get a lease
    # behind Sentinel, what the workers are told (a redis+sentinel:// URL: they find the primary themselves),
    # while `url` is the primary the harness reads; "": `url`. Secret, as `url` is.
    workers_url: str = field(default="", repr=False)
    # a server clock fault's libfaketime offset file (crashbench.faults.clock.server), which the run rewrites
    clock_file: str = ""


@dataclass(frozen=True, slots=True)
class RunHooks:
    """What the session watches and steers a run with."""

    progress: Callable[[Progress], None] | None = None
    stop: StopFlag | None = None  # raised by SIGINT / SIGTERM; the run's own when None
    warn: Callable[[str], None] | None = None  # told, before the run starts, what in its settings is unsafe
    clock: Clock = time.monotonic
    keep_dir: bool = False  # keep the run's directory (ledgers, worker logs) whatever happens
