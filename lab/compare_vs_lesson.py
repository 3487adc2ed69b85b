"""`make bench`: how long `crashbench compare` takes on the default scenario, next to the lesson's own
crash test (lab/lesson, its two designs), on the same machine, in alternation.

Prints, as medians of --repeat runs: each design's wall time as a ratio to the ideal (jobs x job time /
workers), worker start-up (spawn -> READY) and restart (kill -> replacement READY), the whole
compare's wall time, the lesson's wall time, and compare / lesson.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crashbench.control.server import EmbeddedServer, find_server_binary

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    cp = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if cp.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({cp.returncode}):\n{cp.stderr}")
    return elapsed, cp.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    crashbench = [sys.executable, "-m", "crashbench", "compare", "--json"]
    per_design: dict[str, dict[str, list[float]]] = {}
    compare_walls, lesson_walls = [], []
    lesson_server = EmbeddedServer(find_server_binary())
    lesson_server.start()
    try:
        with tempfile.TemporaryDirectory() as out:
            for i in range(args.repeat):
                wall, stdout = timed([*crashbench, "--out", out], ROOT)
                compare_walls.append(wall)
                for run in json.loads(stdout)["runs"]:
                    d = per_design.setdefault(run["design"], {"ratio": [], "startup": [], "restart": []})
                    d["ratio"].append(run["timings"]["ratio_to_ideal"])
                    d["startup"].append(run["timings"]["startup_ms_median"])
                    d["restart"].append(run["timings"]["restart_ms_median"] or 0.0)
                port = {"LESSON_REDIS_PORT": str(lesson_server.port)}
                wall, _ = timed([sys.executable, "crash_test.py"], ROOT / "lab" / "lesson", port)
                lesson_walls.append(wall)
                print(f"round {i + 1}/{args.repeat}: compare {compare_walls[-1]:.2f} s, lesson {wall:.2f} s")
    finally:
        lesson_server.stop()
    med = statistics.median
    print(f"\nmedian of {args.repeat} runs, default scenario (ideal 5.00 s per design)")
    print(f"{'design':<10} {'wall/ideal':>10} {'start-up ms':>12} {'restart ms':>11}")
    for name, d in per_design.items():
        print(f"{name:<10} {med(d['ratio']):>9.2f}x {med(d['startup']):>12.1f} {med(d['restart']):>11.1f}")
    c, lesson = med(compare_walls), med(lesson_walls)
    print(f"\ncrashbench compare (3 designs): {c:.2f} s")
    print(f"lesson crash test (2 designs):  {lesson:.2f} s")
    print(f"compare / lesson:               {c / lesson:.2f}")


if __name__ == "__main__":
    main()
