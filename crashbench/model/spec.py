"""The spec: what a run is asked to do, as a scenario file says it (crashbench.scenario parses and
validates the TOML into this record). Its fields keep the file's sections, in the file's order:
workload (what the jobs are), faults (the worker signals), queue (the design's settings), broker (the
server's own fault), run (designs and the observation window), expect (thresholds per design) and
library (a library's own settings per design). Every field has a default (the lesson's crash test).
A result stores it flat (`to_dict`), and `from_dict` reads it back for a replay or a recount; `of`,
`replace` and `value` take the same flat names (`jobs`, as the command line and a sweep name it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
from dataclasses import dataclass, field
from typing import Any

from crashbench.model import thresholds
from crashbench.model.queue import DesignSettings
from crashbench.model.thresholds import Threshold
from crashbench.model.workload import Workload, job_ids


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

    @classmethod
    def of(cls, **values: Any) -> Scenario:
        """The defaults with the given fields, named flat (`jobs=10`, as `to_dict` names them)."""
        return cls().replace(**values)

    def replace(self, **values: Any) -> Scenario:
        """A copy with the given fields replaced, named flat. An unknown name is a TypeError, as
        dataclasses.replace makes it."""
        return dataclasses.replace(self, **values)

    def value(self, name: str) -> Any:
        """A field by its flat name."""
        return getattr(self, name)

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
