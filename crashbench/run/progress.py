"""What a crash run reports while it runs (crashbench.run.runner's progress callback), for a display."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Progress:
    design: str
    phase: str  # "starting" | "faults" | "draining" | "counting"
    enqueued: int
    done: int
    kills: int
    kills_total: int
    alive: int
    elapsed: float
