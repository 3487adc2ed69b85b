"""The checker protocol, as Jepsen's checker.clj has it: a checker reads a run's history and gives its
section of the result; `compose` runs several, in order, each seeing the sections before it; and
`check_safe` turns a checker that raises into a section whose verdict is unknown, with the error,
so that the others still run and the run ends with that error named (exit 5), never half counted.

crashbench.evidence.tally composes the run's checkers (outcomes, evidence checks, recovery, trim,
liveness, ...) into a DesignRun."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from crashbench.model.counts import Counts, Problem
from crashbench.model.executions import Executions
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Timeline


@dataclass(slots=True)
class History:
    """What every checker reads: the run's timeline, its scenario, its executions in columns."""

    timeline: Timeline
    scenario: Scenario
    runs: Executions

    @classmethod
    def of(cls, tl: Timeline) -> History:
        return cls(tl, Scenario.from_dict(tl.scenario), Executions.of(tl.executions))


@dataclass(slots=True)
class Section:
    """One checker's part of the result: the counts it sets, the evidence problems it found, the ids it
    names by class, what later checkers or the result need from it (`facts`), and the result's records
    it settles (`fields`: a network fault's liveness). `error`: the checker raised; its verdict is unknown."""

    name: str
    counts: dict[str, Any] = field(default_factory=dict)  # Counts' fields, by name
    problems: list[Problem] = field(default_factory=list)
    jobs: dict[str, list[str]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)  # the result's (DesignRun's) fields it settles
    error: str | None = None

    @property
    def valid(self) -> bool | None:
        """True: nothing wrong found; False: a problem; None: unknown (it raised)."""
        return None if self.error is not None else not self.problems


class Sections(dict[str, Section]):
    """The sections so far, by checker name; `fact` reads what an earlier one left for the rest."""

    def fact(self, checker: str, name: str) -> Any:
        section = self[checker]
        if section.error is not None:
            raise LookupError(f"checker {checker} has no {name}: it raised")
        return section.facts[name]


class Checker(Protocol):
    name: str

    def __call__(self, history: History, before: Sections) -> Section: ...


@dataclass(frozen=True, slots=True)
class FunctionChecker:
    """A checker made of a function of the history and the sections before it."""

    name: str
    fn: Callable[[History, Sections], Section]

    def __call__(self, history: History, before: Sections) -> Section:
        return self.fn(history, before)


def checker(name: str) -> Callable[[Callable[[History, Sections], Section]], FunctionChecker]:
    def wrap(fn: Callable[[History, Sections], Section]) -> FunctionChecker:
        return FunctionChecker(name, fn)

    return wrap


def check_safe(c: Checker, history: History, before: Sections) -> Section:
    """`c`'s section; if it raises, a section of unknown verdict carrying the error and where it was."""
    try:
        return c(history, before)
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno} in {frame.name}"
        return Section(c.name, error=f"{type(exc).__name__}: {exc} (at {where})")


def compose(checkers: Sequence[Checker], history: History) -> Sections:
    """Every checker's section, in order; each sees the sections before it."""
    sections = Sections()
    for c in checkers:
        sections[c.name] = check_safe(c, history, sections)
    return sections


def merged_counts(sections: Sections) -> Counts:
    """One Counts from every section's counts (a checker sets only its own)."""
    counts = Counts()
    for section in sections.values():
        for name, value in section.counts.items():
            setattr(counts, name, value)
    return counts


def crashed(sections: Sections) -> list[Section]:
    return [s for s in sections.values() if s.error is not None]
