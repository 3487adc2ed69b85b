"""The scale table (issue 16): one crash run per job count (reliable-batch, 0 ms jobs, 8 workers, 5
mid-job SIGKILLs, on a private server), and what crashbench's own process costs at that size:

    peak RSS      of the crashbench process itself (psutil, sampled every 20 ms; workers not included)
    per job       bytes of peak RSS per job above the smallest run's
    restart       median SIGKILL -> replacement READY (the result's restart_ms_median)
    counting      the saved timeline -> every count again (crashbench recount's work), seconds
    wall          the whole command, seconds

    python bench/scale.py [N ...]      (default: 2000 100000 1000000)

Result files go to results/scale/ (one per run, timelines beside them).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from crashbench.evidence import recount

OUT = Path("results/scale")
ARGS = ["run", "--design", "reliable-batch", "--job-ms", "0", "--workers", "8", "--kills", "5", "--plain"]


def measure(jobs: int) -> tuple[int, float | None, float, float, Path]:
    before = set(OUT.glob("*.json"))
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *ARGS, "--jobs", str(jobs), "--out", str(OUT)],
        stdout=subprocess.DEVNULL,
    )
    me, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, me.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"crashbench exited {proc.returncode} at {jobs} jobs")
    (path,) = set(OUT.glob("*.json")) - before
    result, timelines = recount.load(str(path))
    counted = time.monotonic()
    differences = recount.recount(result, timelines)
    counting = time.monotonic() - counted
    assert all(not r.differences for r in differences), f"{path}: the counts do not recount"
    return peak, result.runs[0].timings.restart_ms_median, counting, wall, path


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [2000, 100_000, 1_000_000]
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [(n, *measure(n)) for n in sizes]
    base_n, base_rss = rows[0][0], rows[0][1]
    print("| jobs | peak RSS | per job above the smallest run | restart (median) | counting | wall | result |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for n, peak, restart, counting, wall, path in rows:
        per_job = f"{(peak - base_rss) / (n - base_n):.0f} B" if n > base_n else "-"
        shown = f"{restart:.1f} ms" if restart is not None else "-"
        mb = peak / 2**20
        print(f"| {n:,} | {mb:.0f} MB | {per_job} | {shown} | {counting:.2f} s | {wall:.1f} s | {path.name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
