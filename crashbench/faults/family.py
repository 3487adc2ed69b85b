"""The fault-family interface: everything about one family of faults in one place, as Jepsen packages
a nemesis with its generator (nemesis/combined.clj).

A family declares its `[[faults]]` kinds and keys and validates an entry; plans its faults from the
seed (from its own scenario section, and from each of its entries); builds, from the run, the driver
that injects and heals them from the run's loop; and writes what it did into the run's history (the
timeline). The scenario parser, the planner and the runner know families only through this interface
and the registry (crashbench.faults.registry): a new family is one module (or package), its tests and
one line there. docs/how-to/add-a-fault-family.md walks through one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario


class Driver(Protocol):
    """A family's faults in a run: stepped from the run's loop until done. `step` returns True while it
    waits for a moment it must not miss (a victim entering a handler): with `fine`, the loop then steps
    it again at once, ten times a tick, and nothing else."""

    fine: bool

    @property
    def done(self) -> bool: ...

    def step(self, now: float) -> bool | None: ...


class Producer(Protocol):
    """The run's producer, as a fault that meets its enqueues sees it (crashbench.run.producer.Producer):
    a fault marks the enqueues it may lose as lagging, and waits for the last one."""

    lagging: bool  # enqueues from now on are acknowledged by a primary its replica no longer follows

    @property
    def done(self) -> bool: ...

    @property
    def acknowledged(self) -> int: ...


class FaultRun(Protocol):
    """What a family's driver is built from and reports to: the crash run, as its faults see it
    (crashbench.run.runner.CrashRun)."""

    planned: list[Fault]
    t0: float

    def clock(self) -> float: ...


Entry = dict[str, Any]
DEFAULT_KIND = "signal"  # an entry that names no kind: a worker signal


def no_problems(entry: Entry, n: int, scenario: Scenario) -> list[str]:
    return []


def no_faults(scenario: Scenario, start: int, rng: random.Random) -> list[Fault]:
    return []


def no_entry_faults(entry: Entry, start: int, scenario: Scenario, rng: random.Random) -> list[Fault]:
    return []


def no_driver(run: FaultRun) -> Driver | None:
    return None


def no_history(driver: Driver) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class FaultFamily:
    """One family of faults. Every hook has a default that does nothing, so a family declares only what
    it has."""

    name: str
    summary: str  # one line, for the reference
    kinds: tuple[str, ...]  # the `[[faults]]` kinds it owns; the first is the default kind when it is "signal"
    keys: tuple[str, ...]  # the keys its entries take
    # An entry's problems, one line each ("[[faults]] <family> entry <n>: ..."); `n` counts from 1.
    problems: Callable[[Entry, int, Scenario], list[str]] = no_problems
    # Its faults from its own scenario section (the [faults] group, [broker]), numbered from `start`.
    section: Callable[[Scenario, int, random.Random], list[Fault]] = no_faults
    section_first: bool = False  # its section is drawn before the entries (the seed's order)
    # An entry's faults, numbered from `start`; the seed drawn in the entries' order.
    plan: Callable[[Entry, int, Scenario, random.Random], list[Fault]] = no_entry_faults
    # The scenario fields an entry sets instead of joining the schedule ([broker] faults: one per run),
    # by their flat names (fault, fault_at: Scenario.replace puts each in its section); None: its
    # entries join the schedule.
    fields: Callable[[Entry], dict[str, Any]] | None = None
    # The driver that injects and heals its faults, built from the run once its workers run; None: none.
    driver: Callable[[FaultRun], Driver | None] = no_driver
    # It faults the server: in each tick its driver steps after the producer's enqueue, which its fault
    # then meets; the others' (a fault on the connections) before it.
    on_server: bool = False
    # What it did, as Timeline fields (crashbench.model.timeline): records, readings, marks.
    history: Callable[[Driver], dict[str, Any]] = no_history

    def owns(self, entry: Entry) -> bool:
        return entry.get("kind", DEFAULT_KIND) in self.kinds
