"""What a run records about its faults and its workers: the schedule the seed gave, each fault as
executed, the broker fault, workers that ended on their own. Plain data, below everything that
produces (crashbench.run.runner), stores (crashbench.model.timeline, crashbench.model.results) or reads them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# The broker's own kill has one name, its [[faults]] kind. Until issue 27 its [broker] fault and its
# record said "kill": read from an old scenario file, command line or saved result, that is this name.
BROKER_KILL = "broker-kill"
OLD_NAMES = {"kill": BROKER_KILL}


def broker_fault_name(kind: object) -> object:
    """A broker fault's one name (anything else, an unknown name or not a name, as it is)."""
    return OLD_NAMES.get(kind, kind) if isinstance(kind, str) else kind


def broker_fault_text(kind: str) -> str:
    """A broker fault as a line of text names it: "broker-kill", "broker failover", "broker cluster-kill"."""
    name = str(broker_fault_name(kind))
    return name if name.startswith(("broker-", "sentinel-")) else f"broker {name}"


JOB_SAMPLE = 100  # ids listed per outcome class (or held at a fault) in a result; the counts are always complete


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: its place in the schedule, its kind, its start and, where it has one, its
    length. The fault specs are one union (FaultSpec): a fault of the server (a broker or cluster
    fault; a new family's, which may subclass this) is a Fault; a worker signal a SignalFault; a
    network fault a NetworkFault. Every kind goes through one scheduler (crashbench.faults.injector),
    so faults of different kinds may overlap."""

    index: int
    at: float  # its start, seconds after the workers start
    # "broker-kill" (the server, restarted), "failover", a cluster fault ("cluster-kill", "cluster-failover",
    # "cluster-failover-force", "cluster-takeover", "cluster-partition"), or a subclass's own
    kind: str = "broker-kill"
    duration: float = 0.0  # a pause's (SIGSTOP), a broker or cluster kill's downtime, a network fault's; 0: no end
    # "drained": `at` counts from the queue's drain (its restarts then meet an idle machine at any job count)
    after: str = "start"

    @property
    def end(self) -> float | None:
        return round(self.at + self.duration, 6) if self.duration else None

    @property
    def on_worker(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalFault(Fault):
    """A signal to the worker in one slot (crashbench.faults.signals)."""

    kind: str = "signal"
    slot: int  # the worker slot it hits
    signal: str = "SIGKILL"
    kill_when: str = "mid-job"  # it waits (a while) for its victim to be inside a handler
    target: str = "tree"  # a process-tree worker's: tree, parent, child

    @property
    def on_worker(self) -> bool:
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkFault(Fault):
    """A toxic or a partition on connections (crashbench.faults.network)."""

    kind: str = "network"
    target: str = "workers"  # workers (those in `slots`), producer, replica (the replica link)
    slots: tuple[int, ...] = ()  # the worker slots it cuts (target workers; crashbench.control.proxy)
    toxic: dict[str, Any] = field(default_factory=dict)  # name, direction, attributes


@dataclass(frozen=True, slots=True, kw_only=True)
class DeployFault(Fault):
    """A rolling restart of the workers in `slots`, in turn (crashbench.faults.deploy): SIGTERM to each,
    SIGKILL to its tree if it is still alive `grace` s later; its replacement started at the SIGTERM
    ("at-once") or once it exited ("after-exit"); the next one's turn `pause` s after that replacement's READY."""

    kind: str = "deploy"
    slots: tuple[int, ...] = ()
    grace: float = 30.0
    surge: str = "at-once"
    target: str = "parent"  # a process-tree worker's SIGTERM: the worker alone (a container's PID 1), or the tree
    pause: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrateFault(Fault):
    """A migration from the list queue to the stream (crashbench.faults.migrate): the producer's flag flipped
    at `at`, once the producer has enqueued `after_jobs` jobs; the list workers stopped `stop_after` s later, or
    (-1) once the harness reads the list side empty (`stop_when` "empty": the list, its delayed retries and every
    processing list; "llen": the list alone)."""

    kind: str = "migrate"
    stop_after: float = -1.0
    stop_when: str = "empty"
    after_jobs: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFault(Fault):
    """A fault of one host, a network and PID namespace with its worker slots (crashbench.faults.hosts):
    host-crash (its init SIGKILLed, every worker on it with it; rebooted `duration` s later), host-pause
    (every process on it SIGSTOPped for `duration` s), host-partition (cut off from the server, or from the
    hosts `apart`, for `duration` s)."""

    kind: str = "host-crash"
    host: int = 0  # its index in the run's hosts ([[faults]] kind = "hosts")
    apart: tuple[int, ...] = ()  # a host-partition's: the other hosts it is cut off from; (): from the server


HOST_KINDS = ("host-crash", "host-pause", "host-partition")
# a planned fault, of whichever family
FaultSpec = Fault | SignalFault | NetworkFault | DeployFault | MigrateFault | HostFault

# How a planned fault was written before the union (every kind's fields, in this order): results and
# timelines keep this shape, so files written before and after read alike, and stay comparable.
_LEGACY = {"slot": -1, "signal": "SIGKILL", "kill_when": "mid-job", "target": "tree", "slots": (), "toxic": {}}
_ORDER = ("index", "at", "slot", "kind", "signal", "kill_when", "target", "duration", "slots", "toxic", "after")


def fault_dict(f: Fault) -> dict[str, Any]:
    """A planned fault as results and timelines store it: every key of every kind, the inapplicable at
    their defaults."""
    own = {name: getattr(f, name) for name in _ORDER if hasattr(f, name)}
    # A kind's keys beyond these (a deploy's grace, surge, pause) follow them, for that kind alone.
    extra = {x.name: getattr(f, x.name) for x in fields(f) if x.name not in _ORDER}
    return {**{name: own.get(name, _LEGACY.get(name)) for name in _ORDER}, **extra}


def fault_class(kind: str) -> type[Fault]:
    """The record a planned fault of this kind is."""
    if kind in HOST_KINDS:
        return HostFault
    return {"signal": SignalFault, "network": NetworkFault, "deploy": DeployFault, "migrate": MigrateFault}.get(
        kind, Fault
    )


def fault_of(data: dict[str, Any]) -> Fault:
    """A planned fault from its stored form (fault_dict), as the record of its kind; keys of other
    kinds are left out. Raises TypeError or KeyError on a shape that is no fault's."""
    kind = str(broker_fault_name(data.get("kind", "signal")))
    cls = fault_class(kind)
    names = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in names}
    for key in ("slots", "apart"):
        if key in values:
            values[key] = tuple(values[key])
    return cls(**{**values, "kind": kind})


