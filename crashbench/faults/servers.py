"""The server's own faults, two families: `broker` (kill the embedded server and restart it, or fail
over to its replica: crashbench.faults.broker) and `cluster` (the run's shard of crashbench's own Redis
Cluster: kill its primary, CLUSTER FAILOVER, cut it off: crashbench.faults.cluster). A run has at most
one: its scenario section is `[broker]` (fault, fault_at, downtime), which a `[[faults]]` entry of one
of their kinds sets. Their drivers are crashbench.faults.injector.BrokerFaults and
crashbench.faults.cluster.ClusterFaults, with the producer enqueueing meanwhile."""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults.family import Driver, FaultFamily, FaultRun, Spec
from crashbench.model.faults import Fault

KEYS = ("kind", "at", "downtime")
FIELDS = {"at": "fault_at", "downtime": "downtime"}  # an entry's keys are the [broker] section's
CLUSTER_KINDS = (
    "cluster-kill", "cluster-failover", "cluster-failover-force", "cluster-takeover", "cluster-partition",
)  # fmt: skip
# [[faults]] kind -> [broker] fault (a cluster fault's kind is its own name)
BROKER_KINDS = {"broker-kill": "kill", "failover": "failover", **{k: k for k in CLUSTER_KINDS}}
WITH_DOWNTIME = ("broker-kill", "cluster-kill", "cluster-partition")


def _section(kinds: tuple[str, ...]) -> Any:
    def section(sc: Spec, start: int, rng: random.Random) -> list[Fault]:
        kind = {"kill": "broker-kill"}.get(sc.fault, sc.fault)
        if kind not in kinds:
            return []
        return [Fault(start, sc.fault_at, -1, kind, duration=sc.downtime if kind in WITH_DOWNTIME else 0.0)]

    return section


def _broker_driver(run: FaultRun) -> Driver | None:
    from crashbench.faults.cluster import ClusterBroker
    from crashbench.faults.injector import BrokerFaults

    if run.broker is None or run.producer is None or isinstance(run.broker, ClusterBroker):  # type: ignore[attr-defined]
        return None
    return _started(BrokerFaults, run)


def _cluster_driver(run: FaultRun) -> Driver | None:
    from crashbench.faults.cluster import ClusterBroker, ClusterFaults

    if run.producer is None or not isinstance(run.broker, ClusterBroker):  # type: ignore[attr-defined]
        return None
    return _started(ClusterFaults, run)


def _started(cls: Any, run: Any) -> Driver:
    d = cls(
        run.planned, run.broker, run.producer, run.sc.replica_lag, run.sc.persistence, run.locate,
        run.reconnect, run.mark, run.clock,
    )  # fmt: skip
    d.t0 = run.t0
    return d  # type: ignore[no-any-return]


def history(d: Driver) -> dict[str, Any]:
    return {
        "broker_fault": d.record,  # type: ignore[attr-defined]
        "held_at_fault": sorted(d.held_at_fault),  # type: ignore[attr-defined]
        "held_after_promotion": sorted(d.held_after_promotion),  # type: ignore[attr-defined]
    }


BROKER = FaultFamily(
    name="broker",
    summary="SIGKILL the embedded server and restart it on its data, or fail over to its replica",
    kinds=("broker-kill", "failover"),
    keys=KEYS,
    section=_section(("broker-kill", "failover")),
    fields=FIELDS,
    on_server=True,
    driver=_broker_driver,
    history=history,
)
CLUSTER = FaultFamily(
    name="cluster",
    summary="the run's shard of crashbench's own cluster: kill its primary, fail it over, cut it off",
    kinds=CLUSTER_KINDS,
    keys=KEYS,
    section=_section(CLUSTER_KINDS),
    fields=FIELDS,
    on_server=True,
    driver=_cluster_driver,
    history=history,
)
