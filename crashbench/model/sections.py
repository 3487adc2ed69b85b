"""The scenario's sections, one record each, as a scenario file has them: `[workload]` (what the jobs
are), `[faults]` (the worker signals), `[queue]` (the design's settings), `[broker]` (the server's own
fault), `[run]` (designs and the observation window) and `[app]` (the user's own app and task under a
library adapter, its payloads and its own evidence). Each field is a key of its section, named as
the file names it, with its default (the lesson's crash test). crashbench.model.spec.Scenario holds one
of each; a result stores them flat, one name per key (`FIELD_SECTION` says which section a name is in).
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from typing import Any

from crashbench.model.faults import broker_fault_name


@dataclass(frozen=True)
class WorkloadSpec:
    jobs: int = 2000
    job_ms: float = 10.0
    workers: int = 4
    job_dist: str = "fixed"
    job_ms_max: float = 0.0  # cap of the longtail distribution; 0 means 100 x job_ms
    poison_rate: float = 0.0  # share of jobs whose handler always raises
    transient_rate: float = 0.0  # share of jobs whose handler raises on its first transient_failures attempts
    transient_failures: int = 1
    crash_rate: float = 0.0  # share of jobs whose handler kills its own process on every attempt (a crash loop)
    crash_how: str = "sigkill"  # how: sigkill, exit (os._exit), memory (allocates past the worker's memory limit)
    job_work: str = "sleep"  # how a handler spends its duration: sleep, or gil (one call that holds the GIL throughout)
    produce: str = "before"  # or "during": the producer enqueues over produce_s while the workers run
    delay_s: float = 0.0  # a delayed job is due this many seconds after its enqueue (the library's own delay API)
    delay_share: float = 1.0  # share of jobs delayed when delay_s > 0 (the others are due at once)
    payload_bytes: int = 0  # each job's payload padded to at least this many bytes (an eviction fault's fill)

    @property
    def longest_job_s(self) -> float:
        """The longest a handler of this workload can run: the bound the library timeouts are sized by."""
        if self.job_dist == "longtail":
            return (self.job_ms_max or 100 * self.job_ms) / 1000
        return self.job_ms * (1.5 if self.job_dist == "uniform" else 1.0) / 1000


@dataclass(frozen=True)
class FaultsSpec:
    kills: int = 5
    interval: float = 0.5
    signal: str = "SIGKILL"
    kill_when: str = "mid-job"
    seed: int = 1
    pause: float = 1.0  # seconds a SIGSTOPped worker stays paused before SIGCONT
    kill_target: str = "tree"
    schedule: tuple[dict[str, Any], ...] = ()  # [[faults]] signal entries (crashbench.faults), besides the above

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signal])


@dataclass(frozen=True)
class QueueSpec:
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


@dataclass(frozen=True)
class BrokerSpec:
    """Faults of the server itself (crashbench.faults.broker); only on a server crashbench started."""

    fault: str = "none"
    fault_at: float = 1.0  # seconds after the workers start
    downtime: float = 0.5  # seconds the server stays down before it is restarted (kill)
    persistence: str = "none"  # of the embedded server: none, rdb (a snapshot every second), aof-everysec, aof-always
    produce_s: float = 3.0  # a broker fault, a producer network fault or produce = "during": enqueue over this long
    wait_replicas: int = 0  # after each enqueue, WAIT for this many replicas (reliable design; failover)
    wait_ms: int = 100  # ... at most this long; an enqueue not replicated in time is indeterminate
    replica_lag: float = 0.0  # failover: the replica stops following the primary (at least) this long before it dies
    # failover: "new": clients are told the replica's address (crashbench's own workers re-read it; a library's
    # do not); "kept": the promoted replica takes over the primary's address, as a managed endpoint or a virtual
    # IP does, so every client finds it by reconnecting to the address it had
    failover_address: str = "new"
    # the servers: "single" (one, and a replica for a failover) or "sentinel" (a primary, two replicas and three
    # sentinels: crashbench.control.sentinel; crashbench's own workers are told only the sentinels). A sentinel
    # fault gives its run a private topology of its own whatever this says.
    topology: str = "single"
    # eviction (crashbench.faults.eviction): at fault_at, CONFIG SET maxmemory and maxmemory-policy for limit_s
    maxmemory: int | str = "used+1mb"  # bytes, "64mb", or "used+2mb": the server's used_memory then, plus a margin
    maxmemory_policy: str = "allkeys-lru"  # Redis's maxmemory-policy while the limit holds
    fill: str = "neighbour"  # what fills it: "neighbour" (keys outside the run's namespace) or "payloads" (the jobs')
    neighbour_ttl: float = 0.0  # the neighbour keys' TTL in seconds; 0: none (what volatile-* policies cannot evict)
    limit_s: float = 1.0  # seconds the limit holds before it is lifted (maxmemory 0)
    # sentinel-partition (crashbench.faults.sentinel.partition): Redis's min-replicas-to-write on every server
    # of the topology (0: off), with min-replicas-max-lag (s); the worker slots on the old primary's side
    min_replicas_to_write: int = 0
    min_replicas_max_lag: int = 1
    minority_workers: int = 0
    # power-loss (crashbench.faults.power): "clean" cuts every file back to what was fsynced; "torn" keeps a
    # random prefix of the next page's unsynced bytes too, as a disk that wrote part of a page
    power_cut: str = "clean"
    # power-loss: the kernel's writeback of dirty pages, s (Linux's vm.dirty_expire_centisecs: 30 s): unsynced bytes
    # are durable this long after their write (what aof-no relies on); 0: only an fsync makes bytes durable
    writeback: float = 30.0
    # after each enqueue, WAITAOF for the server's own fsync of it (1; Redis 7.2, valkey), at most wait_ms: an
    # enqueue not fsynced in time is indeterminate (reliable and stream designs)
    wait_aof: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fault", broker_fault_name(self.fault))  # "kill": the old name of broker-kill


@dataclass(frozen=True)
class RunSpec:
    # Observation window after the last fault, seconds; None: the design's own default
    # (Design.observe_window: a library's documented redelivery time, 30 s for the built-in designs).
    drain_timeout: float | None = None
    designs: tuple[str, ...] = ()


@dataclass(frozen=True)
class AppSpec:
    """The user's own app under a library adapter (crashbench.designs.app): empty, crashbench's handler."""

    app: str = ""  # module:attr of the app (Celery app, arq WorkerSettings, taskiq broker, saq settings); RQ: a module
    task: str = ""  # the task to enqueue: its registered name, or a function's dotted path (RQ)
    payloads: str = ""  # a JSONL file (one payload per job) or module:function(n) -> payload; none: the job number
    check: str = ""  # module:function(payload) -> how many times its effect exists: the user's own evidence


# Each section's record, in the file's order (the order a result stores their fields in).
SECTION_RECORDS: dict[str, type] = {
    "workload": WorkloadSpec, "faults": FaultsSpec, "queue": QueueSpec, "broker": BrokerSpec, "run": RunSpec,
    "app": AppSpec,
}  # fmt: skip
# Every section field by its flat name (as a result stores it, and the command line names it), and its section.
FIELDS: dict[str, dataclasses.Field[Any]] = {
    f.name: f for record in SECTION_RECORDS.values() for f in dataclasses.fields(record)
}
FIELD_SECTION: dict[str, str] = {
    f.name: section for section, record in SECTION_RECORDS.items() for f in dataclasses.fields(record)
}


def flat(record: Any) -> dict[str, Any]:
    """A section's fields by name, its values as they are (not copied)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
