"""Every fault family (crashbench.faults.family), in the order their sections and drivers run. A new
family is one module and one line here."""

from __future__ import annotations

from crashbench.evidence import tally
from crashbench.evidence.checker import Checker
from crashbench.faults import clock, deploy, eviction, hosts, migrate, network, power, sentinel, servers, signals
from crashbench.faults.family import Entry, FaultFamily

FAMILIES: tuple[FaultFamily, ...] = (
    signals.FAMILY,
    network.FAMILY,
    servers.BROKER,
    servers.CLUSTER,
    deploy.FAMILY,
    migrate.FAMILY,
    eviction.FAMILY,
    sentinel.FAMILY,
    power.FAMILY,
    clock.FAMILY,
    hosts.FAMILY,
)


def owner(entry: Entry) -> FaultFamily | None:
    """The family whose kind the `[[faults]]` entry names (signal when it names none)."""
    return next((f for f in FAMILIES if f.owns(entry)), None)


def kinds() -> list[str]:
    return [k for f in FAMILIES for k in f.kinds]


def checkers() -> tuple[Checker, ...]:
    """The run's checkers: the core ones (crashbench.evidence.tally), then each family's, once each."""
    out = list(tally.CHECKERS)
    for family in FAMILIES:
        out += [c for c in family.checkers if not any(c is o for o in out)]
    return tuple(out)
