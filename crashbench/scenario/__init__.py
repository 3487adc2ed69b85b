"""Scenarios: TOML files describing a workload, a fault schedule and what each design should do.

    name = "lesson"
    description = "..."
    [workload]  jobs, job_ms, workers, job_dist, job_ms_max, poison_rate, transient_rate, transient_failures,
                produce
    [faults]    kills, interval, signal, kill_when, seed, pause   (or [[faults]] entries: crashbench.faults)
    [queue]     stale_after, recover_every, max_attempts, retry_base, retry_factor, retry_jitter, heartbeat_every,
                batch_size, concurrency, shards, stream_maxlen, stream_trim
    [run]       drain_timeout, designs
    [expect.<design>]  <metric> = <number> | "<op> <value>"   (thresholds: crashbench.scenario.thresholds)
    [library.<design>] settings passed to a queue library as its own (Celery conf, RQ worker, ...)

Every field has a default (the lesson's crash test), so a scenario names only what differs.
Validation reports every problem at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from crashbench import faults
from crashbench.errors import ScenarioError
from crashbench.model.queue import DesignSettings
from crashbench.model.workload import Workload, job_ids
from crashbench.scenario import thresholds
from crashbench.scenario.files import available as available
from crashbench.scenario.files import find as find
from crashbench.scenario.files import read_document
from crashbench.scenario.files import scenario_dirs as scenario_dirs
from crashbench.scenario.settings import BLOCKING_POP_S as BLOCKING_POP_S
from crashbench.scenario.settings import BROKER_FAULTS as BROKER_FAULTS
from crashbench.scenario.settings import CHOICES as CHOICES
from crashbench.scenario.settings import COUNT as COUNT
from crashbench.scenario.settings import FAULT_SIGNALS as FAULT_SIGNALS
from crashbench.scenario.settings import KILL_TARGETS as KILL_TARGETS
from crashbench.scenario.settings import KILL_WHEN as KILL_WHEN
from crashbench.scenario.settings import MAX_INT as MAX_INT
from crashbench.scenario.settings import NON_NEGATIVE as NON_NEGATIVE
from crashbench.scenario.settings import NUMBERS as NUMBERS
from crashbench.scenario.settings import PERSISTENCE as PERSISTENCE
from crashbench.scenario.settings import POSITIVE as POSITIVE
from crashbench.scenario.settings import POSITIVE_INT as POSITIVE_INT
from crashbench.scenario.settings import PRODUCE as PRODUCE
from crashbench.scenario.settings import SECTION_OF as SECTION_OF
from crashbench.scenario.settings import SECTIONS as SECTIONS
from crashbench.scenario.settings import SHARE as SHARE
from crashbench.scenario.settings import STREAM_TRIM as STREAM_TRIM
from crashbench.scenario.settings import SWEEPABLE as SWEEPABLE
from crashbench.scenario.settings import Bound as Bound
from crashbench.scenario.thresholds import Threshold

MAX_SCHEDULE_S = 86_400  # no duration of a run's schedule may exceed a day
MAX_JOBS = 100_000_000  # 10,000,000 take about 2 GB at their peak (docs/findings/benchmarks.md: scale)
MAX_NAME, MAX_DESCRIPTION = 1_000, 10_000


def _num(v: object) -> float:
    """A number to compare with a bound; anything else 0 (its own problem is reported elsewhere)."""
    if not isinstance(v, int | float) or isinstance(v, bool) or v != v:
        return 0.0
    try:
        return float(v)
    except OverflowError:  # an integer beyond any float (its own "too large" problem is reported too)
        return math.inf if v > 0 else -math.inf


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
    produce: str = "before"  # or "during": the producer enqueues over produce_s while the workers run
    # faults
    kills: int = 5
    interval: float = 0.5
    signal: str = "SIGKILL"
    kill_when: str = "mid-job"
    seed: int = 1
    pause: float = 1.0  # seconds a SIGSTOPped worker stays paused before SIGCONT
    kill_target: str = "tree"
    schedule: tuple[dict[str, Any], ...] = ()  # [[faults]] signal entries (crashbench.faults), besides the above
    # queue
    stale_after: float = 1.0
    recover_every: float = 0.25
    max_attempts: int = 3
    retry_base: float = 0.1
    retry_factor: float = 4.0
    retry_jitter: float = 0.25
    heartbeat_every: float = 0.0  # 0: heartbeats between jobs only
    batch_size: int = 10  # jobs per round trip, for the batching designs
    shards: int = 0  # queues the sharded design spreads its jobs over; 0 = one per primary (1 on one server)
    concurrency: int = 0  # handlers one library worker runs at once; 0 = the library's shipped default
    stream_maxlen: int = 0  # the stream designs' XADD MAXLEN; 0 = never trim
    stream_trim: str = "exact"  # or "approximate": MAXLEN ~
    socket_timeout: float = 5.0  # crashbench's own workers' socket and connect timeout; 0: none
    # broker: faults of the server itself (crashbench.faults.broker); only on a server crashbench started
    fault: str = "none"
    fault_at: float = 1.0  # seconds after the workers start
    downtime: float = 0.5  # seconds the server stays down before it is restarted (kill)
    persistence: str = "none"  # of the embedded server: none, rdb (a snapshot every second), aof-everysec, aof-always
    produce_s: float = 3.0  # a broker fault, a producer network fault or produce = "during": enqueue over this long
    wait_replicas: int = 0  # after each enqueue, WAIT for this many replicas (reliable design; failover)
    wait_ms: int = 100  # ... at most this long; an enqueue not replicated in time is indeterminate
    replica_lag: float = 0.0  # failover: the replica stops following the primary (at least) this long before it dies
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
            shards=self.shards,
            stream_maxlen=self.stream_maxlen,
            stream_approximate=self.stream_trim == "approximate",
            concurrency=self.concurrency,
            longest_job=self.longest_job_s,
            wait_replicas=self.wait_replicas,
            wait_ms=self.wait_ms,
            socket_timeout=self.socket_timeout,
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
        """The longest a handler of this workload can run: the bound the library timeouts are sized by."""
        if self.job_dist == "longtail":
            return (self.job_ms_max or 100 * self.job_ms) / 1000
        return self.job_ms * (1.5 if self.job_dist == "uniform" else 1.0) / 1000

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
        """Every problem with the settings, one line each. Any value of any type gives a problem, never
        an exception: the values may come straight from a TOML file or the command line."""
        p: list[str] = []
        for name, bound in NUMBERS.items():
            v = getattr(self, name)
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
                p.append(f"{SECTION_OF[name]}.{name} is too large: {_show(v)} (at most {MAX_INT})")
            elif not (v is None and name == "drain_timeout") and not bound.accepts(v):
                p.append(f"{SECTION_OF[name]}.{name} must be {bound.wanted()}, not {_show(v)}")
        for name, allowed in CHOICES.items():
            v = getattr(self, name)
            if not isinstance(v, str) or v not in allowed:
                p.append(f"{SECTION_OF[name]}.{name} must be one of {', '.join(allowed)}, not {_show(v)}")
        for name in ("name", "description"):
            if not isinstance(getattr(self, name), str):
                p.append(f"{name} must be a string, not {_show(getattr(self, name))}")
        if not isinstance(self.designs, tuple) or not all(isinstance(d, str) for d in self.designs):
            p.append(f"run.designs must be a list of design names, not {_show(self.designs)}")
        p += [
            f"[library.{_key(d)}] {problem}"
            for d, table in self.library.items()
            for problem in (*_infinite(table), *_elsewhere(table), *_out_of_range(table))
        ]
        if NUMBERS["workers"].accepts(self.workers):
            p += [q for n, e in enumerate(self.schedule, 1) for q in faults.entry_problems(e, n, self)]
        if NUMBERS["socket_timeout"].accepts(self.socket_timeout) and 0 < self.socket_timeout <= BLOCKING_POP_S:
            p.append(
                f"queue.socket_timeout must be 0 (none) or longer than a worker's blocking pop ({BLOCKING_POP_S} s)"
            )
        p += self._network_combinations()
        p += self._bounds()
        lag, at = self.replica_lag, self.fault_at
        if NUMBERS["replica_lag"].accepts(lag) and NUMBERS["fault_at"].accepts(at):  # else reported above
            if lag and self.fault in ("none", "kill"):
                p.append("broker.replica_lag is for a failover (a replica that falls behind its primary)")
            elif lag and self.fault == "cluster-failover":
                p.append(
                    "broker.replica_lag: a graceful cluster-failover waits for its replica to catch up, which a "
                    "cut-off replica never does; use cluster-failover-force or cluster-takeover"
                )
            if lag > at:
                p.append(f"broker.replica_lag {lag} must not be longer than broker.fault_at {at}")
        return p

    def _bounds(self) -> list[str]:
        """Finite but absurd: a schedule longer than a day never ends in practice (Ctrl-C was the only
        way out), and more jobs than memory holds enqueue until interrupted."""
        p: list[str] = []
        seconds = {
            "faults.interval": self.interval, "faults.pause": self.pause, "broker.fault_at": self.fault_at,
            "broker.downtime": self.downtime, "broker.produce_s": self.produce_s,
            "queue.stale_after": self.stale_after, "queue.recover_every": self.recover_every,
            "run.drain_timeout": self.drain_timeout, "workload.job_ms / 1000": _num(self.job_ms) / 1000,
            "workload.job_ms_max / 1000": _num(self.job_ms_max) / 1000,
        }  # fmt: skip
        if isinstance(self.kills, int) and not isinstance(self.kills, bool):
            seconds["faults.kills x faults.interval"] = _num(self.kills) * _num(self.interval)
        for n, e in enumerate(self.schedule, 1):
            if isinstance(e, dict):
                for k in ("at", "for", "duration", "pause"):
                    if k in e:
                        seconds[f"[[faults]] entry {n}: {k}"] = e[k]
        for what, v in seconds.items():
            if _num(v) > MAX_SCHEDULE_S:
                p.append(f"{what} is {_show(v)} s: a run's schedule is bounded to {MAX_SCHEDULE_S} s (a day)")
        if isinstance(self.jobs, int) and not isinstance(self.jobs, bool) and self.jobs > MAX_JOBS:
            p.append(f"workload.jobs {self.jobs:,} is more than crashbench holds (at most {MAX_JOBS:,})")
        for name, most in (("name", MAX_NAME), ("description", MAX_DESCRIPTION)):
            v = getattr(self, name)
            if isinstance(v, str) and len(v) > most:
                p.append(f"{name} is {len(v):,} characters long (at most {most:,})")
        return p

    def _network_combinations(self) -> list[str]:
        """Network faults the proxy can make in this run: it follows one server, so worker and producer
        targets do not mix with a broker fault (workers re-read the server's address after one and would
        bypass it), and the replica link exists only in a failover run."""
        p = []
        network = [e for e in self.schedule if isinstance(e, dict) and e.get("kind") == "network"]
        if {e.get("toxic") in faults.PARTITION_TOXICS for e in network} == {True, False}:
            p.append(
                "[[faults]]: a run uses the proxy's toxics or network partitions (drop, reject, loss), not both: "
                "a worker in a namespace cannot reach the proxy"
            )
        for n, e in enumerate(self.schedule, 1):
            if not isinstance(e, dict) or e.get("kind") != "network":
                continue
            target = e.get("target", "workers")
            if target == "replica" and self.fault != "failover":
                p.append(f'[[faults]] network entry {n}: target = "replica" needs a failover run (fault = "failover")')
            elif target in ("workers", "producer") and self.fault != "none":
                p.append(
                    f'[[faults]] network entry {n}: target = "{target}" cannot be combined with a broker fault '
                    f'({self.fault}): the proxy follows one server; use target = "replica" in a failover run'
                )
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
        values["schedule"] = tuple(values.get("schedule", ()))
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
        # Settings added later, at their defaults: older results keep their fingerprint.
        for key, default in (("shards", 0), ("stream_maxlen", 0), ("stream_trim", "exact"), ("produce", "before")):
            if data[key] == default:
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


def _show(v: Any) -> str:
    """A value as a problem line quotes it: short, and never an error itself (repr refuses ints of
    over 4300 digits)."""
    try:
        text = repr(v)
    except ValueError:
        return f"an integer of {v.bit_length()} bits" if isinstance(v, int) else type(v).__name__
    return text if len(text) <= 60 else f"{text[:57]}..."


def _key(key: Any) -> str:
    """A TOML key as a problem line names it: bare when TOML allows, else quoted (a quoted key may
    hold a newline, which would break the one line per problem)."""
    text = str(key)
    return text if text and all(c.isascii() and (c.isalnum() or c in "_-") for c in text) else json.dumps(text)


def _infinite(value: Any, where: str = "") -> list[str]:
    """NaN and infinity anywhere in a library's settings: no library setting means either."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where or 'value'} is {value!r}: numbers must be finite"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _infinite(v, f"{where}.{_key(k)}" if where else _key(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _infinite(v, f"{where}[{i}]")]
    return []


