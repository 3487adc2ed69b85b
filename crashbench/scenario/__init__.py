"""Scenarios: TOML files describing a workload, a fault schedule and what each design should do.

    name = "lesson"
    description = "..."
    [workload]  jobs, job_ms, workers, job_dist, job_ms_max, poison_rate, transient_rate, transient_failures,
                produce, delay_s, delay_share
    [faults]    kills, interval, signal, kill_when, seed, pause   (or [[faults]] entries: crashbench.faults)
    [queue]     stale_after, recover_every, max_attempts, retry_base, retry_factor, retry_jitter, heartbeat_every,
                batch_size, concurrency, shards, stream_maxlen, stream_trim
    [run]       drain_timeout, designs
    [app]       app, task, payloads, check   (your own app under a library adapter: crashbench.designs.app)
    [expect.<design>]  <metric> = <number> | "<op> <value>"   (thresholds: crashbench.model.thresholds)
    [library.<design>] settings passed to a queue library as its own (Celery conf, RQ worker, ...)

Every field has a default (the lesson's crash test), so a scenario names only what differs.
Validation reports every problem at once.
"""

from __future__ import annotations

import json
import math
import re
import signal
from typing import Any

from crashbench import faults
from crashbench.errors import ScenarioError
from crashbench.faults import registry
from crashbench.model import thresholds
from crashbench.model.spec import Scenario as Scenario  # the record this package parses and validates
from crashbench.model.thresholds import Threshold
from crashbench.scenario.files import available as available
from crashbench.scenario.files import find as find
from crashbench.scenario.files import read_document
from crashbench.scenario.files import scenario_dirs as scenario_dirs
from crashbench.scenario.settings import BLOCKING_POP_S as BLOCKING_POP_S
from crashbench.scenario.settings import BROKER_FAULTS as BROKER_FAULTS
from crashbench.scenario.settings import CHOICES as CHOICES
from crashbench.scenario.settings import COUNT as COUNT
from crashbench.scenario.settings import FAILOVER_ADDRESS as FAILOVER_ADDRESS
from crashbench.scenario.settings import FAULT_SIGNALS as FAULT_SIGNALS
from crashbench.scenario.settings import KILL_TARGETS as KILL_TARGETS
from crashbench.scenario.settings import KILL_WHEN as KILL_WHEN
from crashbench.scenario.settings import MAX_INT as MAX_INT
from crashbench.scenario.settings import NON_NEGATIVE as NON_NEGATIVE
from crashbench.scenario.settings import NUMBERS as NUMBERS
from crashbench.scenario.settings import PERSISTENCE as PERSISTENCE
from crashbench.scenario.settings import POSITIVE as POSITIVE
from crashbench.scenario.settings import POSITIVE_INT as POSITIVE_INT
from crashbench.scenario.settings import POWER_CUT as POWER_CUT
from crashbench.scenario.settings import PRODUCE as PRODUCE
from crashbench.scenario.settings import SECTION_OF as SECTION_OF
from crashbench.scenario.settings import SECTIONS as SECTIONS
from crashbench.scenario.settings import SHARE as SHARE
from crashbench.scenario.settings import STREAM_TRIM as STREAM_TRIM
from crashbench.scenario.settings import SWEEPABLE as SWEEPABLE
from crashbench.scenario.settings import TOPOLOGY as TOPOLOGY
from crashbench.scenario.settings import Bound as Bound

MAX_SCHEDULE_S = 86_400  # no duration of a run's schedule may exceed a day
MAX_JOBS = 100_000_000  # 10,000,000 take about 2 GB at their peak (docs/findings/benchmarks.md: scale)
MAX_NAME, MAX_DESCRIPTION = 1_000, 10_000


def _num(v: object) -> float:
    """A number to compare with a bound; anything else 0 (its own problem is reported elsewhere)."""
    if not isinstance(v, int | float) or isinstance(v, bool) or v != v:
        return 0.0
    try:
        return float(v)
    except OverflowError:  # an integer beyond any float (its own "too large" problem is reported too)
        return math.inf if v > 0 else -math.inf


