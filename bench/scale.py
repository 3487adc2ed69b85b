"""The scale table (issue 16): one crash run per job count (reliable-batch, 0 ms jobs, 8 workers, 5
mid-job SIGKILLs, on a private server), and what crashbench's own process costs at that size:

    peak RSS      of the crashbench process itself (psutil, sampled every 20 ms; workers not included)
    per job       bytes of peak RSS per job above the smallest run's
    restart       median SIGKILL -> replacement READY (the result's restart_ms_median)
    replacement   median spawn -> READY of the replacements: the restart without the runner's part
    counting      the saved timeline -> every count again (crashbench recount's work), seconds
    wall          the whole command, seconds
    counts        done / lost / duplicated / interrupted, and the evidence checks' problems (0: proven)

    python bench/scale.py [--out DIR] [--repeat R] [--add] [N ...]   measure (default: 2000 100000
                      1000000, once each), save DIR/scale.json (--add: beside the rows already there)

    python bench/scale.py --table DIR             the README's table from DIR/scale.json, measuring nothing

Each run's result file goes to results/scale/ (with its timeline: 120 MB at 10M jobs, so not kept
in git); the figures go to DIR/scale.json (default results/readme/scale).
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from crashbench.evidence import recount
from crashbench.evidence.timeline import Timeline

RUNS = Path("results/scale")
ARGS = ["run", "--design", "reliable-batch", "--job-ms", "0", "--workers", "8", "--kills", "5", "--plain"]


@dataclass(frozen=True, slots=True)
class Row:
    jobs: int
    peak_rss: int
    restart_ms: float | None
    counting_s: float
    wall_s: float
    done: int
    lost: int
    duplicated: int
    interrupted: int
    problems: int
    result: str
    start_ms: float | None = None  # median spawn -> READY of the replacements alone (the runner's part left out)


def measure(jobs: int) -> Row:
    before = set(RUNS.glob("*.json"))
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *ARGS, "--jobs", str(jobs), "--out", str(RUNS)],
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
    (path,) = set(RUNS.glob("*.json")) - before
    result, timelines = recount.load(str(path))
    counted = time.monotonic()
    differences = recount.recount(result, timelines)
    counting = time.monotonic() - counted
    assert all(not r.differences for r in differences), f"{path}: the counts do not recount"
    run = result.runs[0]
    c = run.counts
    return Row(
        jobs, peak, run.timings.restart_ms_median, round(counting, 3), round(wall, 2), c.done, c.lost,
        c.duplicated, c.interrupted, len(run.problems), path.name, replacement_start(timelines[0]),
    )  # fmt: skip


def replacement_start(tl: Timeline) -> float | None:
    """Median spawn -> READY of the workers that replaced killed ones: the restart without the
    runner's own part (noticing the death, handing the slot over)."""
    spawned = {s.worker: s.t for s in tl.spawns}
    starts = [tl.ready[k.replacement] - spawned[k.replacement] for k in tl.kills if k.replacement in tl.ready]
    return round(statistics.median(starts) * 1000, 3) if starts else None


def table(rows: list[Row]) -> list[str]:
    """One line per job count: the median of its runs' figures; done is the fewest any run had, lost
    and problems the most (a run that lost or mis-counted anything shows)."""
    sizes = sorted({r.jobs for r in rows})
    runs = {n: [r for r in rows if r.jobs == n] for n in sizes}
    base = statistics.median([r.peak_rss for r in runs[sizes[0]]])
    out = [
        "| jobs | runs | peak RSS | per job above the smallest run | restart (median) | replacement start "
        "| counting | wall | done | lost | problems |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in sizes:
        rs = runs[n]
        rss = statistics.median([r.peak_rss for r in rs])
        per_job = f"{(rss - base) / (n - sizes[0]):.0f} B" if n > sizes[0] else "-"
        restarts = [r.restart_ms for r in rs if r.restart_ms is not None]
        restart = f"{statistics.median(restarts):.1f} ms" if restarts else "-"
        starts = [r.start_ms for r in rs if r.start_ms is not None]
        start = f"{statistics.median(starts):.1f} ms" if starts else "-"
        counting, wall = statistics.median([r.counting_s for r in rs]), statistics.median([r.wall_s for r in rs])
        out.append(
            f"| {n:,} | {len(rs)} | {rss / 2**20:.0f} MB | {per_job} | {restart} | {start} "
            f"| {counting:.2f} s | {wall:.1f} s "
            f"| {min(r.done for r in rs):,} | {max(r.lost for r in rs)} | {max(r.problems for r in rs)} |"
        )
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"]:
        saved = json.loads((Path(argv[1]) / "scale.json").read_text())
        print("\n".join(table([Row(**r) for r in saved["rows"]])))
        return 0
    out, repeat, add = Path("results/readme/scale"), 1, False
    while argv[:1] in (["--out"], ["--repeat"], ["--add"]):
        if argv[0] == "--add":
            add, argv = True, argv[1:]
            continue
        if argv[0] == "--out":
            out = Path(argv[1])
        else:
            repeat = int(argv[1])
        argv = argv[2:]
    sizes = [int(a) for a in argv] or [2000, 100_000, 1_000_000]
    RUNS.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    # Sizes in turn, `repeat` rounds: the machine's load drifts, and each size should meet all of it.
    rows = [measure(n) for _ in range(repeat) for n in sizes]
    if add:  # beside the rows saved before (a 10M run, once, after three rounds of the others)
        rows = [Row(**r) for r in json.loads((out / "scale.json").read_text())["rows"]] + rows
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    saved = {
        "schema": "crashbench.scale", "schema_version": 1, "date": time.strftime("%Y-%m-%d"), "commit": commit,
        "python": platform.python_version(), "cpus": psutil.cpu_count(), "args": ARGS,
        "rows": [asdict(r) for r in rows],
    }  # fmt: skip
    (out / "scale.json").write_text(json.dumps(saved, indent=1) + "\n")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