# Library settings that would send a library somewhere else than the run's server: crashbench gives
# each library the run's URL itself, and a key like Celery's broker_url would silently override it.
_SERVER_KEY = re.compile(
    r"(^|_)(url|urls|host|hosts|port|unix_socket_path|socket_path|sentinels?|redis_settings|connection|"
    r"connection_pool|broker|backend|result_backend|address|db|database|password|username)$"
)
# Counts that must be at least 1 (a library takes 0 or less for "none" or fails later, obscurely).
_AT_LEAST_ONE = re.compile(r"(concurrency|threads|processes|workers|max_async_tasks|prefetch_multiplier)$")


def _elsewhere(table: Any, where: str = "") -> list[str]:
    """Keys and values of a library's settings that name a server: refused, the run's own is used."""
    out: list[str] = []
    if isinstance(table, dict):
        for k, v in table.items():
            name = f"{where}.{_key(k)}" if where else _key(k)
            if isinstance(k, str) and _SERVER_KEY.search(k):
                out.append(f"{name}: a library is pointed at the run's server by crashbench, never by its settings")
            else:
                out += _elsewhere(v, name)
    elif isinstance(table, list):
        out += [p for i, v in enumerate(table) for p in _elsewhere(v, f"{where}[{i}]")]
    elif isinstance(table, str) and "://" in table:
        out.append(f"{where or 'value'} = {table!r}: a URL in a library's settings would point it elsewhere")
    return out