def with_overrides(scenario: Scenario, **values: Any) -> Scenario:
    """A copy with the given fields replaced (None means: keep the scenario's value); validated."""
    changes = {k: v for k, v in values.items() if v is not None}
    if "signal" in changes:
        changes["signal"] = _signal_name(changes["signal"])
    changed = scenario.replace(**changes)
    found = problems_of(changed)
    if found:
        raise ScenarioError(f"{scenario.source} with command-line options", found)
    return changed


def problems_of(sc: Scenario) -> list[str]:
    """Every problem with the settings, one line each. Any value of any type gives a problem, never
    an exception: the values may come straight from a TOML file or the command line."""
    p: list[str] = []
    for name, bound in NUMBERS.items():
        v = sc.value(name)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
            p.append(f"{SECTION_OF[name]}.{name} is too large: {_show(v)} (at most {MAX_INT})")
        elif not (v is None and name == "drain_timeout") and not bound.accepts(v):
            p.append(f"{SECTION_OF[name]}.{name} must be {bound.wanted()}, not {_show(v)}")
    for name, allowed in CHOICES.items():
        v = sc.value(name)
        if not isinstance(v, str) or v not in allowed:
            p.append(f"{SECTION_OF[name]}.{name} must be one of {', '.join(allowed)}, not {_show(v)}")
    for name in ("name", "description"):
        if not isinstance(getattr(sc, name), str):
            p.append(f"{name} must be a string, not {_show(getattr(sc, name))}")
    designs = sc.run.designs
    if not isinstance(designs, tuple) or not all(isinstance(d, str) for d in designs):
        p.append(f"run.designs must be a list of design names, not {_show(designs)}")
    p += [
        f"[library.{_key(d)}] {problem}"
        for d, table in sc.library.items()
        for problem in (*_infinite(table), *_elsewhere(table), *_out_of_range(table))
    ]
    if NUMBERS["workers"].accepts(sc.workload.workers):
        p += [q for n, e in enumerate(sc.faults.schedule, 1) for q in faults.entry_problems(e, n, sc)]
    timeout = sc.queue.socket_timeout
    if NUMBERS["socket_timeout"].accepts(timeout) and 0 < timeout <= BLOCKING_POP_S:
        p.append(f"queue.socket_timeout must be 0 (none) or longer than a worker's blocking pop ({BLOCKING_POP_S} s)")
    p += [q for family in registry.FAMILIES for q in family.combinations(sc)]
    p += _bounds(sc) + _app(sc)
    lag, at, fault = sc.broker.replica_lag, sc.broker.fault_at, sc.broker.fault
    if NUMBERS["replica_lag"].accepts(lag) and NUMBERS["fault_at"].accepts(at):  # else reported above
        if lag and fault in ("none", "broker-kill"):
            p.append("broker.replica_lag is for a failover (a replica that falls behind its primary)")
        elif lag and fault == "cluster-failover":
            p.append(
                "broker.replica_lag: a graceful cluster-failover waits for its replica to catch up, which a "
                "cut-off replica never does; use cluster-failover-force or cluster-takeover"
            )
        if lag > at:
            p.append(f"broker.replica_lag {lag} must not be longer than broker.fault_at {at}")
    return p


def _bounds(sc: Scenario) -> list[str]:
    """Finite but absurd: a schedule longer than a day never ends in practice (Ctrl-C was the only
    way out), and more jobs than memory holds enqueue until interrupted."""
    p: list[str] = []
    w, f, b = sc.workload, sc.faults, sc.broker
    seconds = {
        "faults.interval": f.interval, "faults.pause": f.pause, "broker.fault_at": b.fault_at,
        "broker.downtime": b.downtime, "broker.produce_s": b.produce_s,
        "queue.stale_after": sc.queue.stale_after, "queue.recover_every": sc.queue.recover_every,
        "run.drain_timeout": sc.run.drain_timeout, "workload.job_ms / 1000": _num(w.job_ms) / 1000,
        "workload.job_ms_max / 1000": _num(w.job_ms_max) / 1000, "workload.delay_s": w.delay_s,
    }  # fmt: skip
    if isinstance(f.kills, int) and not isinstance(f.kills, bool):
        seconds["faults.kills x faults.interval"] = _num(f.kills) * _num(f.interval)
    for n, e in enumerate(f.schedule, 1):
        if isinstance(e, dict):
            for k in ("at", "for", "duration", "pause"):
                if k in e:
                    seconds[f"[[faults]] entry {n}: {k}"] = e[k]
    for what, v in seconds.items():
        if _num(v) > MAX_SCHEDULE_S:
            p.append(f"{what} is {_show(v)} s: a run's schedule is bounded to {MAX_SCHEDULE_S} s (a day)")
    if isinstance(w.jobs, int) and not isinstance(w.jobs, bool) and w.jobs > MAX_JOBS:
        p.append(f"workload.jobs {w.jobs:,} is more than crashbench holds (at most {MAX_JOBS:,})")
    for name, most in (("name", MAX_NAME), ("description", MAX_DESCRIPTION)):
        v = getattr(sc, name)
        if isinstance(v, str) and len(v) > most:
            p.append(f"{name} is {len(v):,} characters long (at most {most:,})")
    return p


