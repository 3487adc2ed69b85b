"""The libraries under the graceful (SIGTERM), pause (SIGSTOP), broker-kill (each persistence mode),
failover and mixed scenarios (docs/findings/library-scenarios.md): one row per scenario and design from
the result files `make library-scenarios` writes, each figure over the seeds (the value, or min-max where
they differ).

    python lab/library_scenarios.py run OUT --worker-python PATH [--lanes 2] [--only SCENARIO,...] [--designs D,...]
    python lab/library_scenarios.py OUT      (both tables: the worker signals', the server faults')

`run` runs every library design of each scenario (its [run] designs, less the built-in ones), 2 seeds,
a 20 s window, one `crashbench run` per scenario and design (OUT/<scenario>--<design>.json), `lanes` at
a time (each run has its own servers; most of a run is waiting); arq and saq under PATH.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crashbench import scenario
from crashbench.model.results import DesignRun
from crashbench.report import store

COUNTS = ("done", "lost", "stranded", "failed", "duplicated", "interrupted", "redelivered")
SCENARIOS = ("graceful", "pause", "broker-kill-none", "broker-kill-rdb", "broker-kill-aof-everysec",
             "broker-kill-aof-always", "broker-failover", "mixed")  # fmt: skip
BUILTIN = ("naive", "reliable", "stream")


def run(out: Path, worker_python: str, lanes: int, only: list[str], designs: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    todo = [
        (name, design)
        for name in SCENARIOS
        if not only or name in only
        for design in scenario.load(name).run.designs
        if design not in BUILTIN and (not designs or design in designs)
    ]

    def one(job: tuple[str, str]) -> None:
        name, design = job
        cmd = ["crashbench", "run", "-s", name, "--design", design, "--drain-timeout", "20", "--repeat", "2",
               "--plain", "--worker-python", f"arq={worker_python}", "--worker-python", f"saq={worker_python}",
               "--out", str(out / f"{name}--{design.replace(':', '_')}.json")]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(f"{name} {design}: exit {done.returncode}", flush=True)
        if done.returncode not in (0, 1):  # 1: an expectation failed; the result is written all the same
            sys.stderr.write(done.stderr[-2000:])

    with ThreadPoolExecutor(lanes) as pool:
        list(pool.map(one, todo))


def _spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


# Two tables: the worker-signal scenarios, and the server's faults, each with the counts that tell them apart.
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "signals": (SCENARIOS[:2], (*COUNTS, "kills_mid_job")),
    "broker": (SCENARIOS[2:], ("done", "lost", "stranded", "duplicated", "redelivered", "held_at_fault",
                               "acked_during_lag", "acks_lost", "indeterminate", "worker_crashes", "kills_mid_job")),
}  # fmt: skip


def table(directory: Path, which: str) -> str:
    names, counts = TABLES[which]
    rows: dict[tuple[int, str], list[DesignRun]] = {}
    for path in sorted(directory.glob("*.json")):
        result = store.load(str(path))
        if (name := str(result.scenario["name"])) in names:
            for run in result.runs:
                rows.setdefault((names.index(name), run.design), []).append(run)
    heads = [c.replace("_", " ").replace("kills mid job", "kills mid-job") for c in counts]
    lines = ["| scenario | design | runs | " + " | ".join(heads) + " |", "|---|---|---:|" + "---:|" * len(counts)]
    for (index, design), runs in sorted(rows.items()):
        cells = " | ".join(_spread([getattr(r.counts, c) for r in runs]) for c in counts)
        lines.append(f"| {names[index]} | `{design}` | {len(runs)} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "run" and "--worker-python" in argv:
        python = argv[argv.index("--worker-python") + 1]
        lanes = int(argv[argv.index("--lanes") + 1]) if "--lanes" in argv else 2
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else []
        designs = argv[argv.index("--designs") + 1].split(",") if "--designs" in argv else []
        run(Path(argv[1]), python, lanes, only, designs)
        return 0
    if len(argv) == 1:
        print("\n\n".join(table(Path(argv[0]), which) for which in TABLES))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
