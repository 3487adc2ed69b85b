"""The network family: a toxic on the workers' (or the producer's, or a failover run's replica's)
connections through crashbench's proxy (crashbench.control.proxy: latency, bandwidth, slicer,
limit_data, timeout, reset_peer, down), or the kernel's own faults in a network namespace per worker
slot (crashbench.faults.netns: drop, reject, loss; root only). `[[faults]]` entries of kind =
"network"; the driver is crashbench.faults.injector.NetworkFaults, on the run's network
(crashbench.run.network), which the run starts before its workers when it plans any of these. Its
checker tells each fault's liveness (how soon its slots resumed after the heal; stuck_workers); the
report draws each as a band over the lanes it hit, or across them for the producer or replica link."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun
from crashbench.model.faults import Fault, NetworkFault, NetworkFaultRecord
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline

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
    return [NetworkFault(index, round(at, 6), target=target, duration=duration, slots=slots, toxic=toxic)]


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


def combinations(sc: Scenario) -> list[str]:
    """Network faults the proxy can make in this run: it follows one server, so worker and producer
    targets do not mix with a broker fault (workers re-read the server's address after one and would
    bypass it), and the replica link exists only in a failover run."""
    p = []
    network = [e for e in sc.faults.schedule if isinstance(e, dict) and e.get("kind") == "network"]
    if {e.get("toxic") in PARTITION_TOXICS for e in network} == {True, False}:
        p.append(
            "[[faults]]: a run uses the proxy's toxics or network partitions (drop, reject, loss), not both: "
            "a worker in a namespace cannot reach the proxy"
        )
    for n, e in enumerate(sc.faults.schedule, 1):
        if not isinstance(e, dict) or e.get("kind") != "network":
            continue
        target = e.get("target", "workers")
        if target == "replica" and sc.broker.fault != "failover":
            p.append(f'[[faults]] network entry {n}: target = "replica" needs a failover run (fault = "failover")')
        elif target in ("workers", "producer") and sc.broker.fault != "none":
            p.append(
                f'[[faults]] network entry {n}: target = "{target}" cannot be combined with a broker fault '
                f'({sc.broker.fault}): the proxy follows one server; use target = "replica" in a failover run'
            )
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


def liveness(nf: NetworkFaultRecord, tl: Timeline) -> NetworkFaultRecord:
    """What the queue did after a network fault healed, from the ledgers and the harness's readings:
    how soon its slots started a handler again, how soon anything completed, how soon it drained,
    completions per second before, during and after it, and which of its slots never resumed although
    jobs waited (another slot started one, or the harness read pending jobs, after the heal)."""
    if nf.healed_at is None:
        return nf
    healed, slot_of = nf.healed_at, tl.slot_of()
    starts = [(ex.start, slot_of.get(ex.worker)) for ex in tl.executions if ex.start >= healed]

    def after(t: float | None) -> float | None:
        return round((t - healed) * 1000, 3) if t is not None else None

    if nf.target == "producer":  # resumed: its first acknowledged enqueue after the heal
        nf.resume_ms = nf.slowest_resume_ms = after(
            min((e.t for e in tl.enqueues if e.ok and e.t >= healed), default=None)
        )
    else:
        first: dict[int, float] = {}  # each faulted slot's first handler start after the heal
        for t, s in starts:
            if s in nf.slots and (s not in first or t < first[s]):
                first[s] = t
        nf.resume_ms = after(min(first.values(), default=None))
        if nf.target != "replica":
            nf.slot_resume_ms = [after(first.get(s)) for s in nf.slots]
            nf.slowest_resume_ms = after(max(first.values())) if first and len(first) == len(nf.slots) else None
    ends = sorted(ex.end for ex in tl.executions if ex.completed and ex.end is not None and ex.end >= healed)
    nf.progress_ms = round((ends[0] - healed) * 1000, 3) if ends else None
    nf.drained_ms = round((tl.drained_at - healed) * 1000, 3) if tl.drained else None
    waited = any(s not in nf.slots for _, s in starts) or any(d.t >= healed and d.pending for d in tl.depth)
    nf.stuck = [s for s in nf.slots if waited and s not in {s2 for _, s2 in starts}]
    span = max(healed - nf.at, 0.001)
    done = [ex.end for ex in tl.executions if ex.completed and ex.end is not None]
    nf.per_s = [round(sum(1 for t in done if lo <= t < lo + span) / span, 2) for lo in (nf.at - span, nf.at, healed)]
    return nf


@checker("liveness")
def _liveness(h: History, before: Sections) -> Section:
    """After each network fault: how soon its slots resumed, and those that never did (stuck_workers)."""
    network = [liveness(dataclasses.replace(nf, slots=list(nf.slots)), h.timeline) for nf in h.timeline.network]
    stuck = len({s for nf in network for s in nf.stuck})
    return Section("liveness", counts={"stuck_workers": stuck}, fields={"network_faults": network})


def bands(tl: Timeline) -> list[Band]:
    """Each fault over the lanes it hit; one on the producer's or the replica link's connection, which is
    no lane's, faintly across them all."""
    out = []
    for nf in tl.network:
        when = (
            f"{nf.at:.3f} s to {nf.healed_at:.3f} s"
            if nf.healed_at is not None
            else f"from {nf.at:.3f} s, never healed"
        )
        if nf.target == "workers":
            on = f"slot{'s' if len(nf.slots) != 1 else ''} {', '.join(map(str, nf.slots))}"
            tip = f"network {nf.toxic} on {on}: {when}"
            out.append(Band(nf.at, nf.healed_at, f"network {nf.toxic}", f"network {nf.toxic}", tip, tuple(nf.slots)))
        else:
            what = f"network {nf.toxic} on the {'producer' if nf.target == 'producer' else 'replica link'}"
            out.append(Band(nf.at, nf.healed_at, f"network elsewhere {nf.toxic}", what, f"{what}: {when}"))
    return out


CSS = """.band.network rect{fill:#9ecae1;fill-opacity:.45;stroke:#3182bd}
.band.network.elsewhere rect{fill-opacity:.12;stroke-dasharray:4 3}.band-label.network{fill:#1f5f8b}"""

FAMILY = FaultFamily(
    name="network",
    summary="a toxic on connections through the proxy, or a partition of worker slots in network namespaces",
    kinds=("network",),
    keys=KEYS,
    problems=problems,
    combinations=combinations,
    plan=plan,
    driver=driver,
    history=history,
    checkers=(_liveness,),
    bands=bands,
    css=CSS,
)
