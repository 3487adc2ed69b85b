"""The server's own faults, two families: `broker` (kill the embedded server and restart it, or fail
over to its replica: crashbench.faults.broker) and `cluster` (the run's shard of crashbench's own Redis
Cluster: kill its primary, CLUSTER FAILOVER, cut it off: crashbench.faults.cluster). A run has at most
one: its scenario section is `[broker]` (fault, fault_at, downtime), which a `[[faults]]` entry of one
of their kinds sets. Their drivers are crashbench.faults.injector.BrokerFaults and
crashbench.faults.cluster.ClusterFaults, with the producer enqueueing meanwhile."""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults.family import Driver, Entry, FaultFamily
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario

KEYS = ("kind", "at", "downtime")
CLUSTER_KINDS = (
    "cluster-kill", "cluster-failover", "cluster-failover-force", "cluster-takeover", "cluster-partition",
)  # fmt: skip
# [[faults]] kind -> [broker] fault (a cluster fault's kind is its own name)
BROKER_KINDS = {"broker-kill": "kill", "failover": "failover", **{k: k for k in CLUSTER_KINDS}}
WITH_DOWNTIME = ("broker-kill", "cluster-kill", "cluster-partition")


def fields(entry: Entry) -> dict[str, Any]:
    """An entry's [broker] section: its fault, and its `at` and `downtime` where it gives them."""
    named = {field: entry[key] for key, field in (("at", "fault_at"), ("downtime", "downtime")) if key in entry}
    return {"fault": BROKER_KINDS[entry["kind"]], **named}


def _section(kinds: tuple[str, ...]) -> Any:
    def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
        b = sc.broker
        kind = {"kill": "broker-kill"}.get(b.fault, b.fault)
        if kind not in kinds:
            return []
        return [Fault(start, b.fault_at, -1, kind, duration=b.downtime if kind in WITH_DOWNTIME else 0.0)]

    return section


def _driver(on_cluster: bool) -> Any:
    """The driver of one server's faults (BrokerFaults) or of a cluster shard's (ClusterFaults), for a run
    that has that server and a producer."""

    def driver(run: Any) -> Driver | None:
        from crashbench.faults.cluster import ClusterBroker, ClusterFaults
        from crashbench.faults.injector import BrokerFaults

        if run.broker is None or run.producer is None or isinstance(run.broker, ClusterBroker) != on_cluster:
            return None
        cls = ClusterFaults if on_cluster else BrokerFaults
        d = cls(
            run.planned, run.broker, run.producer, run.sc.broker.replica_lag, run.sc.broker.persistence, run.locate,
            run.reconnect, run.mark, run.clock,
        )  # fmt: skip
        d.t0 = run.t0
        return d

    return driver


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
    fields=fields,
    on_server=True,
    driver=_driver(on_cluster=False),
    history=history,
)
CLUSTER = FaultFamily(
    name="cluster",
    summary="the run's shard of crashbench's own cluster: kill its primary, fail it over, cut it off",
    kinds=CLUSTER_KINDS,
    keys=KEYS,
    section=_section(CLUSTER_KINDS),
    fields=fields,
    on_server=True,
    driver=_driver(on_cluster=True),
    history=history,
)