def _out_of_range(table: Any, where: str = "") -> list[str]:
    """Numbers a library cannot take: a count, timeout or interval below 0, a concurrency below 1."""
    out: list[str] = []
    if isinstance(table, dict):
        for k, v in table.items():
            name = f"{where}.{_key(k)}" if where else _key(k)
            if isinstance(v, bool) or not isinstance(v, int | float):
                out += _out_of_range(v, name)
            elif isinstance(k, str) and _AT_LEAST_ONE.search(k) and v < 1:
                out.append(f"{name} must be at least 1, not {_show(v)}")
            elif v < 0:
                out.append(f"{name} must not be negative, not {_show(v)}")
    elif isinstance(table, list):
        out += [p for i, v in enumerate(table) for p in _out_of_range(v, f"{where}[{i}]")]
    return out


def parse(data: dict[str, Any], source: str) -> Scenario:
    problems: list[str] = []
    values: dict[str, Any] = {"source": source}
    for key, value in data.items():
        if key in ("name", "description"):
            if isinstance(value, str):
                values[key] = value
            else:
                problems.append(f"{key} must be a string")
        elif key == "faults" and isinstance(value, list):
            faults.parse_entries(value, values, problems)
            for entry in values["schedule"]:
                if isinstance(entry.get("signal"), str | int) and not isinstance(entry["signal"], bool):
                    entry["signal"] = _signal_name(entry["signal"])
        elif key in SECTIONS:
            if not isinstance(value, dict):
                problems.append(f"[{key}] must be a table")
                continue
            for sub, v in value.items():
                if sub not in SECTIONS[key]:
                    problems.append(f"unknown key {key}.{_key(sub)} (known: {', '.join(SECTIONS[key])})")
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
    # A signal may be written as a name ("term", "SIGTERM") or a number (15); anything else stays as
    # written, for problems() to report.
    if isinstance(values.get("signal"), str | int) and not isinstance(values["signal"], bool):
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
            problems.append(f"[expect.{_key(design)}] must be a table of metric = threshold")
            continue
        parsed = []
        for metric, v in table.items():
            if metric not in thresholds.METRICS:  # checked here: a quoted key may hold anything, even ": "
                problems.append(
                    f"[expect.{_key(design)}] unknown metric {metric!r} (known: {', '.join(thresholds.METRICS)})"
                )
                continue
            try:
                parsed.append(thresholds.parse_entry(design, metric, v, source="scenario"))
            except thresholds.ThresholdSyntaxError as exc:
                problems.append(f"[expect.{_key(design)}] {exc}")
        out[design] = tuple(parsed)
    return out


def load(name_or_path: str | None) -> Scenario:
    """A scenario by name (./scenarios, then the shipped ones) or path; ScenarioError lists every problem."""
    path = find(name_or_path or "default")
    return parse(read_document(path), str(path))
