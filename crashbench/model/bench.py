"""Typed results of `crashbench bench` (crashbench.bench), serialized to JSON with a schema version
and the environment, like a crash run's (crashbench.model.results)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crashbench.model.results import Environment, Stats, slug

BENCH_SCHEMA = "crashbench.bench"
BENCH_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class BenchSettings:
    designs: tuple[str, ...] = ("naive", "reliable", "stream")
    workers: tuple[int, ...] = (1, 2, 4, 8)
    jobs: int = 4000
    job_ms: float = 0.0
    repeat: int = 3
    latency_jobs: int = 500
    high_share: float = 0.1  # jobs marked "priority": "high" in their payload
    restarts: int = 5
    memory_jobs: int = 100_000  # backlog size the memory per 1M jobs is extrapolated from; 0 = skip
    batch_size: int = 10
    shards: int = 0  # the sharded design's shards (queue.shards); 0 = one per cluster primary, 1 on one server
    proxy: bool = False  # also the network fault proxy's cost with no toxic on (crashbench.bench.proxy)


@dataclass(slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    max_ms: float
    n: int


@dataclass(slots=True)
class Measurement:
    """One design x worker count x repeat."""

    design: str
    workers: int
    repeat: int
    jobs: int
    jobs_per_s: float
    bare_jobs_per_s: float
    enqueue_per_s: float
    enqueue_commands_per_job: float
    commands_per_job: float  # the workers' commands, all kinds, per job
    commands: dict[str, int]  # the workers' calls during the throughput phase, by command
    latency: dict[str, Latency]  # enqueue -> completion at half the throughput: "all", "high", "low" priority
    server_cpu: float | None  # cores used by the server during the throughput phase
    client_cpu: float  # cores used by the workers (their whole life: start-up included)
    server_peak_rss_mb: float | None


@dataclass(slots=True)
class Point:
    """A design at a worker count, over the repeats: median (min, max)."""

    design: str
    workers: int
    jobs_per_s: Stats
    bare_jobs_per_s: Stats
    overhead_ratio: float  # median over the repeats of (jobs/s under crashbench / jobs/s of the bare loop)
    enqueue_per_s: Stats
    commands_per_job: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_high_p50_ms: float | None
    latency_low_p50_ms: float | None
    server_cpu: float | None
    client_cpu: float
    server_peak_rss_mb: float | None


@dataclass(slots=True)
class Restart:
    design: str
    samples_ms: list[float]
    median_ms: float


@dataclass(slots=True)
class Memory:
    structure: str  # "list" | "stream"
    jobs: int
    bytes_per_job: float
    mb_per_million: float


@dataclass(slots=True)
class ProxyCost:
    """A design's jobs/s with its workers connected directly and through the network fault proxy with
    no toxic on, over the repeats; `ratio` is through / direct, of the medians."""

    design: str
    workers: int
    job_ms: float
    jobs: int
    direct: Stats
    through: Stats
    ratio: float
    direct_samples: list[float]
    through_samples: list[float]


@dataclass(slots=True)
class BenchResult:
    id: str
    created: str
    settings: BenchSettings
    measurements: list[Measurement]
    points: list[Point]
    restarts: list[Restart]
    memory: list[Memory]
    environment: Environment
    wall_s: float
    proxy: list[ProxyCost] = dataclasses.field(default_factory=list)  # with BenchSettings.proxy
    schema: str = BENCH_SCHEMA
    schema_version: int = BENCH_SCHEMA_VERSION

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        return json.dumps(
            {"schema": data.pop("schema"), "schema_version": data.pop("schema_version"), **data}, indent=2
        )

    def write(self, out: Path) -> Path:
        if out.suffix != ".json":
            out = out / f"{slug(self.id)}-bench.json"  # a slug, as a crash result's name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.to_json() + "\n")
        return out


def stats(values: Sequence[float]) -> Stats:
    return Stats(min(values), round(statistics.median(values), 4), max(values), len(values))


def summarize(measurements: Sequence[Measurement]) -> list[Point]:
    groups: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.design, m.workers), []).append(m)
    points = []
    for (design, workers), ms in groups.items():

        def med(get: Callable[[Measurement], float | None], ms: list[Measurement] = ms) -> float | None:
            values = [v for m in ms if (v := get(m)) is not None]
            return round(statistics.median(values), 3) if values else None

        harness, bare = stats([m.jobs_per_s for m in ms]), stats([m.bare_jobs_per_s for m in ms])
        points.append(
            Point(
                design,
                workers,
                harness,
                bare,
                round(statistics.median(m.jobs_per_s / m.bare_jobs_per_s for m in ms), 3),
                stats([m.enqueue_per_s for m in ms]),
                med(lambda m: m.commands_per_job) or 0.0,
                med(lambda m: m.latency["all"].p50_ms if "all" in m.latency else None),
                med(lambda m: m.latency["all"].p99_ms if "all" in m.latency else None),
                med(lambda m: m.latency["high"].p50_ms if "high" in m.latency else None),
                med(lambda m: m.latency["low"].p50_ms if "low" in m.latency else None),
                med(lambda m: m.server_cpu),
                med(lambda m: m.client_cpu) or 0.0,
                max((m.server_peak_rss_mb for m in ms if m.server_peak_rss_mb is not None), default=None),
            )
        )
    return points
