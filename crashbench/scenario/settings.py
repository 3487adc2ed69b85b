"""What a scenario's settings accept: the sections and their keys, the numeric bounds, the choices,
and which settings a sweep may vary. Read by the scenario's validation and by the CLI's options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crashbench.faults.eviction import FILLS, POLICIES
from crashbench.faults.signals import FAULT_SIGNALS as FAULT_SIGNALS  # the worker-signal family's vocabulary
from crashbench.faults.signals import KILL_TARGETS as KILL_TARGETS
from crashbench.faults.signals import KILL_WHEN as KILL_WHEN
from crashbench.model.workload import CRASH_HOW, DISTRIBUTIONS, JOB_WORK

SECTIONS: dict[str, tuple[str, ...]] = {
    "workload": ("jobs", "job_ms", "workers", "job_dist", "job_ms_max", "poison_rate", "transient_rate",
                 "transient_failures", "crash_rate", "crash_how", "job_work", "produce",
                 "delay_s", "delay_share", "payload_bytes"),
    "faults": ("kills", "interval", "signal", "kill_when", "seed", "pause", "kill_target"),
    "queue": ("stale_after", "recover_every", "max_attempts", "retry_base", "retry_factor", "retry_jitter",
              "heartbeat_every", "batch_size", "concurrency", "socket_timeout", "shards", "stream_maxlen",
              "stream_trim"),
    "broker": ("fault", "fault_at", "downtime", "persistence", "produce_s", "wait_replicas", "wait_ms", "replica_lag",
               "failover_address", "topology", "maxmemory", "maxmemory_policy", "fill", "neighbour_ttl", "limit_s",
               "min_replicas_to_write", "min_replicas_max_lag", "minority_workers", "power_cut", "wait_aof",
               "writeback"),
    "run": ("drain_timeout", "designs"),
    "app": ("app", "task", "payloads", "check"),
}  # fmt: skip
# failover: kill the primary, promote its replica; cluster-*: the run's shard of crashbench's own cluster;
# eviction: a memory limit and an eviction policy for a while (crashbench.faults.eviction); sentinel-kill:
# the primary of the run's own Sentinel topology killed, the sentinels fail over (crashbench.faults.sentinel);
# sentinel-quorum: two of its three sentinels killed first, started again after `downtime`; sentinel-partition:
# that primary cut off from the sentinels and most clients, a split brain; power-loss: broker-kill on a lazy
# file system, every file cut back to what was fsynced before the restart (crashbench.faults.power)
BROKER_FAULTS = ("none", "broker-kill", "failover", "cluster-kill", "cluster-failover", "cluster-failover-force",
                 "cluster-takeover", "cluster-partition", "eviction", "sentinel-kill", "sentinel-quorum",
                 "sentinel-partition", "power-loss")  # fmt: skip
PERSISTENCE = ("none", "rdb", "aof-no", "aof-everysec", "aof-always")
POWER_CUT = ("clean", "torn")  # what a power cut leaves of the unsynced bytes (crashbench.model.sections.BrokerSpec)
TOPOLOGY = ("single", "sentinel")  # the servers a run is given (crashbench.model.sections.BrokerSpec.topology)
FAILOVER_ADDRESS = ("new", "kept")  # what a failover tells the clients (crashbench.model.sections.BrokerSpec)
# before: every job is enqueued before the workers start; during: the producer enqueues them over
# broker.produce_s seconds while the workers run (as it does with a broker fault)
PRODUCE = ("before", "during")
# How a stream design's XADD trims at stream_maxlen: MAXLEN N, or MAXLEN ~ N (whole nodes only: cheaper, keeps more)
STREAM_TRIM = ("exact", "approximate")

SECTION_OF = {name: section for section, names in SECTIONS.items() for name in names}
BLOCKING_POP_S = 0.1  # a built-in worker's blocking pop (crashbench.run.worker.WorkerSpec.fetch_timeout)
MAX_INT = 2**63 - 1  # TOML's own integer range, and Redis's


@dataclass(frozen=True, slots=True)
class Bound:
    """What one numeric setting accepts: a finite number (whole or not) above `low`, at most `high`."""

    whole: bool
    low: float | None = None
    low_included: bool = True
    high: float | None = None

    def accepts(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return False
        if self.whole and not isinstance(v, int):
            return False
        # Magnitude before isfinite: a huge int would overflow converting to float. NaN and infinity
        # are refused: they pass every comparison below (nan) or make a run never end (inf).
        if (isinstance(v, int) and abs(v) > MAX_INT) or (isinstance(v, float) and not math.isfinite(v)):
            return False
        if self.low is not None and (v < self.low if self.low_included else v <= self.low):
            return False
        return self.high is None or v <= self.high

    def wanted(self) -> str:
        if self.high is not None:
            return f"a number between {self.low:g} and {self.high:g}"
        kind = "a whole number" if self.whole else "a number"
        return kind if self.low is None else f"{kind} {'>=' if self.low_included else '>'} {self.low:g}"


POSITIVE_INT, COUNT = Bound(True, 0, False), Bound(True, 0)
POSITIVE, NON_NEGATIVE = Bound(False, 0, False), Bound(False, 0)
SHARE = Bound(False, 0, True, 1)
# Every numeric setting; the rest are a choice among names (CHOICES), or name, description, designs.
NUMBERS: dict[str, Bound] = {
    "jobs": POSITIVE_INT, "job_ms": NON_NEGATIVE, "workers": POSITIVE_INT, "job_ms_max": NON_NEGATIVE,
    "poison_rate": SHARE, "transient_rate": SHARE, "transient_failures": POSITIVE_INT,
    "crash_rate": SHARE,
    "delay_s": NON_NEGATIVE, "delay_share": SHARE,
    "kills": COUNT, "interval": POSITIVE, "seed": Bound(True), "pause": POSITIVE,
    "stale_after": POSITIVE, "recover_every": POSITIVE, "max_attempts": POSITIVE_INT, "retry_base": NON_NEGATIVE,
    "retry_factor": Bound(False, 1), "retry_jitter": NON_NEGATIVE, "heartbeat_every": NON_NEGATIVE,
    "batch_size": POSITIVE_INT, "concurrency": COUNT, "shards": COUNT, "stream_maxlen": COUNT,
    "fault_at": NON_NEGATIVE, "downtime": POSITIVE, "produce_s": POSITIVE, "wait_replicas": COUNT,
    "wait_ms": POSITIVE_INT, "replica_lag": NON_NEGATIVE, "socket_timeout": NON_NEGATIVE,
    "payload_bytes": COUNT, "neighbour_ttl": NON_NEGATIVE, "limit_s": POSITIVE,
    "min_replicas_to_write": Bound(True, 0, True, 2), "min_replicas_max_lag": POSITIVE_INT,
    "minority_workers": COUNT, "wait_aof": Bound(True, 0, True, 1), "writeback": NON_NEGATIVE,
    "drain_timeout": POSITIVE,  # or None: the design's own default
}  # fmt: skip
CHOICES: dict[str, tuple[str, ...]] = {
    "job_dist": DISTRIBUTIONS, "crash_how": CRASH_HOW, "job_work": JOB_WORK, "signal": FAULT_SIGNALS,
    "kill_when": KILL_WHEN,
    "kill_target": KILL_TARGETS, "fault": BROKER_FAULTS, "persistence": PERSISTENCE, "produce": PRODUCE,
    "stream_trim": STREAM_TRIM, "maxmemory_policy": POLICIES, "fill": FILLS,
    "failover_address": FAILOVER_ADDRESS, "topology": TOPOLOGY, "power_cut": POWER_CUT,
}  # fmt: skip

# Settings `crashbench sweep --param NAME=...` can vary: every number a scenario has.
SWEEPABLE = tuple(
    name for section in ("workload", "faults", "queue", "run") for name in SECTIONS[section]
    if name not in ("job_dist", "crash_how", "job_work", "signal", "kill_when", "designs", "kill_target", "fault",
                    "persistence", "produce", "stream_trim", "failover_address", "topology", "power_cut")
)  # fmt: skip
