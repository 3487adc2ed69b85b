"""The fault-family interface: everything about one family of faults in one place, as Jepsen packages
a nemesis with its generator (nemesis/combined.clj).

A family declares its `[[faults]]` kinds and keys and validates an entry; plans its faults from the
seed (from its own scenario section, and from each of its entries); builds, from the run, the driver
that injects and heals them from the run's loop; writes what it did into the run's history (the
timeline); contributes its checkers, which turn that history into its section of the result (counts
such as held_at_fault or stuck_workers); and says how the report draws it (marks on the worker lanes,
bands over them, and the CSS of their classes). The scenario parser, the planner, the runner, the
checkers' composition and the report know families only through this interface and the registry
(crashbench.faults.registry): a new family is one module (or package), its tests and one line there.
docs/how-to/add-a-fault-family.md walks through one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from crashbench.evidence.checker import Checker
from crashbench.model.faults import Fault
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline


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


def slot_problems(where: str, slots: object, workers: int) -> list[str]:
    """What is wrong with an entry's `slots` (a non-empty list of worker slots, each once), for its message."""
    ok = isinstance(slots, list | tuple) and slots and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < workers for s in slots
    )  # fmt: skip
    if not ok:
        return [f"{where}: slots must be a list of worker slots, 0 to {workers - 1}, not {slots!r}"]
    if len(set(slots)) != len(slots):  # type: ignore[arg-type]
        return [f"{where}: slots names a slot twice: {slots!r}"]
    return []


def no_problems(entry: Entry, n: int, scenario: Scenario) -> list[str]:
    return []


def no_combinations(scenario: Scenario) -> list[str]:
    return []


def no_faults(scenario: Scenario, start: int, rng: random.Random) -> list[Fault]:
    return []


def no_entry_faults(entry: Entry, start: int, scenario: Scenario, rng: random.Random) -> list[Fault]:
    return []


def no_driver(run: FaultRun) -> Driver | None:
    return None


def no_env(scenario: Scenario, slot: int) -> dict[str, str]:
    return {}


def no_history(driver: Driver) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Mark:
    """A fault that struck one worker lane at one moment, as the report draws it: a cross on lane `slot`
    at `at` (seconds since the workers started), `span` seconds shaded after it (a pause), `job` the job
    it hit (empty: none). `css`: its classes, which the family's `css` styles."""

    at: float
    slot: int
    css: str
    tip: str
    job: str = ""
    span: float = 0.0


@dataclass(frozen=True, slots=True)
class Band:
    """A stretch of the run under a fault, as the report draws it: over the lanes of `slots` (None: across
    every lane, for the server or a connection that is no worker's), from `at` to `until` (None: the end
    of the chart), `label` above it, `tip` on hover. `css`: its classes, which the family's `css` styles."""

    at: float
    until: float | None
    css: str
    label: str
    tip: str
    slots: tuple[int, ...] | None = None


def no_marks(tl: Timeline) -> list[Mark]:
    return []


def no_bands(tl: Timeline) -> list[Band]:
    return []


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
    # What is wrong with its entries together, or with the rest of the spec (a network fault's target
    # with a broker fault), one line each.
    combinations: Callable[[Scenario], list[str]] = no_combinations
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
    # A worker slot's own environment at every start (a preloaded library: the clock family's), "{dir}"
    # standing for the run's work directory; a slot given one is exec'd into a fresh interpreter.
    worker_env: Callable[[Scenario, int], dict[str, str]] = no_env
    # What it did, as Timeline fields (crashbench.model.timeline): records, readings, marks; a family
    # with no field of its own gives "fault_events" (FaultEvent: every family's are kept, in order).
    history: Callable[[Driver], dict[str, Any]] = no_history
    # Its sections of the result (crashbench.evidence.checker), composed after the core checkers
    # (crashbench.evidence.tally.CHECKERS), in the registry's order; one checker shared by two families
    # runs once.
    checkers: tuple[Checker, ...] = ()
    # How the report draws what it did (crashbench.report.lanes), and the CSS rules for their classes.
    marks: Callable[[Timeline], list[Mark]] = no_marks
    bands: Callable[[Timeline], list[Band]] = no_bands
    css: str = ""
    # Its counts' rows in the report's tables (label, count, an alarm when not zero), after the core's, each
    # shown when some run's count is not zero; a leading "  " breaks down the row above.
    rows: tuple[tuple[str, str, bool], ...] = ()

    def owns(self, entry: Entry) -> bool:
        return entry.get("kind", DEFAULT_KIND) in self.kinds
