"""The saboteur table: what tests/designs_saboteur.py:SaboteurQueue plants, against what crashbench
reports, with and without kills, over several seeds (make saboteurs). Each run's result is saved in
the directory given as the first argument (default: results/). Exits 1 if any count differs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from designs_saboteur import PHANTOMS, planted  # noqa: E402

from crashbench.model.spec import Scenario  # noqa: E402
from crashbench.model.workload import job_ids  # noqa: E402
from crashbench.run.session import Options, run_designs  # noqa: E402

JOBS = 2000


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results"
    plant = planted(job_ids(JOBS))
    want = {
        "lost": len(plant["lost"]),
        "duplicated": len(plant["duplicated"]),
        "stranded": len(plant["parked"]) + len(plant["hidden"]),
        "dead_lettered": len(plant["dead_lettered"]),
        "unexpected": len(PHANTOMS),
    }
    columns = [*want, "kills_mid_job", "checks fired"]
    print(f"SaboteurQueue, {JOBS} jobs of 5 ms, 4 workers; planted: " + ", ".join(f"{k} {v}" for k, v in want.items()))
    print(f"{'kills':>5} {'seed':>4} " + " ".join(f"{c:>14}" for c in columns))
    bad = 0
    for kills in (0, 5):
        for seed in (1, 2, 3):
            sc = Scenario.of(name="saboteurs", jobs=JOBS, job_ms=5, workers=4, kills=kills, interval=0.2, seed=seed,
                          stale_after=0.3, recover_every=0.05, drain_timeout=15)  # fmt: skip
            result = run_designs(sc, ["designs_saboteur:SaboteurQueue"], Options())
            result.write(out)
            run = result.runs[0]
            if run.workdir:  # kept as the evidence of a wrong report; the problems are planted here
                shutil.rmtree(run.workdir)
            got = {k: getattr(run.counts, k) for k in want}
            bad += got != want
            fired = ",".join(sorted({p.check for p in run.problems}))
            cells = [*(str(v) for v in got.values()), str(run.counts.kills_mid_job), fired]
            print(f"{kills:>5} {seed:>4} " + " ".join(f"{c:>14}" for c in cells))
    print("every count as planted" if not bad else f"{bad} run(s) differ from what was planted")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
