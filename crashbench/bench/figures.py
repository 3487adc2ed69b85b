"""`crashbench bench`'s figures of the server and the processes: commands by kind (INFO commandstats,
over every primary of a cluster), CPU, quantiles. Apart from bench/__init__.py to keep that module short."""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Sequence

import psutil
import redis


def quantile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def commandstats(nodes: Sequence[redis.Redis]) -> dict[str, int]:
    """Calls by command, summed over the server's primaries (the one server, or a cluster's)."""
    calls: Counter[str] = Counter()
    for node in nodes:
        calls.update({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in node.info("commandstats").items()})
    return dict(calls)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    # INFO itself is ours, not the design's.
    return {k: n for k, v in after.items() if k != "info" and (n := v - before.get(k, 0)) > 0}


def cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