def _app(sc: Scenario) -> list[str]:
    """[app]: strings; a task whenever anything else of it is given (the app itself is loaded, and its
    task looked up, by the library adapter: crashbench.designs.app)."""
    values = {name: sc.value(name) for name in SECTIONS["app"]}
    p = [f"app.{k} must be a string, not {_show(v)}" for k, v in values.items() if not isinstance(v, str)]
    if not p and not values["task"] and any(values.values()):
        p.append("app.task is missing: name the task of your app to enqueue (--task)")
    if not p and values["task"] and _num(sc.workload.crash_rate) > 0:
        p.append("workload.crash_rate: crash jobs die in crashbench's own handler; your task ([app] task) runs yours")
    return p


def _signal_name(value: str) -> str:
    name = str(value).upper()
    if name.isdigit():
        try:
            return signal.Signals(int(name)).name
        except ValueError:
            return name
    return name if name.startswith("SIG") else f"SIG{name}"


def _show(v: Any) -> str:
    """A value as a problem line quotes it: short, and never an error itself (repr refuses ints of
    over 4300 digits)."""
    try:
        text = repr(v)
    except ValueError:
        return f"an integer of {v.bit_length()} bits" if isinstance(v, int) else type(v).__name__
    return text if len(text) <= 60 else f"{text[:57]}..."


def _key(key: Any) -> str:
    """A TOML key as a problem line names it: bare when TOML allows, else quoted (a quoted key may
    hold a newline, which would break the one line per problem)."""
    text = str(key)
    return text if text and all(c.isascii() and (c.isalnum() or c in "_-") for c in text) else json.dumps(text)