@dataclass(slots=True)
class SignalRecord:
    """One worker signal as executed (a kill, a graceful stop, a pause). Times are seconds since the
    run's workers were started."""

    index: int
    planned_at: float
    at: float
    slot: int
    worker: str
    pid: int
    signal: str
    target: str  # worker (single-process worker), tree, parent or child: which processes got the signal
    # As recorded, the injector's look at the victim's ledger once it was frozen; in a result, settled
    # from the final ledger and the handlers' own times (crashbench.evidence.signaled).
    mid_job: bool  # the victim was inside a handler when the signal landed
    job: str | None  # the job whose handler it was inside
    waited_ms: float  # how long the fault waited for the victim to be inside a handler
    replacement: str | None  # None for a pause: the worker keeps its slot
    replacement_ready_ms: float | None = None  # kill -> replacement's READY
    recovered_after_ms: float | None = None  # fault -> the interrupted job's next start (None: never ran again)
    # Every job whose handler the fault interrupted (a worker running several at once: threads, a pool);
    # `job` is the most recently started of them.
    jobs: list[str] = field(default_factory=list)
    child: int = 0  # a child-only kill's process (the worker lives on); 0: the worker's own


@dataclass(slots=True)
class BrokerFaultRecord:
    """The broker fault as executed (crashbench.faults.broker). Times are seconds since the workers started."""

    kind: str  # "broker-kill" | "failover" | a cluster fault's kind (crashbench.faults.servers.CLUSTER_KINDS)
    persistence: str
    at: float
    held_at_fault: int  # jobs the queue held (its state()) just before the fault
    held_ids: list[str]  # ... their ids (the first 100)
    acknowledged_before: int  # enqueues acknowledged before the fault
    back_at: float | None = None  # the restarted server (or the promoted replica) answered
    # A cluster fault (crashbench.faults.cluster): the replication offsets of the primary as it was
    # struck (writes paused) and the one the replica took over at; how many jobs the promoted replica
    # held (the harness's reading as it was promoted; None: not read, a graceful failover); when the
    # old primary followed the promoted one.
    primary_offset: int | None = None
    promoted_offset: int | None = None
    promoted_held: int | None = None
    rejoined_at: float | None = None
    # A sentinel fault (crashbench.faults.sentinel): when the sentinels that had been killed came back (quorum
    # loss); and after the promotion (back_at), each worker slot's first handler start, in ms (None: never),
    # and the slots that never started one although jobs waited.
    quorum_back_at: float | None = None
    slot_resume_ms: list[float | None] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    # A power cut (crashbench.faults.power.cut): ms from the AOF's last fsync to the cut (None: never fsynced,
    # or no AOF), and ms from the sending of the oldest acknowledged enqueue the cut took to the cut (None: none)
    unsynced_ms: float | None = None
    lost_window_ms: float | None = None

    def __post_init__(self) -> None:
        self.kind = str(broker_fault_name(self.kind))  # "kill" in a result saved before the one name


@dataclass(slots=True)
class WorkerExit:
    """A worker that ended without being killed by a fault (a bug in a design, usually)."""

    worker: str
    how: str
    log_tail: str


@dataclass(slots=True)
class NetworkFaultRecord:
    """A network fault as executed, and what the queue did after it healed. Times are seconds since
    the run's workers were started."""

    index: int
    toxic: str
    slots: list[int]
    at: float  # the proxy was told
    healed_at: float | None  # the proxy was told to heal (None: the run ended first)
    target: str = "workers"  # the workers in `slots`, the producer, or the replica link (crashbench.faults)
    # What the queue did (crashbench.evidence.tally, from the ledgers and the harness's readings):
    resume_ms: float | None = None  # healed -> the first handler start in one of its slots (None: never)
    # healed -> each slot's own first handler start, in the order of `slots` (None: that slot never did)
    slot_resume_ms: list[float | None] = field(default_factory=list)
    # The headline: healed -> the moment the last of its slots had started one (None: one never did);
    # for the producer, its first acknowledged enqueue (resume_ms).
    slowest_resume_ms: float | None = None
    progress_ms: float | None = None  # healed -> the first completion anywhere (None: none after it)
    drained_ms: float | None = None  # healed -> the drain's end, when the run drained
    stuck: list[int] = field(default_factory=list)  # its slots that never started a handler again while jobs waited
    per_s: list[float] = field(default_factory=list)  # completions per second before, during, after it
