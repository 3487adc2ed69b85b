"""How fast `crashbench bench` stops on Ctrl-C or SIGTERM: the default bench, interrupted at
seeded moments spread over its phases (throughput, latency, restarts, memory), timed from the signal
to its exit; median and max per signal. The goal is under a second; every interruption must exit 130
and leave none of its processes behind.

    make bench-interrupt            # 8 interruptions per signal
    python lab/interrupt.py 3     # 3 per signal
"""

from __future__ import annotations

import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent / "crashbench"
SPAN = (0.5, 40.0)  # the default bench takes about 80 s here: the moments cover its first half and more


def once(sig: signal.Signals, at: float, out: str) -> float | None:
    """Seconds from the signal to the exit, or None when the bench ended before `at`."""
    proc = subprocess.Popen(
        [str(BIN), "bench", "--out", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    family: set[psutil.Process] = set()
    deadline = time.monotonic() + at
    while time.monotonic() < deadline and proc.poll() is None:
        family |= set(psutil.Process(proc.pid).children(recursive=True))
        time.sleep(0.05)
    if proc.poll() is not None:
        return None
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate()
    took = time.monotonic() - sent
    if proc.returncode != 130:
        raise SystemExit(f"exit {proc.returncode} after {sig.name} (expected 130): {err.strip()[-200:]}")
    _, alive = psutil.wait_procs(list(family), timeout=5)
    if any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in alive):
        raise SystemExit(f"{sig.name} at {at:.1f} s left processes behind: {alive}")
    return took


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as out:
        for sig in (signal.SIGINT, signal.SIGTERM):
            took = [t for t in (once(sig, rng.uniform(*SPAN), out) for _ in range(n)) if t is not None]
            print(
                f"{sig.name}: {len(took)} interruptions, "
                f"stop median {statistics.median(took):.2f} s, max {max(took):.2f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
