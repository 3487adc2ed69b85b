"""The hosts family: worker slots grouped into hosts, each a Linux network namespace (its own address,
crashbench.faults.netns) plus a PID namespace whose init crashbench starts (crashbench.control.pidns),
and the faults of a whole host, as Jepsen's nemeses make them on its nodes:

    [[faults]]
    kind = "hosts"
    slots = [[0, 1], [2, 3]]     # host 0 runs worker slots 0 and 1, host 1 slots 2 and 3; a slot on
                                 # no host runs on the machine itself, as without hosts

    [[faults]]
    kind = "host-crash"          # its init SIGKILLed: every worker on it dies at once; rebooted (a new
    host = 0                     # init, a new worker in each of its slots) `downtime` s later
    at = 1.0
    downtime = 0.5

    kind = "host-pause"          # every process on it SIGSTOPped for `duration` s
    kind = "host-partition"      # cut off (iptables DROP, both ways) for `duration` s: from the server
    from = "server"              # (the default); or "hosts": from every other host, or [1, 2]: from
                                 # those; cut off from hosts it still reaches the server

Root, `ip` and `iptables` only (crashbench.faults.netns.unavailable says what is missing); the server
must be one crashbench starts (it is made to listen on the hosts' addresses).

Or hosts over SSH (crashbench.faults.hosts.ssh), each slot's worker started there, the same faults made
by commands over SSH (a host-partition needs root there, for iptables):

    [[faults]]
    kind = "hosts"
    slots = [[0, 1], [2, 3]]
    ssh = ["deploy@10.0.0.11", "deploy@10.0.0.12:2222"]    # one target per host
    identity = "~/.ssh/crashbench"     # the private key file (default: the agent and ~/.ssh's keys)
    known_hosts = "~/.ssh/known_hosts" # the hosts' keys are checked against it; "none": not checked
    python = "/opt/app/venv/bin/python"  # the hosts' Python, with redis-py and the design's library
    server = "10.0.0.10"               # the server's address as the hosts reach it

The driver is
crashbench.faults.hosts.inject; its events go into the timeline's fault events; its checker counts what
the crashes cost from the final ledger: the jobs each crash interrupted, of which those that ran again
and those lost."""

from __future__ import annotations

import math
import random
from typing import Any

from crashbench.control.ssh import SshTarget
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band, Driver, Entry, FaultFamily, FaultRun
from crashbench.faults.hosts.inject import FAMILY as NAME
from crashbench.faults.hosts.inject import HostFaults
from crashbench.model.faults import HOST_KINDS, Fault, HostFault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import FaultEvent, Timeline

SSH_KEYS = ("ssh", "identity", "known_hosts", "python", "server")  # hosts over SSH (the layout's entry)

KINDS = ("hosts", *HOST_KINDS)
KEYS = ("kind", "slots", "host", "at", "duration", "downtime", "from", *SSH_KEYS)
DOWNTIME = 0.5  # a crashed host's, by default
DURATION = 1.0  # a pause's or a partition's, by default


def layout(sc: Scenario) -> tuple[tuple[int, ...], ...]:
    """The run's hosts, each its slots (its `[[faults]]` entry of kind = "hosts"); () without one."""
    for e in sc.faults.schedule:
        if isinstance(e, dict) and e.get("kind") == "hosts" and isinstance(e.get("slots"), list | tuple):
            return tuple(tuple(h) if isinstance(h, list | tuple) else () for h in e["slots"])
    return ()


def ssh_settings(sc: Scenario) -> dict[str, Any] | None:
    """The layout's SSH settings (its `ssh` list of targets and the keys beside it), or None: the hosts
    are this machine's namespaces."""
    for e in sc.faults.schedule:
        if isinstance(e, dict) and e.get("kind") == "hosts" and e.get("ssh") is not None:
            return {k: e[k] for k in SSH_KEYS if k in e}
    return None


def _ssh_problems(where: str, entry: Entry) -> list[str]:
    targets, hosts = entry.get("ssh"), entry.get("slots")
    if targets is None:
        return [f"{where}: {k} is for hosts over SSH: give ssh = [...] too" for k in SSH_KEYS[1:] if k in entry]
    if not isinstance(targets, list | tuple) or not all(isinstance(t, str) for t in targets):
        return [f'{where}: ssh must be a list of targets, one per host ("user@host:port"), not {targets!r}']
    p = []
    if isinstance(hosts, list | tuple) and len(targets) != len(hosts):
        p.append(f"{where}: ssh names {len(targets)} target(s) for {len(hosts)} host(s): one per host")
    for t in targets:
        try:
            SshTarget.parse(t)
        except ValueError as exc:
            p.append(f"{where}: ssh: {exc}")
    for k in SSH_KEYS[1:]:
        if k in entry and (not isinstance(entry[k], str) or not entry[k].strip()):
            p.append(f"{where}: {k} must be a non-empty string, not {entry[k]!r}")
    return p


