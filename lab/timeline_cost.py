"""What the timeline costs: its size on disk and the wall time it adds to a crash run, for the default
scenario (reliable, 2,000 jobs) and a 100,000-job run (reliable-batch, 0 ms jobs, 8 workers, 5 kills).

"Without" turns off what only the timeline needs (the queue-depth samples, the file); what the counts
need (the ledgers, the final reading of Redis) is the same in both. Median of REPEATS runs each, on a
private embedded server; the ratio is the median with / the median without."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from crashbench import scenario
from crashbench.model import timeline
from crashbench.run.runner import CrashRun
from crashbench.run.session import Options, run_designs
from crashbench.scenario import with_overrides

REPEATS = 3
CASES = (
    ("default (reliable, 2,000 jobs)", "reliable", {}),
    ("100,000 jobs (reliable-batch, 0 ms, 8 workers)", "reliable-batch", {"jobs": 100_000, "job_ms": 0, "workers": 8}),
)


def one(design: str, overrides: dict[str, object], with_log: bool, out: Path) -> tuple[float, int, float]:
    """(wall seconds of the run and its save, timeline bytes, seconds writing the timeline)."""
    sc = with_overrides(scenario.load("default"), **overrides)
    CrashRun.DEPTH_EVERY = 0.25 if with_log else float("inf")
    started = time.perf_counter()
    result = run_designs(sc, [design], Options())
    if not with_log:
        for run in result.runs:
            run.timeline = None
    path = result.write(out)
    wall = time.perf_counter() - started
    log = path.with_name(path.stem + ".timeline.jsonl.gz")
    size = log.stat().st_size if log.exists() else 0
    write_s = 0.0
    if with_log:  # the file's own cost, written again alone
        t = time.perf_counter()
        timeline.write([r.timeline for r in result.runs if r.timeline], out / "again.jsonl.gz")
        write_s = time.perf_counter() - t
    return wall, size, write_s


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for label, design, overrides in CASES:
            walls: dict[bool, list[float]] = {True: [], False: []}
            sizes, writes = [], []
            for _ in range(REPEATS):
                for with_log in (False, True):
                    wall, size, write_s = one(design, overrides, with_log, out)
                    walls[with_log].append(wall)
                    if with_log:
                        sizes.append(size)
                        writes.append(write_s)
            on, off = statistics.median(walls[True]), statistics.median(walls[False])
            print(
                f"{label}: timeline {statistics.median(sizes) / 1e6:.2f} MB gzipped, written in "
                f"{statistics.median(writes):.3f} s; wall {off:.2f} s without, {on:.2f} s with "
                f"(x{on / off:.3f}, median of {REPEATS})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
