"""The fault schedule: which worker slot gets the fault, and when, decided from the seed before
anything runs, so every design of a compare (and every replay) gets the same one."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from crashbench.records import PlannedKill as PlannedKill  # re-exported

if TYPE_CHECKING:
    from crashbench.scenario import Scenario


def plan_kills(scenario: Scenario) -> list[PlannedKill]:
    """The fault schedule: the same seed gives the same victims at the same times, for every design."""
    rng = random.Random(scenario.seed)
    return [
        PlannedKill(i, round((i + 1) * scenario.interval, 6), rng.randrange(scenario.workers))
        for i in range(scenario.kills)
    ]