def apart(entry: Entry, hosts: int) -> tuple[int, ...]:
    """The hosts a host-partition cuts its host off from (`from`); (): from the server."""
    given, host = entry.get("from", "server"), entry.get("host", 0)
    if given == "hosts":
        return tuple(h for h in range(hosts) if h != host)
    return tuple(given) if isinstance(given, list | tuple) else ()


def plan(entry: Entry, start: int, sc: Scenario, rng: random.Random) -> list[Fault]:
    """Nothing drawn: the host, the times and the hosts it is cut off from are the entry's."""
    kind = entry.get("kind")
    if kind not in HOST_KINDS:
        return []  # the layout
    length = entry.get("downtime", DOWNTIME) if kind == "host-crash" else entry.get("duration", DURATION)
    at, host = float(entry.get("at", 1.0)), entry.get("host", 0)
    return [HostFault(start, at, kind=kind, duration=float(length), host=host, apart=apart(entry, len(layout(sc))))]


def _layout_problems(where: str, hosts: object, workers: int) -> list[str]:
    if not isinstance(hosts, list | tuple) or not hosts:
        return [
            f"{where}: slots must be a list of hosts, each a list of worker slots ([[0, 1], [2, 3]]), not {hosts!r}"
        ]
    p, seen = [], {}
    for i, h in enumerate(hosts):
        good = isinstance(h, list | tuple) and h and all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < workers for s in h
        )  # fmt: skip
        if not good:
            p.append(f"{where}: host {i} must be a non-empty list of worker slots, 0 to {workers - 1}, not {h!r}")
            continue
        for s in h:
            if s in seen:
                p.append(f"{where}: slot {s} is on host {seen[s]} and host {i}: a slot is on one host")
            seen.setdefault(s, i)
    return p


def problems(entry: Entry, n: int, sc: Scenario) -> list[str]:
    kind, where = entry.get("kind"), f"[[faults]] {entry.get('kind')} entry {n}"
    if kind == "hosts":
        p = [f"{where}: {k} is for a host fault, not the hosts' layout" for k in KEYS[2:7] if k in entry]
        return p + _layout_problems(where, entry.get("slots"), sc.workload.workers) + _ssh_problems(where, entry)
    p = [f'{where}: {k} is for kind = "hosts" (the layout), not {kind}' for k in ("slots", *SSH_KEYS) if k in entry]
    own = "downtime" if kind == "host-crash" else "duration"
    other = "duration" if own == "downtime" else "downtime"
    if other in entry:
        p.append(f"{where}: {other} is not for {kind}: its length is its {own}")
    for key in ("at", own):
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10**9):
            p.append(f"{where}: {key} must be a number of seconds from 0, not {v!r}")
    hosts, host = layout(sc), entry.get("host")
    if host is None:
        p.append(f"{where}: host is missing: which host (0 to {max(len(hosts), 1) - 1}) it hits")
    elif hosts and (isinstance(host, bool) or not isinstance(host, int) or not 0 <= host < len(hosts)):
        p.append(f"{where}: host must be a host, 0 to {len(hosts) - 1}, not {host!r}")
    if "from" in entry:
        p += _from_problems(where, kind, entry["from"], host, len(hosts))
    return p


def _from_problems(where: str, kind: object, given: object, host: object, hosts: int) -> list[str]:
    if kind != "host-partition":
        return [f"{where}: from is for host-partition (what it is cut off from), not {kind}"]
    others = [h for h in range(hosts) if h != host]
    if given == "server" or (given == "hosts" and others) or not hosts:  # no layout: said by combinations
        return []
    if given == "hosts":
        return [f'{where}: from = "hosts" needs another host to cut host {host} off from: the layout has one']
    good = isinstance(given, list | tuple) and given and len(set(map(repr, given))) == len(given) and all(
        isinstance(h, int) and not isinstance(h, bool) and h in others for h in given
    )  # fmt: skip
    if good:
        return []
    which = ", ".join(map(str, others))
    return [f'{where}: from must be "server", "hosts" or a list of other hosts ({which}), each once, not {given!r}']


