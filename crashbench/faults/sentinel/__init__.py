"""The sentinel family: automatic failover as production runs it, Redis Sentinel's (issue 30). One
package: the topology as a run's broker (broker.py), and a module per fault (kill.py, ...).

    sentinel-kill   SIGKILL the primary of the run's own Sentinel topology (crashbench.control.sentinel)
                    at `fault_at`. The sentinels find it down after DOWN_AFTER_MS, agree (a quorum of 2 of
                    3) and promote a replica on their own (+switch-master): nothing of crashbench's promotes
                    anything, and nobody tells the clients where the new primary is (kill.py).
    sentinel-quorum SIGKILL two of the three sentinels, then the primary: no failover while they are down;
                    they start again after `downtime`, and the sentinels fail over (quorum.py).

A run with this fault gets a private topology, as every broker fault gets private servers (refused with
--redis-url and on a cluster). crashbench's own workers connect through the topology's `redis+sentinel://`
URL (crashbench.control.connect), whose client asks the sentinels for the primary again after a
connection error, as an application configured with Sentinel does; the harness reads the primary the
sentinels name. The library adapters' workers connect through their library's own Sentinel configuration
(crashbench.designs.sentinels).

History: the broker fault's record (crashbench.model.faults.BrokerFaultRecord): when the primary was
killed, what the harness read it held just before (its writes paused meanwhile, as for a broker kill),
the enqueues acknowledged by then, and `back_at`, when the sentinels first named another primary (the
promotion time is back_at - at); marks "down" and "promoted". Counts: the broker checker's
(crashbench.faults.servers), the outage drawn as the broker's band; the split brain's own (partition.py);
and the workers around the fault (liveness.py): the handlers running as the primary died and whether
their jobs ran again (mid_job_at_fault, mid_job_ran_again), each worker slot's time to resume after the
promotion (slot_resume_ms) and the slots that never did (stuck_workers).

    sentinel-partition  a split brain (partition.py): the primary cut off from the sentinels, its replicas
                    and the clients that found it through them, while the producer and `[broker]
                    minority_workers` workers go on writing to it; the sentinels promote a replica, and
                    `downtime` s later the partition heals. With `[broker] min_replicas_to_write` (and
                    min_replicas_max_lag) the old primary refuses writes once its replicas fall silent.
                    Its topology has the fault proxy in front of the primary (a partitionable one).
"""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults import servers
from crashbench.faults.family import Band, Driver, Entry, FaultFamily
from crashbench.faults.sentinel import kill, liveness, partition, quorum
from crashbench.faults.sentinel.broker import SentinelBroker, sentinel_broker
from crashbench.faults.sentinel.partition import SplitBrain
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline

__all__ = ["FAMILY", "KINDS", "SentinelBroker", "sentinel_broker", "topology_options"]
KINDS = (kill.KIND, quorum.KIND, partition.KIND)
KEYS = ("kind", "at", "downtime")  # downtime: how long the quorum stays lost; a split brain's, after the promotion
WITH_DOWNTIME = (quorum.KIND, partition.KIND)
DRIVERS = {kill.KIND: kill.SentinelFaults, quorum.KIND: quorum.QuorumFaults, partition.KIND: SplitBrain}


def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
    b = sc.broker
    if b.fault not in KINDS:
        return []
    return [Fault(start, b.fault_at, b.fault, duration=b.downtime if b.fault in WITH_DOWNTIME else 0.0)]


def fields(entry: Entry) -> dict[str, Any]:
    named = {field: entry[key] for key, field in (("at", "fault_at"), ("downtime", "downtime")) if key in entry}
    return {"fault": entry["kind"], **named}


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    if "downtime" in entry and entry["kind"] not in WITH_DOWNTIME:
        return [
            f"[[faults]] sentinel entry {n}: downtime is for {quorum.KIND} (how long the quorum stays lost) and "
            f"{partition.KIND} (how long after the promotion it heals)"
        ]
    return []


def combinations(sc: Scenario) -> list[str]:
    """The split brain's settings: the minority's workers are some of the run's, and only a split brain has them."""
    b, p = sc.broker, []
    minority, workers = b.minority_workers, sc.workload.workers
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (minority, workers, b.min_replicas_to_write)):
        return p  # the bounds' own problems, listed with the others
    if minority and b.fault != partition.KIND:
        p.append(f'[broker] minority_workers is for fault = "{partition.KIND}", not {b.fault!r}')
    elif minority > workers:
        p.append(
            f"[broker] minority_workers ({b.minority_workers}) is more than the run's workers ({sc.workload.workers})"
        )
    if b.min_replicas_to_write and b.fault not in KINDS:
        p.append(
            f"[broker] min_replicas_to_write configures a Sentinel topology's servers: not for fault = {b.fault!r}"
        )
    return p


def topology_options(sc: Scenario) -> dict[str, Any]:
    """How a run's topology is made (crashbench.faults.sentinel.broker.sentinel_broker's keywords)."""
    b = sc.broker
    return {
        "partitionable": b.fault == partition.KIND,
        "min_replicas": (b.min_replicas_to_write, b.min_replicas_max_lag),
        "minority": b.minority_workers if b.fault == partition.KIND else 0,
    }


def driver(run: Any) -> Driver | None:
    fault = next((f for f in run.planned if f.kind in KINDS), None)
    if fault is None or not isinstance(run.broker, SentinelBroker) or run.producer is None:
        return None
    return DRIVERS[fault.kind](fault, run)  # type: ignore[no-any-return]


def history(d: Driver) -> dict[str, Any]:
    return {
        "broker_fault": d.record,  # type: ignore[attr-defined]
        "held_at_fault": sorted(d.held_at_fault),  # type: ignore[attr-defined]
        **(d.history() if isinstance(d, SplitBrain) else {}),
    }


def bands(tl: Timeline) -> list[Band]:
    return servers.outage_bands((kill.KIND,))(tl) + quorum.bands(tl) + partition.bands(tl)


FAMILY = FaultFamily(
    name="sentinel",
    summary="the run's own Sentinel topology: SIGKILL its primary (after two sentinels: the quorum lost until they "
    "return), or cut it off (a split brain); the sentinels promote a replica on their own",
    kinds=KINDS,
    keys=KEYS,
    problems=problems,
    combinations=combinations,
    section=section,
    fields=fields,
    on_server=True,
    driver=driver,
    history=history,
    checkers=(*servers.BROKER.checkers, partition.split_brain, liveness.failover),
    bands=bands,
    css=".band.sentinel-partition rect{fill:#f4a582;fill-opacity:.35}.band.sentinel-quorum.deciding rect{fill:#f6d88a}",
    rows=(
        ("acked on old primary", "acked_on_old_primary", False),
        ("refused on old primary", "refused_on_old_primary", False),
        ("old primary only", "old_primary_only", False),
        ("workers on old primary", "workers_on_old_primary", False),
        ("mid-job at the fault", "mid_job_at_fault", False),
        ("  ran again", "mid_job_ran_again", False),
    ),
)
