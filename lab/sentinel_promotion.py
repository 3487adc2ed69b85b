"""docs/findings/sentinel.md's table: the built-in designs under the sentinel faults (a private Sentinel
topology per run; the sentinels promote a replica on their own), one row per scenario and design over the
result's repeats: the promotion time (the broker fault record's back_at, from the kill, or for a lost quorum
from the killed sentinels' return), the slowest worker's first job after the promotion (the record's
slot_resume_ms: each worker found the new primary through the sentinels itself), and what the run lost,
refused and ran twice.

    python lab/sentinel_promotion.py results/readme/sentinel

With --split, the second table: the split brain (`sentinel-partition`, and `sentinel-partition-min-replicas`
with min-replicas-to-write 1), one row per scenario and design over the repeats: the promotion time, the
enqueues acknowledged in all and by the old primary after the cut, how many it refused, the acknowledged
enqueues lost (and their share of all the acknowledged ones, Jepsen's measure), the acks lost, and the
minority's workers the old primary still served as the partition healed.

    python lab/sentinel_promotion.py --split results/readme/sentinel-partition

With --libraries, the third table: each library adapter under sentinel-kill-libraries, its workers through the
library's own Sentinel configuration: the promotion time, the first and the slowest worker's first job after it
(a worker that exited on the lost connection is restarted by crashbench's supervisor, as a process manager
would: its restart is in the time), and what the run lost, stranded and ran twice, and its workers' exits.

    python lab/sentinel_promotion.py --libraries results/readme/sentinel-libraries
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from crashbench.model.results import DesignRun
from crashbench.report import store


def promotion_s(run: DesignRun) -> float:
    """From the kill (from the sentinels' return, when the quorum was lost) to the promotion."""
    bf = run.broker_fault
    if bf is None or bf.back_at is None:
        raise ValueError(f"{run.design} (seed {run.seed}): no promotion in its record")
    return bf.back_at - (bf.quorum_back_at if bf.quorum_back_at is not None else bf.at)


def slowest_resume_s(run: DesignRun) -> float | None:
    """The last worker slot's first handler start after the promotion (None: one never started one)."""
    times = run.broker_fault.slot_resume_ms if run.broker_fault is not None else []
    return max(times) / 1000 if times and None not in times else None  # type: ignore[type-var]


def _spread(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _median(values: list[float | None]) -> str:
    if any(v is None for v in values):
        return "never (a worker)"
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f} s ({min(known):.2f}-{max(known):.2f})"


def _by_scenario_and_design(directory: Path) -> dict[tuple[str, str], list[DesignRun]]:
    """The result files' runs, by (scenario, design), in the files' order; each must have its sentinel fault."""
    runs: dict[tuple[str, str], list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        for run in result.runs:
            assert run.broker_fault is not None, f"{path}: a run without a sentinel fault"
            runs.setdefault((str(result.scenario["name"]), run.design), []).append(run)
    return runs


def table(directory: Path) -> str:
    runs = _by_scenario_and_design(directory)
    lines = [
        "| scenario | design | runs | promotion, median (min-max) | slowest worker back after it | lost | "
        "held at the kill, never done | enqueues refused | acks lost (ran again) | mid-job at the kill, ran again | "
        "stuck workers |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (scenario, design), rs in runs.items():
        c = [r.counts for r in rs]
        mid = f"{_spread([x.mid_job_at_fault for x in c])}, {_spread([x.mid_job_ran_again for x in c])}"
        lines.append(
            f"| [{scenario}](../../scenarios/{scenario}.toml) | `{design}` | {len(rs)} | "
            f"{_median([promotion_s(r) for r in rs])} | "
            f"{_median([slowest_resume_s(r) for r in rs])} | {_spread([x.lost for x in c])} | "
            f"{_spread([x.held_at_fault for x in c])} | {_spread([x.indeterminate for x in c])} | "
            f"{_spread([x.acks_lost for x in c])} | {mid} | {_spread([x.stuck_workers for x in c])} |"
        )
    return "\n".join(lines)


def split_table(directory: Path) -> str:
    runs = _by_scenario_and_design(directory)
    lines = [
        "| scenario | design | runs | promotion, median (min-max) | acknowledged | ... by the old primary after "
        "the cut | refused by it | lost | lost of acknowledged | acks lost (ran again) | workers on old primary |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (scenario, design), rs in sorted(runs.items()):
        times = [promotion_s(r) for r in rs]
        acked = [r.counts.enqueued - r.counts.indeterminate for r in rs]
        share = [round(100 * r.counts.lost / a) for r, a in zip(rs, acked, strict=True)]
        promotion = f"{statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f})"
        lines.append(
            f"| `{scenario}` | `{design}` | {len(rs)} | {promotion} | "
            f"{_spread(acked)} | {_spread([r.counts.acked_on_old_primary for r in rs])} | "
            f"{_spread([r.counts.refused_on_old_primary for r in rs])} | {_spread([r.counts.lost for r in rs])} | "
            f"{_spread(share)}% | {_spread([r.counts.acks_lost for r in rs])} | "
            f"{_spread([r.counts.workers_on_old_primary for r in rs])} |"
        )
    return "\n".join(lines)


def first_resume_s(run: DesignRun) -> float | None:
    times = [ms for ms in run.broker_fault.slot_resume_ms if ms is not None] if run.broker_fault is not None else []
    return min(times) / 1000 if times else None


def library_table(directory: Path) -> str:
    runs = {design: rs for (_, design), rs in _by_scenario_and_design(directory).items()}  # one scenario
    lines = [
        "| design | runs | promotion, median (min-max) | first worker back after it | slowest worker back | lost | "
        "stranded (held at the kill, never done) | ran twice (acks lost) | worker exits | stuck workers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for design, rs in runs.items():
        c = [r.counts for r in rs]
        lines.append(
            f"| `{design}` | {len(rs)} | {_median([promotion_s(r) for r in rs])} | "
            f"{_median([first_resume_s(r) for r in rs])} | {_median([slowest_resume_s(r) for r in rs])} | "
            f"{_spread([x.lost for x in c])} | {_spread([x.stranded for x in c])} "
            f"({_spread([x.held_at_fault for x in c])}) | {_spread([x.duplicated for x in c])} "
            f"({_spread([x.acks_lost for x in c])}) | {_spread([len(r.worker_exits) for r in rs])} | "
            f"{_spread([x.stuck_workers for x in c])} |"
        )
    return "\n".join(lines)


MODES = {"--split": split_table, "--libraries": library_table}

if __name__ == "__main__":
    mode = MODES.get(sys.argv[1]) if len(sys.argv) > 1 else None
    args = sys.argv[2:] if mode else sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print((mode or table)(Path(args[0])))
