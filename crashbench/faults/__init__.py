"""The fault model and its schedule: every fault a run injects, decided from the seed before anything
runs, so every design of a compare (and every replay) gets the same one.

A scenario describes its faults two ways, and a run may have both:
- the `[faults]` table (one periodic group of worker signals: kills, interval, signal, kill_when,
  kill_target, pause) and `[broker]` (fault, fault_at, downtime), as before;
- a `[[faults]]` array of tables, for mixed schedules, one entry per group:

      [[faults]]                  # a worker signal (kind = "signal", the default)
      signal = "SIGKILL"          # SIGTERM, SIGSTOP (a pause of `pause` s), ...
      at = 0.5                    # the first, seconds after the workers start
      count = 4                   # how many (1)
      every = 0.5                 # seconds between them (0.5)
      slot = 2                    # the victim's worker slot (by default, seeded)
      kill_when = "mid-job"       # or "any"
      target = "tree"             # a library worker that is a process tree: tree, parent or child
      after = "start"             # or "drained": `at` counts from when the queue has drained (after
                                  # every other fault); with kill_when = "any", as no job is left to be inside;
                                  # a run whose drain gives up never makes them
      pause = 1.0                 # SIGSTOP only

      [[faults]]
      kind = "broker-kill"        # or "failover"; the server's persistence etc. stay in [broker]
      at = 1.0
      downtime = 0.5              # broker-kill, cluster-kill and cluster-partition (the cut, after the promotion)

      [[faults]]
      kind = "cluster-kill"       # or "cluster-failover", "cluster-failover-force", "cluster-takeover":
      at = 1.0                    # the run's shard of crashbench's own cluster (crashbench.faults.cluster)

      [[faults]]
      kind = "network"            # a toxic on the workers' connections (crashbench.faults.proxy)
      toxic = "timeout"           # latency, bandwidth, slicer, limit_data, timeout, reset_peer, down
      direction = "both"          # or "upstream" (worker -> server), "downstream"
      at = 1.0
      duration = 3.0              # then it heals; 0: never
      slot = 0                    # one worker; or workers = k (k seeded slots); neither: every worker
      target = "workers"          # or "producer" (the harness's enqueues go through the proxy, during the
                                  # run) or "replica" (a failover run's replica link to its primary)
      timeout = 0                 # the toxic's own attributes, Toxiproxy's names (latency, jitter, ...)

  `toxic = "drop"`, `"reject"` or `"loss"` (with `probability`) are the kernel's own faults instead:
  each worker slot in its own network namespace, iptables rules on its packets, both ways (root and
  iptables needed; crashbench.faults.netns). A run uses the proxy's toxics or these, not both.

TOML cannot hold both `[faults]` and `[[faults]]` in one file: a file with `[[faults]]` has no
periodic group (kills = 0) unless the command line adds one (--kills).
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from crashbench.model.faults import Fault as Fault  # re-exported

if TYPE_CHECKING:
    from crashbench.scenario import Scenario

WORKER_KEYS = ("kind", "signal", "at", "count", "every", "slot", "kill_when", "target", "pause", "after")
AFTER = ("start", "drained")  # what a worker entry's `at` counts from
TOXIC_ATTRIBUTES = (
    "latency", "jitter", "rate", "average_size", "size_variation", "delay", "bytes", "timeout", "probability",
)  # fmt: skip
# The kernel's faults, in network namespaces with iptables (crashbench.faults.netns): root only.
PARTITION_TOXICS = ("drop", "reject", "loss")
NETWORK_KEYS = ("kind", "toxic", "direction", "at", "duration", "slot", "workers", "target", *TOXIC_ATTRIBUTES)
NETWORK_TARGETS = ("workers", "producer", "replica")
BROKER_KEYS = ("kind", "at", "downtime")
CLUSTER_KINDS = (
    "cluster-kill", "cluster-failover", "cluster-failover-force", "cluster-takeover", "cluster-partition",
)  # fmt: skip
# [[faults]] kind -> [broker] fault (a cluster fault's kind is its own name)
BROKER_KINDS = {"broker-kill": "kill", "failover": "failover", **{k: k for k in CLUSTER_KINDS}}


def plan(scenario: Scenario) -> list[Fault]:
    """The fault schedule, ordered by start: the same seed gives the same victims at the same times,
    for every design. The periodic group draws its slots first, then each [[faults]] entry in order."""
    rng = random.Random(scenario.seed)
    sc = scenario
    out = [
        Fault(i, round((i + 1) * sc.interval, 6), rng.randrange(sc.workers), signal=sc.signal, kill_when=sc.kill_when,
              target=sc.kill_target, duration=sc.pause if sc.signal == "SIGSTOP" else 0.0)
        for i in range(sc.kills)
    ]  # fmt: skip
    for entry in sc.schedule:
        if entry.get("kind") == "network":
            out.append(_network(entry, len(out), sc.workers, rng))
            continue
        every = float(entry.get("every", 0.5))
        for n in range(int(entry.get("count", 1))):
            slot = entry["slot"] if "slot" in entry else rng.randrange(sc.workers)
            signal = entry.get("signal", "SIGKILL")
            out.append(
                Fault(len(out), round(float(entry.get("at", 0.5)) + n * every, 6), slot, signal=signal,
                      kill_when=entry.get("kill_when", "mid-job"), target=entry.get("target", "tree"),
                      duration=float(entry.get("pause", 1.0)) if signal == "SIGSTOP" else 0.0,
                      after=entry.get("after", "start"))
            )  # fmt: skip
    if sc.fault != "none":
        kind = {"kill": "broker-kill"}.get(sc.fault, sc.fault)
        downtime = sc.downtime if kind in ("broker-kill", "cluster-kill", "cluster-partition") else 0.0
        out.append(Fault(len(out), sc.fault_at, -1, kind, duration=downtime))
    # Faults timed from the drain come after every other, whatever their `at`.
    ordered = sorted(out, key=lambda f: (f.after == "drained", f.at))
    return [dataclasses.replace(f, index=i) for i, f in enumerate(ordered)]


def _network(entry: dict[str, Any], index: int, workers: int, rng: random.Random) -> Fault:
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
    return Fault(index, round(at, 6), -1, "network", target=target, duration=duration, slots=slots, toxic=toxic)


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


def worker_faults(scenario: Scenario) -> list[Fault]:
    return [f for f in plan(scenario) if f.on_worker]


def parse_entries(entries: list[Any], values: dict[str, Any], problems: list[str]) -> None:
    """`[[faults]]` into the scenario's fields: worker entries into `schedule` (checked by
    `entry_problems` with the rest of the scenario), a broker entry into fault / fault_at / downtime."""
    schedule = []
    values["kills"] = 0  # no [faults] table in this file: no periodic group
    for n, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            problems.append(f"[[faults]] entry {n} must be a table")
            continue
        kind = entry.get("kind", "signal")
        if kind in BROKER_KINDS:
            problems += [f"[[faults]] entry {n}: unknown key {k!r} for {kind} (known: {', '.join(BROKER_KEYS)})"
                         for k in entry if k not in BROKER_KEYS]  # fmt: skip
            if "fault" in values:
                problems.append(f"[[faults]] entry {n}: a run has at most one broker fault")
            values["fault"] = BROKER_KINDS[kind]
            values.update({k2: entry[k] for k, k2 in (("at", "fault_at"), ("downtime", "downtime")) if k in entry})
        elif kind == "network":
            problems += [f"[[faults]] entry {n}: unknown key {k!r} for network (known: {', '.join(NETWORK_KEYS)})"
                         for k in entry if k not in NETWORK_KEYS]  # fmt: skip
            schedule.append(dict(entry))
        elif kind == "signal":
            problems += [f"[[faults]] entry {n}: unknown key {k!r} (known: {', '.join(WORKER_KEYS)})"
                         for k in entry if k not in WORKER_KEYS]  # fmt: skip
            schedule.append({k: v for k, v in entry.items() if k != "kind"})
        else:
            problems.append(
                f"[[faults]] entry {n}: kind must be signal, network, {', '.join(BROKER_KINDS)}, not {kind!r}"
            )
    values["schedule"] = tuple(schedule)


def entry_problems(entry: dict[str, Any], n: int, workers: int, signals: tuple[str, ...]) -> list[str]:
    """What is wrong with one worker or network entry of [[faults]], one line each."""
    if entry.get("kind") == "network":
        return _network_problems(entry, n, workers)
    where = f"[[faults]] signal entry {n}"
    p = []
    for key, whole, low in (("at", False, 0), ("count", True, 1), ("every", False, 0), ("pause", False, 0)):
        v = entry.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or (whole and not isinstance(v, int)):
            p.append(f"{where}: {key} must be {'a whole number' if whole else 'a number'}, not {v!r}")
        elif not v >= low or v != v or v in (float("inf"), float("-inf")) or v > 10**9:
            p.append(f"{where}: {key} must be at least {low} (and finite), not {v!r}")
    slot = entry.get("slot")
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < workers):
        p.append(f"{where}: slot must be a worker slot, 0 to {workers - 1}, not {slot!r}")
    if entry.get("signal", "SIGKILL") not in signals:
        p.append(f"{where}: signal must be one of {', '.join(signals)}, not {entry.get('signal')!r}")
    if entry.get("kill_when", "mid-job") not in ("mid-job", "any"):
        p.append(f"{where}: kill_when must be mid-job or any, not {entry.get('kill_when')!r}")
    if entry.get("target", "tree") not in ("tree", "parent", "child"):
        p.append(f"{where}: target must be tree, parent or child, not {entry.get('target')!r}")
    after = entry.get("after", "start")
    if after not in AFTER:
        p.append(f"{where}: after must be start or drained, not {after!r}")
    elif after == "drained" and entry.get("kill_when", "mid-job") != "any":
        p.append(f'{where}: after = "drained" needs kill_when = "any": a drained queue has no job left to be inside')
    return p


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


def _network_problems(entry: dict[str, Any], n: int, workers: int) -> list[str]:
    from crashbench.faults.proxy import DIRECTIONS, TOXICS  # the proxy's own vocabulary

    where = f"[[faults]] network entry {n}"
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
    if target not in NETWORK_TARGETS:
        p.append(f"{where}: target must be one of {', '.join(NETWORK_TARGETS)}, not {target!r}")
    elif target != "workers" and (slot is not None or k is not None):
        p.append(f'{where}: slot and workers are for target = "workers", not {target!r}')
    return p
