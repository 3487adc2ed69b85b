"""A crashbench command's runs split into N shards that run side by side on this machine (`--shard K/N`,
one process each, each on its own embedded server), then merged into the unsharded run's result
(`crashbench merge`): what `make libraries` does, where most of the hour is spent waiting out library
timers, which overlap. Prints each shard's wall time and the whole's.

    python lab/shards.py N SHARD_DIR OUT -- compare --designs rq,huey --repeat 2 --plain

With --estimate, nothing runs: each shard's minutes of runs for each N, from the runs' wall times in
the result files of DIR (one design's runs with the newest file that has it), the plan being DESIGNS x
REPEAT as a compare of them runs it; dealt as --shard deals, and round robin in the unsharded order:

    python lab/shards.py --estimate results/readme/libraries rq,rq:reliable,... 2 2 3 4 5 6

SHARD_DIR is emptied of earlier shard results first; each shard's output goes to SHARD_DIR/shard-K.log
(printed when it ends). A shard that ends with an error (exit 2, 3, 4, 5 or 130: not 1, a threshold
violated) stops the others and this script with its exit code; so does Ctrl-C or SIGTERM. No shard
process outlives the script.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from crashbench.model.results import Result
from crashbench.run.shard import chosen

CRASHBENCH = str(Path(sys.executable).with_name("crashbench"))


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_shards(n: int, shard_dir: Path, command: list[str]) -> int:
    """Run the N shards side by side; the first error's exit code, else 0 (1 when one violated a threshold)."""
    if shard_dir.exists():
        shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True)
    procs: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
    code = 0
    try:
        for k in range(1, n + 1):
            log = (shard_dir / f"shard-{k}.log").open("wb")
            args = [CRASHBENCH, *command, "--shard", f"{k}/{n}", "--out", str(shard_dir)]
            procs[k] = (subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), time.monotonic())
            log.close()
        while procs:
            for k, (proc, started) in list(procs.items()):
                if proc.poll() is None:
                    continue
                del procs[k]
                took = time.monotonic() - started
                print(f"--- shard {k}/{n}: exit {proc.returncode}, {took:.0f} s ---", flush=True)
                print((shard_dir / f"shard-{k}.log").read_text(errors="replace"), flush=True)
                if proc.returncode not in (0, 1):
                    return proc.returncode
                code = code or proc.returncode
            time.sleep(0.5)
    finally:
        for proc, _ in procs.values():  # an error, Ctrl-C or SIGTERM: crashbench stops what it started
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait()
    return code


def estimate(directory: Path, designs: list[str], repeat: int, counts: list[int]) -> None:
    walls: dict[tuple[str, int], float] = {}
    for path in sorted(directory.glob("*.json")):  # ids start with the date: later files win
        runs = Result.from_dict(json.loads(path.read_text())).runs
        walls |= {(r.design, r.repeat): r.timings.wall_s for r in runs}
    plan = [walls[(d, r)] / 60 for r in range(repeat) for d in designs]  # the unsharded order
    print(f"{len(plan)} runs, {sum(plan):.1f} min one after another; the longest {max(plan):.1f} min")
    for n in counts:
        dealt = [sum(plan[i] for i in chosen(len(designs), repeat, k, n)) for k in range(1, n + 1)]
        robin = [sum(plan[i::n]) for i in range(n)]
        print(f"{n} shards: dealt {max(dealt):.1f} min ({' '.join(f'{m:.1f}' for m in dealt)}); "
              f"round robin {max(robin):.1f} min ({' '.join(f'{m:.1f}' for m in robin)})")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--estimate"] and len(sys.argv) >= 6:
        estimate(Path(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4]), [int(n) for n in sys.argv[5:]])
        return
    if "--" not in sys.argv or len(sys.argv) < 5:
        sys.exit(__doc__)
    n, shard_dir, out = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    command = sys.argv[sys.argv.index("--") + 1 :]
    signal.signal(signal.SIGTERM, _stop)
    started = time.monotonic()
    try:
        code = run_shards(n, shard_dir, command)
    except KeyboardInterrupt:
        sys.exit(130)
    shards_s = time.monotonic() - started
    if code not in (0, 1):
        sys.exit(code)
    merged = subprocess.run([CRASHBENCH, "merge", "--plain", "--out", str(out), str(shard_dir)], check=False)
    print(f"{n} shards side by side: {shards_s:.0f} s; with the merge {time.monotonic() - started:.0f} s")
    sys.exit(merged.returncode)


if __name__ == "__main__":
    main()