def _infinite(value: Any, where: str = "") -> list[str]:
    """NaN and infinity anywhere in a library's settings: no library setting means either."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where or 'value'} is {value!r}: numbers must be finite"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _infinite(v, f"{where}.{_key(k)}" if where else _key(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _infinite(v, f"{where}[{i}]")]
    return []


# Library settings that would send a library somewhere else than the run's server: crashbench gives
# each library the run's URL itself, and a key like Celery's broker_url would silently override it.
_SERVER_KEY = re.compile(
    r"(^|_)(url|urls|host|hosts|port|unix_socket_path|socket_path|sentinels?|redis_settings|connection|"
    r"connection_pool|broker|backend|result_backend|address|db|database|password|username)$"
)
# Counts that must be at least 1 (a library takes 0 or less for "none" or fails later, obscurely).
_AT_LEAST_ONE = re.compile(r"(concurrency|threads|processes|workers|max_async_tasks|prefetch_multiplier)$")


def _elsewhere(table: Any, where: str = "") -> list[str]:
    """Keys and values of a library's settings that name a server: refused, the run's own is used."""
    out: list[str] = []
    if isinstance(table, dict):
        for k, v in table.items():
            name = f"{where}.{_key(k)}" if where else _key(k)
            if isinstance(k, str) and _SERVER_KEY.search(k):
                out.append(f"{name}: a library is pointed at the run's server by crashbench, never by its settings")
            else:
                out += _elsewhere(v, name)
    elif isinstance(table, list):
        out += [p for i, v in enumerate(table) for p in _elsewhere(v, f"{where}[{i}]")]
    elif isinstance(table, str) and "://" in table:
        out.append(f"{where or 'value'} = {table!r}: a URL in a library's settings would point it elsewhere")
    return out


def _out_of_range(table: Any, where: str = "") -> list[str]:
    """Numbers a library cannot take: a count, timeout or interval below 0, a concurrency below 1."""
    out: list[str] = []
    if isinstance(table, dict):
        for k, v in table.items():
            name = f"{where}.{_key(k)}" if where else _key(k)
            if isinstance(v, bool) or not isinstance(v, int | float):
                out += _out_of_range(v, name)
            elif isinstance(k, str) and _AT_LEAST_ONE.search(k) and v < 1:
                out.append(f"{name} must be at least 1, not {_show(v)}")
            elif v < 0:
                out.append(f"{name} must not be negative, not {_show(v)}")
    elif isinstance(table, list):
        out += [p for i, v in enumerate(table) for p in _out_of_range(v, f"{where}[{i}]")]
    return out


def parse(data: dict[str, Any], source: str) -> Scenario:
    found: list[str] = []
    values: dict[str, Any] = {"source": source}
    for key, value in data.items():
        if key in ("name", "description"):
            if isinstance(value, str):
                values[key] = value
            else:
                found.append(f"{key} must be a string")
        elif key == "faults" and isinstance(value, list):
            faults.parse_entries(value, values, found)
            for entry in values["schedule"]:
                if isinstance(entry.get("signal"), str | int) and not isinstance(entry["signal"], bool):
                    entry["signal"] = _signal_name(entry["signal"])
        elif key in SECTIONS:
            if not isinstance(value, dict):
                found.append(f"[{key}] must be a table")
                continue
            for sub, v in value.items():
                if sub not in SECTIONS[key]:
                    found.append(f"unknown key {key}.{_key(sub)} (known: {', '.join(SECTIONS[key])})")
                else:
                    values[sub] = v
        elif key == "expect":
            values["expect"] = _parse_expect(value, found)
        elif key == "library":
            if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
                values["library"] = value
            else:
                found.append('[library] must hold one table per design, like [library."celery:acks-late"]')
        else:
            known = f"name, description, {', '.join(SECTIONS)}, expect, library"
            found.append(f"unknown key or section {key!r} (known: {known})")
    # A signal may be written as a name ("term", "SIGTERM") or a number (15); anything else stays as
    # written, for problems() to report.
    if isinstance(values.get("signal"), str | int) and not isinstance(values["signal"], bool):
        values["signal"] = _signal_name(values["signal"])
    if "designs" in values:
        d = values["designs"]
        if isinstance(d, list) and all(isinstance(x, str) for x in d):
            values["designs"] = tuple(d)
        else:
            found.append("run.designs must be a list of design names")
            del values["designs"]
    try:
        scenario = Scenario.of(**values)
    except TypeError as exc:  # cannot happen with the checks above; kept as a clear message if it does
        raise ScenarioError(source, [*found, str(exc)]) from None
    found += problems_of(scenario)
    if found:
        raise ScenarioError(source, found)
    return scenario


def _parse_expect(value: Any, problems: list[str]) -> dict[str, tuple[Threshold, ...]]:
    if not isinstance(value, dict):
        problems.append("[expect] must hold one table per design, like [expect.reliable]")
        return {}
    out: dict[str, tuple[Threshold, ...]] = {}
    for design, table in value.items():
        if not isinstance(table, dict):
            problems.append(f"[expect.{_key(design)}] must be a table of metric = threshold")
            continue
        parsed = []
        for metric, v in table.items():
            if metric not in thresholds.METRICS:  # checked here: a quoted key may hold anything, even ": "
                problems.append(
                    f"[expect.{_key(design)}] unknown metric {metric!r} (known: {', '.join(thresholds.METRICS)})"
                )
                continue
            try:
                parsed.append(thresholds.parse_entry(design, metric, v, source="scenario"))
            except thresholds.ThresholdSyntaxError as exc:
                problems.append(f"[expect.{_key(design)}] {exc}")
        out[design] = tuple(parsed)
    return out


def load(name_or_path: str | None) -> Scenario:
    """A scenario by name (./scenarios, then the shipped ones) or path; ScenarioError lists every problem."""
    path = find(name_or_path or "default")
    return parse(read_document(path), str(path))
