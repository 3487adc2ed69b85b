"""The restart time of a worker over SSH against a local one: the same crash run (naive, 6 SIGKILLs of
workers inside jobs) with its four slots on this machine, on two namespace hosts, and on two hosts over SSH
(tests/sshrig.py: Debian's OpenSSH server in network namespaces, the code path a real host takes), each
`--repeat` times. Prints the medians of the runs' own figures (kill -> replacement READY; spawn -> READY)
and writes them, with every run's, to OUT (a JSON file). Root only (namespaces).

    python lab/ssh_restart.py results/readme/ssh/restart.json --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.sshrig

from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from tests import sshrig

SLOTS = [[0, 1], [2, 3]]


def scenario(layout: dict | None, seed: int) -> Scenario:
    sc = Scenario.of(name="restart", jobs=300, job_ms=50, workers=4, kills=6, seed=seed, drain_timeout=30)
    return sc.replace(schedule=(layout,)) if layout else sc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if (reason := sshrig.unavailable()) is not None:
        print(f"skipped: {reason}")
        return 0
    runs: dict[str, list[dict]] = {"local": [], "namespace hosts": [], "ssh hosts": []}
    with tempfile.TemporaryDirectory() as d, sshrig.rig(2, Path(d)) as rig:
        layouts = {"local": None, "namespace hosts": {"kind": "hosts", "slots": SLOTS},
                   "ssh hosts": {"kind": "hosts", "slots": SLOTS, **rig.settings()}}  # fmt: skip
        for seed in range(a.repeat):
            for where, layout in layouts.items():
                (run,) = run_designs(scenario(layout, seed), ["naive"], Options()).runs
                t = run.timings
                runs[where].append({"seed": seed, "restart_ms_median": t.restart_ms_median,
                                    "startup_ms_median": t.startup_ms_median, "kills": len(run.kills),
                                    "done": run.counts.done, "lost": run.counts.lost})  # fmt: skip
    summary = {
        where: {k: round(statistics.median(r[k] for r in rs if r[k] is not None), 1)
                for k in ("restart_ms_median", "startup_ms_median")}
        for where, rs in runs.items()
    }  # fmt: skip
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    base = summary["local"]["restart_ms_median"]
    print("| workers | restart (kill -> READY), median | start (spawn -> READY), median | vs local |")
    print("| --- | ---: | ---: | ---: |")
    for where, s in summary.items():
        print(f"| {where} | {s['restart_ms_median']:.0f} ms | {s['startup_ms_median']:.0f} ms "
              f"| {s['restart_ms_median'] / base:.1f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
