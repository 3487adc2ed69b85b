"""The network family: a toxic on the workers' (or the producer's, or a failover run's replica's)
connections through crashbench's proxy (crashbench.control.proxy: latency, bandwidth, slicer,
limit_data, timeout, reset_peer, down), or the kernel's own faults in a network namespace per worker
slot (crashbench.faults.netns: drop, reject, loss; root only). `[[faults]]` entries of kind =
"network"; the driver is crashbench.faults.injector.NetworkFaults, on the run's network
(crashbench.run.network), which the run starts before its workers when it plans any of these."""

from __future__ import annotations

import random
from typing import Any

from crashbench.faults.family import Driver, Entry, FaultFamily, FaultRun
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario

TOXIC_ATTRIBUTES = (
    "latency", "jitter", "rate", "average_size", "size_variation", "delay", "bytes", "timeout", "probability",
)  # fmt: skip
# The kernel's faults, in network namespaces with iptables (crashbench.faults.netns): root only.
PARTITION_TOXICS = ("drop", "reject", "loss")
KEYS = ("kind", "toxic", "direction", "at", "duration", "slot", "workers", "target", *TOXIC_ATTRIBUTES)
TARGETS = ("workers", "producer", "replica")


def plan(entry: Entry, index: int, sc: Scenario, rng: random.Random) -> list[Fault]:
    workers = sc.workload.workers
    target = entry.get("target", "workers")
    if target != "workers":
        slots: tuple[int, ...] = ()
    elif "slot" in entry:
        slots = (entry["slot"],)
    elif "workers" in entry:
        slots = tuple(sorted(rng.sample(range(workers), min(entry["workers"], workers))))
    else:
        slots = tuple(range(workers))
    toxic = {"name": entry["toxic"], "direction": entry.get("direction", "both")}
    toxic |= {k: entry[k] for k in TOXIC_ATTRIBUTES if k in entry}
    at, duration = float(entry.get("at", 0.5)), float(entry.get("duration", 0.0))
    return [Fault(index, round(at, 6), -1, "network", target=target, duration=duration, slots=slots, toxic=toxic)]


def network_option(text: str) -> dict[str, Any]:
    """`--network toxic=timeout,at=1,duration=2,slot=0`: a network [[faults]] entry from the command
    line, with the same keys (checked with the rest of the scenario). Raises ValueError."""
    entry: dict[str, Any] = {"kind": "network"}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ValueError(f"{part!r} is not KEY=VALUE")
        value: Any = raw.strip()
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                continue
        entry[key.strip()] = value
    if "toxic" not in entry:
        raise ValueError("name the toxic: toxic=timeout (or latency, bandwidth, slicer, limit_data, reset_peer, down)")
    return entry


def _partition_problems(entry: dict[str, Any], where: str) -> list[str]:
    p = []
    toxic, probability = entry["toxic"], entry.get("probability")
    if toxic == "loss" and not (isinstance(probability, int | float) and 0 < probability <= 1):
        p.append(f"{where}: loss needs a probability, more than 0 and at most 1, not {probability!r}")
    elif toxic != "loss" and probability is not None:
        p.append(f"{where}: probability is for loss, not {toxic}")
    if entry.get("direction", "both") != "both":
        p.append(f"{where}: {toxic} is on the slot's packets both ways: direction must be both")
    if entry.get("target", "workers") != "workers":
        p.append(f"{where}: {toxic} is for workers (each slot in its own namespace), not target = {entry['target']!r}")
    extra = sorted(k for k in TOXIC_ATTRIBUTES if k in entry and k != "probability")
    if extra:
        p.append(f"{where}: {', '.join(extra)} are attributes of the proxy's toxics, not of {toxic}")
    return p


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    from crashbench.control.proxy import DIRECTIONS, TOXICS  # the proxy's own vocabulary

    where, workers = f"[[faults]] network entry {n}", sc.workload.workers
    p = []
    toxic = entry.get("toxic")
    if toxic not in TOXICS and toxic not in PARTITION_TOXICS:
        known = ", ".join((*TOXICS, *PARTITION_TOXICS))
        p.append(f"{where}: toxic must be one of {known}, not {toxic!r}")
    elif toxic in PARTITION_TOXICS:
        p += _partition_problems(entry, where)
    elif "probability" in entry:
        p.append(f"{where}: probability is for loss (a network partition's), not for the proxy's {toxic}")
    if entry.get("direction", "both") not in DIRECTIONS:
        p.append(f"{where}: direction must be one of {', '.join(DIRECTIONS)}, not {entry.get('direction')!r}")
    for key in ("at", "duration", *TOXIC_ATTRIBUTES):
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10**9):
            p.append(f"{where}: {key} must be a number from 0, not {v!r}")
    slot, k = entry.get("slot"), entry.get("workers")
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < workers):
        p.append(f"{where}: slot must be a worker slot, 0 to {workers - 1}, not {slot!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= workers):
        p.append(f"{where}: workers must be a number of workers, 1 to {workers}, not {k!r}")
    if slot is not None and k is not None:
        p.append(f"{where}: give slot or workers, not both")
    target = entry.get("target", "workers")
    if target not in TARGETS:
        p.append(f"{where}: target must be one of {', '.join(TARGETS)}, not {target!r}")
    elif target != "workers" and (slot is not None or k is not None):
        p.append(f'{where}: slot and workers are for target = "workers", not {target!r}')
    return p


def driver(run: FaultRun) -> Driver | None:
    from crashbench.faults.injector import NetworkFaults

    net = run.net  # type: ignore[attr-defined]
    if net.proxy is None and net.partitions is None:
        return None
    sync = run.broker.sync_replica if run.broker is not None else None  # type: ignore[attr-defined]
    d = NetworkFaults(run.planned, net.proxy, run.clock, run.sc.workload.workers, run.producer, sync, net.partitions)  # type: ignore[attr-defined]
    d.t0 = run.t0
    return d


def history(d: Driver) -> dict[str, Any]:
    return {"network": d.records}  # type: ignore[attr-defined]


FAMILY = FaultFamily(
    name="network",
    summary="a toxic on connections through the proxy, or a partition of worker slots in network namespaces",
    kinds=("network",),
    keys=KEYS,
    problems=problems,
    plan=plan,
    driver=driver,
    history=history,
)
