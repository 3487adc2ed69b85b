"""The server's own faults, two families: `broker` (kill the embedded server and restart it, or fail
over to its replica: crashbench.faults.broker) and `cluster` (the run's shard of crashbench's own Redis
Cluster: kill its primary, CLUSTER FAILOVER, cut it off: crashbench.faults.cluster). A run has at most
one: its scenario section is `[broker]` (fault, fault_at, downtime), which a `[[faults]]` entry of one
of their kinds sets. Their drivers are crashbench.faults.injector.BrokerFaults and
crashbench.faults.cluster.ClusterFaults, with the producer enqueueing meanwhile. Both share one checker
(what the fault took: held_at_fault, not_replicated, acked_during_lag), and the report draws the fault
as a band across every lane."""

from __future__ import annotations

import random
from typing import Any

from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band, Driver, Entry, FaultFamily
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline

CLUSTER_KEYS = ("kind", "at", "downtime")
KEYS = (*CLUSTER_KEYS, "address")  # address: a failover's failover_address
CLUSTER_KINDS = (
    "cluster-kill", "cluster-failover", "cluster-failover-force", "cluster-takeover", "cluster-partition",
)  # fmt: skip
WITH_DOWNTIME = ("broker-kill", "cluster-kill", "cluster-partition")


def fields(entry: Entry) -> dict[str, Any]:
    """An entry's [broker] section: its fault, and its `at` and `downtime` where it gives them."""
    names = (("at", "fault_at"), ("downtime", "downtime"), ("address", "failover_address"))
    named = {field: entry[key] for key, field in names if key in entry}
    return {"fault": entry["kind"], **named}  # the [broker] fault is named by its kind


def _section(kinds: tuple[str, ...]) -> Any:
    def section(sc: Scenario, start: int, rng: random.Random) -> list[Fault]:
        b = sc.broker
        kind = b.fault
        if kind not in kinds:
            return []
        return [Fault(start, b.fault_at, kind, duration=b.downtime if kind in WITH_DOWNTIME else 0.0)]

    return section


def _driver(on_cluster: bool, kinds: tuple[str, ...]) -> Any:
    """The driver of one server's faults (BrokerFaults) or of a cluster shard's (ClusterFaults), for a run
    that has that server and a producer."""

    def driver(run: Any) -> Driver | None:
        from crashbench.faults.cluster import ClusterBroker, ClusterFaults
        from crashbench.faults.injector import BrokerFaults

        if run.broker is None or run.producer is None or isinstance(run.broker, ClusterBroker) != on_cluster:
            return None
        if not any(f.kind in kinds for f in run.planned):  # the server's fault is another family's (eviction)
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


@checker("broker")
def _broker(h: History, before: Sections) -> Section:
    """What a broker or cluster fault took: jobs held at the fault, not on the promoted replica,
    acknowledged during the replica's lag; never completed."""
    tl, done = h.timeline, before.fact("outcomes", "classes")["done"]
    counts = {"held_at_fault": sum(1 for j in set(tl.held_at_fault) if j not in done)}
    if tl.broker_fault is not None and tl.broker_fault.promoted_held is not None:
        # Acknowledged ones only: an enqueue WAIT did not confirm is indeterminate, not lost, if it is gone.
        promoted, indeterminate = set(tl.held_after_promotion), tl.indeterminate
        counts["not_replicated"] = sum(
            1 for j in set(tl.held_at_fault) if j not in promoted and j not in done and j not in indeterminate
        )
    if tl.produced:
        counts["acked_during_lag"] = sum(1 for j in tl.acked_during_lag if j not in done)
    return Section("broker", counts=counts)


def outage_bands(kinds: tuple[str, ...]) -> Any:
    """The report's band for these kinds of server fault: from the fault to the server's return."""

    def bands(tl: Timeline) -> list[Band]:
        f = tl.broker_fault
        if f is None or f.kind not in kinds:
            return []
        what = {"broker-kill": "broker killed", "cluster-partition": "primary cut off",
                "sentinel-kill": "primary killed", "sentinel-quorum": "quorum lost, primary killed",
                "power-loss": "power cut"}.get(
                    f.kind, f"broker {f.kind}")  # fmt: skip
        back = f"back at {f.back_at:.3f} s" if f.back_at is not None else "never back"
        return [Band(f.at, f.back_at, f.kind, what, f"{what} at {f.at:.3f} s, {back} (held {f.held_at_fault} jobs)")]

    return bands


CSS = ".band.failover rect{fill:#f6d88a}"

BROKER = FaultFamily(
    name="broker",
    summary="SIGKILL the embedded server and restart it on its data, or fail over to its replica",
    kinds=("broker-kill", "failover"),
    keys=KEYS,
    section=_section(("broker-kill", "failover")),
    checkers=(_broker,),
    bands=outage_bands(("broker-kill", "failover")),
    css=CSS,
    fields=fields,
    on_server=True,
    driver=_driver(on_cluster=False, kinds=("broker-kill", "failover")),
    history=history,
)
CLUSTER = FaultFamily(
    name="cluster",
    summary="the run's shard of crashbench's own cluster: kill its primary, fail it over, cut it off",
    kinds=CLUSTER_KINDS,
    keys=CLUSTER_KEYS,
    section=_section(CLUSTER_KINDS),
    checkers=(_broker,),
    bands=outage_bands(CLUSTER_KINDS),
    fields=fields,
    on_server=True,
    driver=_driver(on_cluster=True, kinds=CLUSTER_KINDS),
    history=history,
)
