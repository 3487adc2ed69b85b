"""`crashbench bench`'s memory figure: what a backlog of queued jobs costs the server, as a list and
as a stream (MEMORY USAGE, scaled to 1M jobs). Apart from bench.py to keep that module short."""

from __future__ import annotations

import json
from collections.abc import Callable

from crashbench.control import connect
from crashbench.control.server import ServerInfo
from crashbench.model.bench import Memory


def memory(server: ServerInfo, jobs: int, tag: str, check: Callable[[], None] = lambda: None) -> list[Memory]:
    """MEMORY USAGE of a backlog of `jobs` jobs as a list (LPUSH) and as a stream (XADD), per job.
    `check` is called between batches: it raises to stop (crashbench bench's stop flag)."""
    client = connect.connect(server.url, decode_responses=True)  # one key: its primary, on a cluster
    prefix = f"crashbench:{tag}:memory:"
    out = []
    try:
        for structure in ("list", "stream"):
            key = prefix + structure
            pipe = client.pipeline(transaction=False)
            for i in range(jobs):
                payload = json.dumps({"n": i})
                if structure == "list":
                    pipe.lpush(key, f"{i:07d}|{payload}")
                else:
                    pipe.xadd(key, {"job": f"{i:07d}", "payload": payload})
                if i % 1000 == 999:
                    check()
                    pipe.execute()
            pipe.execute()
            used = int(client.memory_usage(key, samples=0) or 0)
            out.append(Memory(structure, jobs, round(used / jobs, 2), round(used / jobs * 1e6 / 2**20, 1)))
            client.delete(key)
    finally:
        client.close()
    return out
