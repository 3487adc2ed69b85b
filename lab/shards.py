"""A crashbench command's runs split into N shards that run side by side on this machine (`--shard K/N`,
one process each, each on its own embedded server), then merged into the unsharded run's result
(`crashbench merge`): what `make libraries` does, where most of the hour is spent waiting out library
timers, which overlap. Prints each shard's wall time and the whole's.

    python lab/shards.py N SHARD_DIR OUT -- compare --designs rq,huey --repeat 2 --plain

SHARD_DIR is emptied of earlier shard results first; each shard's output goes to SHARD_DIR/shard-K.log
(printed when it ends). A shard that ends with an error (exit 2, 3, 4, 5 or 130: not 1, a threshold
violated) stops the others and this script with its exit code; so does Ctrl-C or SIGTERM. No shard
process outlives the script.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def main() -> None:
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
