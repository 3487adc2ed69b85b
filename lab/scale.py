"""The scale table (issue 16): one crash run per job count (lab/scale.toml: reliable-batch, 0 ms jobs,
8 workers, 5 mid-job SIGKILLs from the start, 9 idle-worker SIGKILLs once the queue has drained, on a
private server), and what crashbench's own process costs at that size:

    peak RSS      of the crashbench process itself (psutil, sampled every 20 ms; workers not included)
    per job       bytes of peak RSS per job above the smallest run's
    restart       median SIGKILL -> replacement READY of the kills from the start: at 1M jobs and more
                  they meet 8 busy workers on the machine, at fewer a queue that has drained already
    replacement   median spawn -> READY of those replacements: the restart without the runner's part
    drained       median SIGKILL -> replacement READY of the kills after the drain (after = "drained"):
                  every job count at the same load, its whole job list and executions in memory
                  (none, "-", if the run's drain gave up: they are not made then)
    counting      the saved timeline -> every count again (crashbench recount's work), seconds
    wall          the whole command, seconds
    counts        done / lost / duplicated / interrupted, and the evidence checks' problems (0: proven)

    python lab/scale.py [--out DIR] [--repeat R] [--add] [N ...]   measure (default: 2000 100000
                      1000000, once each), save DIR/scale.json (--add: beside the rows already there)

    python lab/scale.py --table DIR             the table of docs/findings/benchmarks.md from DIR/scale.json,
                                                  measuring nothing

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from crashbench.model.faults import SignalRecord
from crashbench.model.timeline import Timeline
from crashbench.report import recount

RUNS = Path("results/scale")
SCENARIO = Path(__file__).with_name("scale.toml")
ARGS = ["run", "--scenario", "lab/scale.toml", "--design", "reliable-batch", "--kills", "5", "--plain"]


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
    # The same two of the kills made once the queue had drained (rows measured before them: None)
    drained_restart_ms: float | None = None
    drained_start_ms: float | None = None


def measure(jobs: int) -> Row:
    before = set(RUNS.glob("*.json"))
    started = time.monotonic()
    args = [str(SCENARIO) if a == "lab/scale.toml" else a for a in ARGS]  # from any directory
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *args, "--jobs", str(jobs), "--out", str(RUNS)],
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
    run, tl = result.runs[0], timelines[0]
    c = run.counts
    drained = {f.index for f in tl.planned if f.after == "drained"}
    restart, start = restarts(tl, lambda k: k.index not in drained)
    drained_restart, drained_start = restarts(tl, lambda k: k.index in drained)
    return Row(
        jobs, peak, restart, round(counting, 3), round(wall, 2), c.done, c.lost, c.duplicated, c.interrupted,
        len(run.problems), path.name, start, drained_restart, drained_start,
    )  # fmt: skip


def restarts(tl: Timeline, which: Callable[[SignalRecord], bool]) -> tuple[float | None, float | None]:
    """Of these kills: the median SIGKILL -> replacement READY (as a result's restart_ms_median counts
    it), and the median spawn -> READY of the replacements, the restart without the runner's own part
    (delivering the signal, handing the slot over), in ms."""
    spawned = {s.worker: s.t for s in tl.spawns}
    kills = [k for k in tl.signals if which(k) and k.replacement in tl.ready]
    restart = [tl.ready[k.replacement] - k.at for k in kills]
    start = [tl.ready[k.replacement] - spawned[k.replacement] for k in kills]
    return _median_ms(restart), _median_ms(start)


def _median_ms(seconds: list[float]) -> float | None:
    return round(statistics.median(seconds) * 1000, 3) if seconds else None


def _median_of(values: list[float | None], unit: str) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.median(present):.1f} {unit}" if present else "-"


def table(rows: list[Row]) -> list[str]:
    """One line per job count: the median of its runs' figures; done is the fewest any run had, lost
    and problems the most (a run that lost or mis-counted anything shows)."""
    sizes = sorted({r.jobs for r in rows})
    runs = {n: [r for r in rows if r.jobs == n] for n in sizes}
    base = statistics.median([r.peak_rss for r in runs[sizes[0]]])
    out = [
        "| jobs | runs | peak RSS | per job above the smallest run | restart (median) | replacement start "
        "| restart, queue drained | counting | wall | done | lost | problems |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in sizes:
        rs = runs[n]
        rss = statistics.median([r.peak_rss for r in rs])
        per_job = f"{(rss - base) / (n - sizes[0]):.0f} B" if n > sizes[0] else "-"
        restart, start = _median_of([r.restart_ms for r in rs], "ms"), _median_of([r.start_ms for r in rs], "ms")
        drained = _median_of([r.drained_restart_ms for r in rs], "ms")
        counting, wall = statistics.median([r.counting_s for r in rs]), statistics.median([r.wall_s for r in rs])
        out.append(
            f"| {n:,} | {len(rs)} | {rss / 2**20:.0f} MB | {per_job} | {restart} | {start} | {drained} "
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
