"""What each job does, decided from its id and the seed alone, so every worker, every design and
every replay agree: how long its handler runs, and whether (and on which attempts) it fails.

    fixed      every handler runs job_ms
    uniform    uniform in [0.5, 1.5] x job_ms
    longtail   Pareto (alpha 1.16, the 80/20 tail) with median job_ms, capped at job_ms_max
    poison     a job with probability poison_rate: its handler raises on every attempt
    transient  a job with probability transient_rate: raises on its first transient_failures attempts
    crash      a job with probability crash_rate: its handler kills its own process on every attempt
               (crash_how: sigkill, exit or memory; crashbench.designs.handler.crash), a crash loop
    gil        with job_work = "gil", a handler spends its duration in one call that never releases the
               GIL (`spend`): a CPU-bound job that starves the process's other threads (a heartbeat's)
    delayed    a job with probability delay_share, when delay_s > 0: due delay_s after its enqueue

Each of poison, transient and crash is drawn from a uniform of its own (seed, job, purpose), so the
rates need not add up to 1; a crash job is never poison nor transient (it dies before it could raise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from crashbench.jobids import JobIds, plain, wire
from crashbench.model.queue import Job

JOB_WORK = ("sleep", "gil")
DISTRIBUTIONS = ("fixed", "uniform", "longtail")
# How a crash job kills the process that runs it (crashbench.designs.handler.crash)
CRASH_HOW = ("sigkill", "exit", "memory")
PARETO_ALPHA = 1.16


def job_ids(n: int) -> JobIds:
    """The ids of a run's jobs, in enqueue order: a range of codes, read as strings when asked for."""
    return JobIds(range(n))


def jobs_for(ids: Sequence[str], token: str = "", workload: Workload | None = None, pad: int = 0) -> list[Job]:
    """The run's jobs for these ids, each id with the run's token before it (crashbench.jobids); the
    payload carries the job's number, padded to `pad` bytes at least (workload.payload_bytes); each
    delayed job (`workload`) its delay."""

    def payload(j: str) -> str:
        return f'{{"n": {int(j)}, "pad": "{"x" * max(0, pad - 20)}"}}' if pad else f'{{"n": {int(j)}}}'

    if workload is None or not workload.delay_s:
        return [Job(wire(j, token), payload(j)) for j in ids]
    return [Job(wire(j, token), payload(j), delay_s=workload.delay_of(j)) for j in ids]


@dataclass(frozen=True, slots=True)
class Workload:
    job_ms: float = 10.0
    job_dist: str = "fixed"
    job_ms_max: float = 0.0  # longtail cap; 0 means 100 x job_ms
    poison_rate: float = 0.0
    transient_rate: float = 0.0
    transient_failures: int = 1
    crash_rate: float = 0.0
    crash_how: str = "sigkill"
    job_work: str = "sleep"
    delay_s: float = 0.0
    delay_share: float = 1.0
    seed: int = 1

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        return cls(**json.loads(text))

    def _uniform(self, job: str, purpose: str) -> float:
        """A number in [0, 1) fixed by (seed, job, purpose)."""
        # The plain id: a run's token (crashbench.jobids) must not change what its jobs do.
        digest = hashlib.blake2b(f"{self.seed}:{purpose}:{plain(job)}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def duration_s(self, job: str) -> float:
        if self.job_dist == "fixed":
            ms = self.job_ms
        elif self.job_dist == "uniform":
            ms = self.job_ms * (0.5 + self._uniform(job, "duration"))
        else:
            u = self._uniform(job, "duration")
            ms = self.job_ms * ((1 - u) ** (-1 / PARETO_ALPHA)) / 2 ** (1 / PARETO_ALPHA)
            ms = min(ms, self.job_ms_max or 100 * self.job_ms)
        return ms / 1000

    def crashes(self, job: str) -> bool:
        """Does the handler of `job` kill its own process, on every attempt (a crash loop)?"""
        return self.crash_rate > 0 and self._uniform(job, "crash") < self.crash_rate

    def delay_of(self, job: str) -> float:
        """Seconds after its enqueue `job` is due: delay_s for a delayed job (a share delay_share of
        them, fixed by seed and id), else 0."""
        if not self.delay_s:
            return 0.0
        if self.delay_share >= 1 or self._uniform(job, "delay") < self.delay_share:
            return self.delay_s
        return 0.0

    def is_poison(self, job: str) -> bool:
        return self.poison_rate > 0 and self._uniform(job, "poison") < self.poison_rate and not self.crashes(job)

    def is_transient(self, job: str) -> bool:
        return (
            self.transient_rate > 0
            and not self.is_poison(job)
            and not self.crashes(job)
            and self._uniform(job, "transient") < self.transient_rate
        )

    def fails(self, job: str, attempt: int) -> bool:
        """Does the handler of `job` raise on its `attempt`-th attempt (1 = first)?"""
        # Called for every job in the worker's hot path: no hashing when nothing can fail.
        if not (self.poison_rate or self.transient_rate):
            return False
        return self.is_poison(job) or (self.is_transient(job) and attempt <= self.transient_failures)


_sum_rate: float | None = None  # range items sum() adds per second in this process (`spend` calibrates it once)


def spend(seconds: float, work: str = "sleep") -> None:
    """Spend a handler's duration: asleep (the GIL released), or ("gil") in one sum() over a range, a C
    loop that never releases the GIL, sized by a calibration of this process's speed."""
    global _sum_rate
    if work != "gil":
        time.sleep(seconds)
        return
    if _sum_rate is None:
        n, t = 200_000, time.perf_counter()
        sum(range(n))
        _sum_rate = n / max(time.perf_counter() - t, 1e-6)
    sum(range(int(_sum_rate * seconds)))
