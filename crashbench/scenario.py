"""Scenarios: TOML files describing a workload, a fault schedule and what each design should do.

    name = "lesson"
    description = "..."
    [workload]  jobs, job_ms, workers, job_dist, job_ms_max, poison_rate, transient_rate, transient_failures
    [faults]    kills, interval, signal, kill_when, seed, pause
    [queue]     stale_after, recover_every, max_attempts, retry_base, retry_factor, retry_jitter, heartbeat_every,
                batch_size
    [run]       drain_timeout, designs
    [expect.<design>]  <metric> = <number> | "<op> <value>"   (thresholds: crashbench.thresholds)
    [library.<design>] settings passed to a queue library as its own (Celery conf, RQ worker, ...)

Every field has a default (the lesson's crash test), so a scenario names only what differs.
Validation reports every problem at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crashbench import thresholds
from crashbench.designs import DesignSettings
from crashbench.errors import ScenarioError
from crashbench.thresholds import Threshold
from crashbench.workload import DISTRIBUTIONS, Workload, job_ids

KILL_WHEN = ("mid-job", "any")
# For workers that are process trees (library workers): the whole tree, only the worker process, or
# only the child running the job.
KILL_TARGETS = ("tree", "parent", "child")
# Signals that end a process, that a worker handles as a graceful stop (SIGTERM, SIGINT), or that
# pause it (SIGSTOP, resumed with SIGCONT after faults.pause seconds).
FAULT_SIGNALS = (
    "SIGKILL", "SIGTERM", "SIGINT", "SIGSTOP", "SIGQUIT", "SIGABRT", "SIGHUP", "SIGSEGV", "SIGUSR1", "SIGUSR2",
)  # fmt: skip


SECTIONS: dict[str, tuple[str, ...]] = {
    "workload": ("jobs", "job_ms", "workers", "job_dist", "job_ms_max", "poison_rate", "transient_rate",
                 "transient_failures"),
    "faults": ("kills", "interval", "signal", "kill_when", "seed", "pause", "kill_target"),
    "queue": ("stale_after", "recover_every", "max_attempts", "retry_base", "retry_factor", "retry_jitter",
              "heartbeat_every", "batch_size"),
    "broker": ("fault", "fault_at", "downtime", "persistence", "produce_s", "wait_replicas", "wait_ms", "replica_lag"),
    "run": ("drain_timeout", "designs"),
}  # fmt: skip
BROKER_FAULTS = ("none", "kill", "failover")  # failover: kill the primary, promote its replica
PERSISTENCE = ("none", "rdb", "aof-everysec", "aof-always")

# Settings `crashbench sweep --param NAME=...` can vary: every number a scenario has.
SWEEPABLE = tuple(
    name for section in ("workload", "faults", "queue", "run") for name in SECTIONS[section]
    if name not in ("job_dist", "signal", "kill_when", "designs", "kill_target", "fault", "persistence")
)  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    name: str = "lesson"
    description: str = "The lesson's crash test: 2,000 jobs of 10 ms, 4 workers, a SIGKILL every 0.5 s, 5 kills"
    source: str = "(defaults)"
    # workload
    jobs: int = 2000
    job_ms: float = 10.0
    workers: int = 4
    job_dist: str = "fixed"
    job_ms_max: float = 0.0  # cap of the longtail distribution; 0 means 100 x job_ms
    poison_rate: float = 0.0  # share of jobs whose handler always raises
    transient_rate: float = 0.0  # share of jobs whose handler raises on its first transient_failures attempts
    transient_failures: int = 1
    # faults
    kills: int = 5
    interval: float = 0.5
    signal: str = "SIGKILL"
    kill_when: str = "mid-job"
    seed: int = 1
    pause: float = 1.0  # seconds a SIGSTOPped worker stays paused before SIGCONT
    kill_target: str = "tree"
    # queue
    stale_after: float = 1.0
    recover_every: float = 0.25
    max_attempts: int = 3
    retry_base: float = 0.1
    retry_factor: float = 4.0
    retry_jitter: float = 0.25
    heartbeat_every: float = 0.0  # 0: heartbeats between jobs only
    batch_size: int = 10  # jobs per round trip, for the batching designs
    # broker: faults of the server itself (crashbench.broker); only on a server crashbench started
    fault: str = "none"
    fault_at: float = 1.0  # seconds after the workers start
    downtime: float = 0.5  # seconds the server stays down before it is restarted (kill)
    persistence: str = "none"  # of the embedded server: none, rdb (a snapshot every second), aof-everysec, aof-always
    produce_s: float = 3.0  # with a broker fault the producer enqueues during the run, over this many seconds
    wait_replicas: int = 0  # after each enqueue, WAIT for this many replicas (reliable design; failover)
    wait_ms: int = 100  # ... at most this long; an enqueue not replicated in time is indeterminate
    replica_lag: float = 0.0  # failover: the replica stops following the primary this long before it dies
    # run
    # Observation window after the last fault, seconds; None: the design's own default
    # (Design.observe_window: a library's documented redelivery time, 30 s for the built-in designs).
    drain_timeout: float | None = None
    designs: tuple[str, ...] = ()
    expect: dict[str, tuple[Threshold, ...]] = field(default_factory=dict)  # design -> its thresholds
    library: dict[str, dict[str, Any]] = field(default_factory=dict)  # design -> the library's own settings

    def settings(self, design: str = "") -> DesignSettings:
        return DesignSettings(
            options=self.library.get(design, {}),
            stale_after=self.stale_after,
            recover_every=self.recover_every,
            max_attempts=self.max_attempts,
            retry_base=self.retry_base,
            retry_factor=self.retry_factor,
            retry_jitter=self.retry_jitter,
            heartbeat_every=self.heartbeat_every,
            batch_size=self.batch_size,
            wait_replicas=self.wait_replicas,
            wait_ms=self.wait_ms,
        )

    def workload(self) -> Workload:
        return Workload(
            job_ms=self.job_ms,
            job_dist=self.job_dist,
            job_ms_max=self.job_ms_max,
            poison_rate=self.poison_rate,
            transient_rate=self.transient_rate,
            transient_failures=self.transient_failures,
            seed=self.seed,
        )

    @property
    def longest_job_s(self) -> float:
        if self.job_dist == "longtail":
            return (self.job_ms_max or 100 * self.job_ms) / 1000
        return self.job_ms * 1.5 / 1000

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signal])

    @property
    def ideal_s(self) -> float:
        """Wall time with every worker busy all the time: the sum of all handler durations / workers."""
        if self.job_dist == "fixed":
            return self.jobs * self.job_ms / 1000 / self.workers
        w = self.workload()
        return sum(w.duration_s(j) for j in job_ids(self.jobs)) / self.workers

    def with_overrides(self, **values: Any) -> Scenario:
        """A copy with the given fields replaced (None means: keep the scenario's value); validated."""
        changes = {k: v for k, v in values.items() if v is not None}
        if "signal" in changes:
            changes["signal"] = _signal_name(changes["signal"])
        scenario = dataclasses.replace(self, **changes)
        problems = scenario.problems()
        if problems:
            raise ScenarioError(f"{self.source} with command-line options", problems)
        return scenario

    def problems(self) -> list[str]:
        p: list[str] = []
        _positive_int(p, "workload.jobs", self.jobs)
        _positive_int(p, "workload.workers", self.workers)
        _non_negative(p, "workload.job_ms", self.job_ms)
        if self.job_dist not in DISTRIBUTIONS:
            p.append(f"workload.job_dist must be one of {', '.join(DISTRIBUTIONS)}, not {self.job_dist!r}")
        _non_negative(p, "workload.job_ms_max", self.job_ms_max)
        for name in ("poison_rate", "transient_rate"):
            v = getattr(self, name)
            if not _number(v) or not 0 <= v <= 1:
                p.append(f"workload.{name} is a share of jobs, between 0 and 1, not {v!r}")
        _positive_int(p, "workload.transient_failures", self.transient_failures)
        _positive(p, "faults.pause", self.pause)
        if not isinstance(self.kills, int) or isinstance(self.kills, bool) or self.kills < 0:
            p.append(f"faults.kills must be a whole number >= 0, not {self.kills!r}")
        _positive(p, "faults.interval", self.interval)
        if self.signal not in FAULT_SIGNALS:
            p.append(f"faults.signal {self.signal!r} is not one of {', '.join(FAULT_SIGNALS)}")
        if self.kill_target not in KILL_TARGETS:
            p.append(f"faults.kill_target must be one of {', '.join(KILL_TARGETS)}, not {self.kill_target!r}")
        if self.kill_when not in KILL_WHEN:
            p.append(f"faults.kill_when must be one of {', '.join(KILL_WHEN)}, not {self.kill_when!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            p.append(f"faults.seed must be a whole number, not {self.seed!r}")
        _positive(p, "queue.stale_after", self.stale_after)
        _positive(p, "queue.recover_every", self.recover_every)
        _positive_int(p, "queue.max_attempts", self.max_attempts)
        _non_negative(p, "queue.retry_base", self.retry_base)
        if not _number(self.retry_factor) or self.retry_factor < 1:
            p.append(f"queue.retry_factor must be a number >= 1, not {self.retry_factor!r}")
        _non_negative(p, "queue.retry_jitter", self.retry_jitter)
        _non_negative(p, "queue.heartbeat_every", self.heartbeat_every)
        if self.fault not in BROKER_FAULTS:
            p.append(f"broker.fault must be one of {', '.join(BROKER_FAULTS)}, not {self.fault!r}")
        if self.persistence not in PERSISTENCE:
            p.append(f"broker.persistence must be one of {', '.join(PERSISTENCE)}, not {self.persistence!r}")
        _non_negative(p, "broker.fault_at", self.fault_at)
        _positive(p, "broker.downtime", self.downtime)
        _positive(p, "broker.produce_s", self.produce_s)
        if not isinstance(self.wait_replicas, int) or isinstance(self.wait_replicas, bool) or self.wait_replicas < 0:
            p.append(f"broker.wait_replicas must be a whole number >= 0, not {self.wait_replicas!r}")
        _positive_int(p, "broker.wait_ms", self.wait_ms)
        _non_negative(p, "broker.replica_lag", self.replica_lag)
        if self.replica_lag and self.fault != "failover":
            p.append('broker.replica_lag is for fault = "failover" (a replica that falls behind its primary)')
        if self.replica_lag > self.fault_at:
            p.append(f"broker.replica_lag {self.replica_lag} must not be longer than broker.fault_at {self.fault_at}")
        _positive_int(p, "queue.batch_size", self.batch_size)
        if self.drain_timeout is not None:
            _positive(p, "run.drain_timeout", self.drain_timeout)
        return p

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["designs"] = list(self.designs)
        data["expect"] = {d: [t.rule() for t in ts] for d, ts in self.expect.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        """The scenario a result recorded (`to_dict`), to replay one of its runs."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["designs"] = tuple(values.get("designs", ()))
        values["expect"] = {
            d: tuple(thresholds.parse(rule, design=d, source="scenario") for rule in rules)
            for d, rules in values.get("expect", {}).items()
        }
        return cls(**values)

    def fingerprint(self) -> str:
        """Identifies what was run, so results of the same scenario can be found and compared; the
        name, description, source and seed do not change what is measured, so they are left out."""
        data = self.to_dict()
        for key in ("name", "description", "source", "seed"):
            data.pop(key)
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
        return digest[:12]


def _signal_name(value: str) -> str:
    name = str(value).upper()
    if name.isdigit():
        try:
            return signal.Signals(int(name)).name
        except ValueError:
            return name
    return name if name.startswith("SIG") else f"SIG{name}"


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _positive(p: list[str], name: str, v: Any) -> None:
    if not _number(v) or v <= 0:
        p.append(f"{name} must be a number > 0, not {v!r}")


def _non_negative(p: list[str], name: str, v: Any) -> None:
    if not _number(v) or v < 0:
        p.append(f"{name} must be a number >= 0, not {v!r}")


def _positive_int(p: list[str], name: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        p.append(f"{name} must be a whole number > 0, not {v!r}")


def parse(data: dict[str, Any], source: str) -> Scenario:
    problems: list[str] = []
    values: dict[str, Any] = {"source": source}
    for key, value in data.items():
        if key in ("name", "description"):
            if isinstance(value, str):
                values[key] = value
            else:
                problems.append(f"{key} must be a string")
        elif key in SECTIONS:
            if not isinstance(value, dict):
                problems.append(f"[{key}] must be a table")
                continue
            for sub, v in value.items():
                if sub not in SECTIONS[key]:
                    problems.append(f"unknown key {key}.{sub} (known: {', '.join(SECTIONS[key])})")
                else:
                    values[sub] = v
        elif key == "expect":
            values["expect"] = _parse_expect(value, problems)
        elif key == "library":
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
                values["library"] = value
            else:
                problems.append('[library] must hold one table per design, like [library."celery:acks-late"]')
        else:
            known = f"name, description, {', '.join(SECTIONS)}, expect, library"
            problems.append(f"unknown key or section {key!r} (known: {known})")
    if "signal" in values:
        values["signal"] = _signal_name(values["signal"])
    if "designs" in values:
        d = values["designs"]
        if isinstance(d, list) and all(isinstance(x, str) for x in d):
            values["designs"] = tuple(d)
        else:
            problems.append("run.designs must be a list of design names")
            del values["designs"]
    try:
        scenario = Scenario(**values)
    except TypeError as exc:  # cannot happen with the checks above; kept as a clear message if it does
        raise ScenarioError(source, [*problems, str(exc)]) from None
    problems += scenario.problems()
    if problems:
        raise ScenarioError(source, problems)
    return scenario


def _parse_expect(value: Any, problems: list[str]) -> dict[str, tuple[Threshold, ...]]:
    if not isinstance(value, dict):
        problems.append("[expect] must hold one table per design, like [expect.reliable]")
        return {}
    out: dict[str, tuple[Threshold, ...]] = {}
    for design, table in value.items():
        if not isinstance(table, dict):
            problems.append(f"[expect.{design}] must be a table of metric = threshold")
            continue
        parsed = []
        for metric, v in table.items():
            try:
                parsed.append(thresholds.parse_entry(design, metric, v, source="scenario"))
            except thresholds.ThresholdSyntaxError as exc:
                problems.append(f"[expect.{design}] {exc}")
        out[design] = tuple(parsed)
    return out


def scenario_dirs() -> list[Path]:
    """Where scenario names are looked up: ./scenarios, then the ones shipped beside the package."""
    shipped = Path(__file__).resolve().parent.parent / "scenarios"
    dirs = [Path.cwd() / "scenarios"]
    if shipped not in dirs:
        dirs.append(shipped)
    return dirs


def find(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or "/" in name_or_path:
        if path.is_file():
            return path
        raise ScenarioError(name_or_path, ["no such scenario file"])
    for d in scenario_dirs():
        candidate = d / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted({p.stem for p in available()})) or "none"
    raise ScenarioError(name_or_path, [f"no scenario of that name (known: {known})"])


def available() -> list[Path]:
    seen: dict[str, Path] = {}
    for d in scenario_dirs():
        for p in sorted(d.glob("*.toml")):
            seen.setdefault(p.stem, p)
    return list(seen.values())


def load(name_or_path: str | None) -> Scenario:
    path = find(name_or_path or "default")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(str(path), [f"not valid TOML: {exc}"]) from None
    except OSError as exc:
        raise ScenarioError(str(path), [f"cannot read: {exc.strerror}"]) from None
    return parse(data, str(path))
