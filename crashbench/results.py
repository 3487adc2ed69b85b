"""Typed results, serialized to JSON with a schema version and the environment they were measured in."""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from crashbench import __version__
from crashbench.counts import Counts
from crashbench.server import ServerInfo

SCHEMA = "crashbench.result"
SCHEMA_VERSION = 1


@dataclass(slots=True)
class KillRecord:
    """One fault as executed. Times are seconds since the run's workers were started."""

    index: int
    planned_at: float
    at: float
    slot: int
    worker: str
    pid: int
    signal: str
    target: str  # worker (single-process worker), tree, parent or child: which processes got the signal
    mid_job: bool  # the victim was inside a handler when the signal landed
    job: str | None  # the job whose handler it was inside
    waited_ms: float  # how long the fault waited for the victim to be inside a handler
    replacement: str | None  # None for a pause: the worker keeps its slot
    replacement_ready_ms: float | None = None  # kill -> replacement's READY
    recovered_after_ms: float | None = None  # fault -> the interrupted job's next start (None: never ran again)


@dataclass(slots=True)
class WorkerExit:
    """A worker that ended without being killed by a fault (a bug in a design, usually)."""

    worker: str
    how: str
    log_tail: str


@dataclass(slots=True)
class Timings:
    wall_s: float  # first worker started -> drained
    jobs_per_s: float  # done / wall_s
    ideal_s: float  # the sum of all handler durations / workers
    drained: bool  # False: the drain timeout ran out with jobs still held
    drain_s: float  # last fault -> drained (or gave up)
    window_s: float  # the observation window after the last fault (run.drain_timeout or the design's default)
    startup_ms_median: float  # worker spawn -> READY
    startup_ms_max: float
    restart_ms_median: float | None  # kill -> replacement READY
    recovery_ms_p50: float | None = None  # fault -> next start of the job it interrupted
    recovery_ms_p95: float | None = None
    recovery_ms_max: float | None = None

    @property
    def ratio_to_ideal(self) -> float:
        return self.wall_s / self.ideal_s if self.ideal_s else 0.0


@dataclass(slots=True)
class ExpectationResult:
    expectation: str
    actual: int
    expected: int
    met: bool


@dataclass(slots=True)
class DesignRun:
    design: str
    variant: str  # what a sweep set for this run ("stale_after=0.5"); "" otherwise
    prefix: str
    seed: int
    counts: Counts
    timings: Timings
    kills: list[KillRecord]
    expectations: list[ExpectationResult] = field(default_factory=list)
    worker_exits: list[WorkerExit] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)  # job -> completions, jobs run twice or more (first 100)
    jobs: dict[str, list[str]] = field(default_factory=dict)  # lost / stranded / dead_lettered / failed -> ids (100)
    workdir: str | None = None  # with --keep: the ledgers and worker logs of this run
    count_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(e.met for e in self.expectations) and not self.count_problems


@dataclass(slots=True)
class Environment:
    crashbench: str
    python: str
    redis_py: str
    platform: str
    server_name: str
    server_version: str
    server_binary: str | None
    server_mode: str
    commit: str | None
    dirty: bool | None


@dataclass(slots=True)
class Result:
    kind: str  # "run" | "compare"
    created: str
    scenario: dict[str, Any]
    runs: list[DesignRun]
    environment: Environment
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for run, raw in zip(self.runs, data["runs"], strict=True):
            raw["timings"]["ratio_to_ideal"] = round(run.timings.ratio_to_ideal, 4)
            raw["ok"] = run.ok
        data["ok"] = self.ok
        # schema first: a reader should know what it holds before anything else
        return {"schema": data.pop("schema"), "schema_version": data.pop("schema_version"), **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def write(self, out: Path) -> Path:
        """Write to `out` (a .json file, or a directory to put a timestamped file in)."""
        if out.suffix != ".json":
            names = "-".join(r.design.replace(":", "_").replace(".", "_") for r in self.runs)[:60]
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
            out = out / f"{stamp}-{self.kind}-{self.scenario['name']}-{names}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.to_json() + "\n")
        return out


def _git(*args: str) -> str | None:
    try:
        cp = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cp.stdout.strip() if cp.returncode == 0 else None


def environment(server: ServerInfo) -> Environment:
    """Versions of everything that shaped the figures; the commit is crashbench's own checkout, if any."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return Environment(
        crashbench=__version__,
        python=platform.python_version(),
        redis_py=metadata.version("redis"),
        platform=f"{platform.system()} {platform.release()} {platform.machine()} ({sys.platform})",
        server_name=server.name,
        server_version=server.version,
        server_binary=server.binary,
        server_mode=server.mode,
        commit=commit,
        dirty=bool(status) if status is not None else None,
    )


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime())
