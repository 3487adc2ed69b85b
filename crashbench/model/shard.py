"""Which shard of which plan a result holds (`--shard K/N` on compare, sweep and check), so that
`crashbench merge` can tell it has every shard of one plan exactly once (crashbench.run.shard splits a
plan and names it; crashbench.report.merge puts the shards together again). Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Shard:
    k: int  # this shard, 1..n
    n: int  # of how many
    # The whole plan's identity: a hash of what every shard of it shares (crashbench.run.shard.identity:
    # crashbench's version, the kind, the scenario's fingerprint and seed, the designs or sweep values,
    # the repeats, the command line's thresholds and the baseline)
    plan: str
    total: int  # runs in the whole plan: designs (or sweep values) x repeats
    runs: list[int] = field(default_factory=list)  # each run's place in the unsharded run's order, in order
    entries: list[list[str]] = field(default_factory=list)  # the plan's [design, variant] pairs, in order
    thresholds: list[str] = field(default_factory=list)  # the command line's, as written: the merge's too

    def labels(self) -> list[str]:
        """The designs and sweep values of the whole plan, which its thresholds may name."""
        return [name for design, variant in self.entries for name in (design, variant) if name]
