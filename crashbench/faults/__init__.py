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
      kind = "network"            # a toxic on the workers' connections (crashbench.control.proxy)
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

      [[faults]]
      kind = "hosts"              # worker slots on hosts: a network and a PID namespace each (root only)
      slots = [[0, 1], [2, 3]]
      [[faults]]
      kind = "host-crash"         # or "host-pause", "host-partition" (crashbench.faults.hosts)
      host = 0
      at = 1.0
      downtime = 0.5              # a crash's; a pause's or a partition's length is its duration

Each kind belongs to a fault family (crashbench.faults.family), listed in crashbench.faults.registry:
its keys, its validation, its plan and its driver live with it; this module plans them all.

TOML cannot hold both `[faults]` and `[[faults]]` in one file: a file with `[[faults]]` has no
periodic group (kills = 0) unless the command line adds one (--kills).
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from crashbench.faults import registry
from crashbench.faults.family import DEFAULT_KIND
from crashbench.faults.network import PARTITION_TOXICS as PARTITION_TOXICS  # re-exported
from crashbench.faults.network import network_option as network_option
from crashbench.faults.servers import CLUSTER_KINDS as CLUSTER_KINDS
from crashbench.model.faults import Fault as Fault

if TYPE_CHECKING:
    from crashbench.model.spec import Scenario


def plan(scenario: Scenario) -> list[Fault]:
    """The fault schedule, ordered by start: the same seed gives the same victims at the same times,
    for every design. The periodic group draws its slots first, then each [[faults]] entry in order,
    then the other families' sections (the broker's fault)."""
    rng = random.Random(scenario.faults.seed)
    out: list[Fault] = []
    for family in (f for f in registry.FAMILIES if f.section_first):
        out += family.section(scenario, len(out), rng)
    for entry in scenario.faults.schedule:
        family = registry.owner(entry)
        if family is not None:
            out += family.plan(entry, len(out), scenario, rng)
    for family in (f for f in registry.FAMILIES if not f.section_first):
        out += family.section(scenario, len(out), rng)
    # Faults timed from the drain come after every other, whatever their `at`.
    ordered = sorted(out, key=lambda f: (f.after == "drained", f.at))
    return [dataclasses.replace(f, index=i) for i, f in enumerate(ordered)]


def worker_faults(scenario: Scenario) -> list[Fault]:
    return [f for f in plan(scenario) if f.on_worker]


def parse_entries(entries: list[Any], values: dict[str, Any], problems: list[str]) -> None:
    """`[[faults]]` into the scenario's fields: an entry of a family with a schedule into `schedule`
    (checked by `entry_problems` with the rest of the scenario), one of a family with `fields` (a broker
    fault) into those fields."""
    schedule = []
    values["kills"] = 0  # no [faults] table in this file: no periodic group
    for n, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            problems.append(f"[[faults]] entry {n} must be a table")
            continue
        kind, family = entry.get("kind", DEFAULT_KIND), registry.owner(entry)
        if family is None:
            problems.append(f"[[faults]] entry {n}: kind must be {', '.join(registry.kinds())}, not {kind!r}")
            continue
        for_kind = "" if kind == DEFAULT_KIND else f" for {kind}"
        problems += [f"[[faults]] entry {n}: unknown key {k!r}{for_kind} (known: {', '.join(family.keys)})"
                     for k in entry if k not in family.keys]  # fmt: skip
        if family.fields is not None:
            if "fault" in values:
                problems.append(f"[[faults]] entry {n}: a run has at most one broker fault")
            values.update(family.fields(entry))
        else:  # the default kind is left unnamed, as in a scenario that never named it (its fingerprint)
            schedule.append({k: v for k, v in entry.items() if (k, v) != ("kind", DEFAULT_KIND)})
    values["schedule"] = tuple(schedule)


def entry_problems(entry: dict[str, Any], n: int, scenario: Scenario) -> list[str]:
    """What is wrong with one entry of the schedule, one line each (its family's check)."""
    family = registry.owner(entry)
    return [] if family is None else family.problems(entry, n, scenario)
