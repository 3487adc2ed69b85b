"""The fault schedule: which worker slot gets the fault, and when, decided from the seed before
anything runs, so every design of a compare (and every replay) gets the same one."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crashbench.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PlannedKill:
    index: int
    at: float  # seconds after the workers start
    slot: int


def plan_kills(scenario: Scenario) -> list[PlannedKill]:
    """The fault schedule: the same seed gives the same victims at the same times, for every design."""
    rng = random.Random(scenario.seed)
    return [
        PlannedKill(i, round((i + 1) * scenario.interval, 6), rng.randrange(scenario.workers))
        for i in range(scenario.kills)
    ]