def combinations(sc: Scenario) -> list[str]:
    """One layout for every host fault, and nothing that needs the network the hosts replace."""
    entries = [(n, e) for n, e in enumerate(sc.faults.schedule, 1) if isinstance(e, dict)]
    layouts = [n for n, e in entries if e.get("kind") == "hosts"]
    p = [f"[[faults]] hosts entry {n}: a run has one layout of hosts (the first is entry {layouts[0]})"
         for n in layouts[1:]]  # fmt: skip
    if not layouts:
        p += [f'[[faults]] {e["kind"]} entry {n}: no hosts to hit: declare them in a [[faults]] entry of kind = "hosts"'
              for n, e in entries if e.get("kind") in HOST_KINDS]  # fmt: skip
    else:
        why = "a run with hosts has its workers' network in the hosts' namespaces: cut a host off with host-partition"
        p += [f"[[faults]] network entry {n}: {why}" for n, e in entries if e.get("kind") == "network"]
        if sc.broker.fault != "none":
            p.append(f"[[faults]] hosts entry {layouts[0]}: hosts do not combine with a broker fault "
                     f"({sc.broker.fault}): a restarted server forgets the hosts' addresses")  # fmt: skip
    return p


def driver(run: FaultRun) -> Driver | None:
    if not any(isinstance(f, HostFault) for f in run.planned) or run.net.hosts is None:  # type: ignore[attr-defined]
        return None
    return HostFaults(run.planned, run)


def history(d: Driver) -> dict[str, Any]:
    return {"fault_events": d.events}  # type: ignore[attr-defined]


def events(tl: Timeline, what: str) -> list[FaultEvent]:
    return [e for e in tl.fault_events if e.family == NAME and e.what == what]


@checker("hosts")
def _hosts(h: History, before: Sections) -> Section:
    """What the host faults did, and what the crashes cost, from the final ledger: the jobs started in a
    worker a crash killed that never ended there; of them, those a later execution started (anywhere), and
    those lost."""
    tl, runs = h.timeline, h.runs
    crashed = {w for e in events(tl, "crash") for w in e.data["workers"]}
    interrupted: dict[str, float] = {}  # job -> the start of its execution a crash interrupted
    for r in range(len(runs)):
        if runs.worker(r) in crashed and math.isnan(runs.ends[r]):
            interrupted[runs.job(r)] = max(runs.starts[r], interrupted.get(runs.job(r), -math.inf))
    # Ran again: an execution started after the interrupted one (not "after the crash": a worker may write
    # its start record between the harness's reading of its clock and the kill).
    rerun = {runs.job(r) for r in range(len(runs)) if runs.starts[r] > interrupted.get(runs.job(r), math.inf)}
    lost = set(interrupted) & set(before.fact("outcomes", "classes")["lost"])
    counts = {
        "host_crashes": len(events(tl, "crash")),
        "host_crash_workers": len(crashed),
        "host_crash_interrupted": len(interrupted),
        "host_crash_rerun": len(rerun),
        "host_crash_lost": len(lost),
        "host_pauses": len(events(tl, "pause")),
        "host_partitions": len(events(tl, "partition")),
    }
    return Section("hosts", counts=counts, jobs={"host_crash_lost": sorted(lost)[:100]} if lost else {})


HEALS = {"crash": "boot", "pause": "resume", "partition": "heal"}


def bands(tl: Timeline) -> list[Band]:
    """Each host fault over its host's lanes, from its start to its heal (a crash: to the reboot)."""
    out = []
    for what, heal in HEALS.items():
        ends = {e.data["index"]: e.t for e in events(tl, heal)}
        for e in events(tl, what):
            until = ends.get(e.data["index"])
            span = f"{e.t:.3f} s to {until:.3f} s" if until is not None else f"from {e.t:.3f} s, never over"
            tip = f"host {e.data['host']} {what}: {span}"
            if e.data.get("apart"):
                tip += f" (from host {', '.join(map(str, e.data['apart']))}; still reaching the server)"
            if what == "crash":
                tip += f" ({len(e.data['jobs'])} job{'s' if len(e.data['jobs']) != 1 else ''} running)"
            out.append(Band(e.t, until, f"host {what}", f"host {what}", tip, tuple(e.data["slots"])))
    return out


CSS = """.band.host rect{fill:#dadaeb;fill-opacity:.45;stroke:#756bb1}.band.host.crash rect{fill:#bcbddc}
.band-label.host{fill:#54278f}"""

ROWS = (
    ("host crashes", "host_crashes", False), ("  workers killed", "host_crash_workers", False),
    ("  jobs running on it", "host_crash_interrupted", False), ("    ran again", "host_crash_rerun", False),
    ("    lost", "host_crash_lost", True), ("host pauses", "host_pauses", False),
    ("host partitions", "host_partitions", False),
)  # fmt: skip

FAMILY = FaultFamily(
    name=NAME,
    summary="worker slots on hosts (a network and PID namespace each): crash, pause or cut off a whole host "
    "(from the server or from other hosts)",
    kinds=KINDS,
    keys=KEYS,
    problems=problems,
    combinations=combinations,
    plan=plan,
    driver=driver,
    history=history,
    checkers=(_hosts,),
    bands=bands,
    css=CSS,
    rows=ROWS,
)
