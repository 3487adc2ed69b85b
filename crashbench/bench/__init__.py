"""`crashbench bench`: what each design costs when nothing fails — jobs/s, enqueue rate, latency,
Redis commands per job, CPU on both sides, server memory — and what the harness itself costs.

One measurement (design x worker count x repeat), on the session's server, under its own prefix:
1. enqueue N jobs (timed: the enqueue rate; INFO commandstats before and after: enqueue commands);
2. throughput: start the workers (crashbench's worker loop with its ledger), let them all go at
   once when every one is READY, and wait, on the ledger alone so the harness sends the server
   nothing, until every job completed; jobs/s = N / (go -> last completion); commands per job from
   INFO commandstats once the workers stopped (commands run inside scripts count too); server CPU
   from its process, the workers' from their rusage once reaped; the server's peak RSS sampled;
3. latency: with fresh workers, enqueue M more jobs one by one at half the measured throughput
   (open loop), latency = a job's ledger end - its enqueue, p50 / p99, per priority (a share of the
   jobs carries "priority": "high", which only the priority design acts on);
4. bare loop: the same N jobs again, run by workers that only fetch and ack (worker.run_bare): no
   ledger, no handler; jobs/s the same way. harness / bare is the overhead ratio.
Restart (SIGKILL an idle worker -> its replacement READY, as in every crash run) is measured per design,
and the memory of 1M queued jobs once, for a list and a stream backlog (the guide's step 4). With
`proxy`, the network fault proxy's cost with no toxic on too (crashbench.bench.proxy).
On a cluster (`--cluster N` or a cluster's URL) the same, with the commands summed over its primaries;
the server's CPU and memory are one process's figures, left out there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import redis

from crashbench.bench import proxy
from crashbench.bench.figures import children_cpu, commandstats, cpu, delta, quantile
from crashbench.bench.memory import memory
from crashbench.control import connect, workdirs
from crashbench.control.provision import open_server
from crashbench.control.server import ServerInfo, cleanup_keys
from crashbench.control.stopflag import StopFlag
from crashbench.control.supervisor import WorkerProcess
from crashbench.designs import Design, load_design, safe_name
from crashbench.errors import Interrupted, RunAborted, UsageError
from crashbench.model.bench import BenchResult, BenchSettings, Latency, Measurement, Restart, summarize
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.results import new_id, now_iso
from crashbench.model.workload import Workload
from crashbench.run.environment import environment
from crashbench.run.harness import Harness, Workers

WAIT_TIMEOUT = 120.0  # a measurement that does not finish in this long is a broken design
# How often the throughput phases look whether the workers are done. The figures come from the
# workers' own timestamps, so this only costs (CPU taken from the workers on 2 cores) when short.
POLL = 0.02
# SIGINT / SIGTERM only set it while run_bench runs; every loop reads it (`_check_stop`), and the
# `finally` blocks on the way out stop the workers and delete the keys, as a crash run does.
_stop = StopFlag()


def _check_stop() -> None:
    if _stop.raised:
        raise Interrupted("interrupted: workers stopped, nothing left running")


class _Session:
    """The workers of one measurement on the harness a crash run stands on (crashbench.run.harness),
    under its own prefix, with bench's own needs: the bare loop, a gate, each slot's own URL."""

    def __init__(
        self, server: ServerInfo, spec: str, settings: BenchSettings, workers: int, tag: str, urls: Sequence[str] = ()
    ) -> None:
        prefix = f"crashbench:{tag}:{safe_name(spec)}:"
        dsettings = DesignSettings(batch_size=settings.batch_size, shards=settings.shards)
        # Each slot's own server URL when given (through the network fault proxy: `bench --proxy`). No
        # `tree`: bench signals a library's worker alone, as it always has.
        own = Workers(url=lambda slot: urls[slot], tree=False) if urls else Workers(tree=False)
        workload = Workload(job_ms=settings.job_ms)
        # One supervisor for every phase, so worker names (and ledger files) never repeat.
        self.h = Harness("bench", spec, server.url, prefix, dsettings, workload, time.monotonic, own)
        self.cls, self.sup, self.ledger, self.dir = self.h.cls, self.h.sup, self.h.ledger, self.h.dir
        self.nodes: list[redis.Redis] = []
        try:
            self.nodes = connect.primaries(server.url, decode_responses=True)  # for INFO, a server-wide figure
            self.h.client.ping()  # its connection's handshake now, not among the enqueue's commands
            self.design: Design = self.h.design
            self.design.setup()
        except BaseException:
            self.close()
            raise
        self.workers = workers
        self.gate: tuple[int, int] | None = None  # a pipe the next workers wait on after READY

    def start(self, bare: bool, gated: bool = False) -> list[WorkerProcess]:
        """The next workers: crashbench's worker loop, or the bare loop; with `gated`, held after READY."""
        self.h.bare = bare
        self.gate = os.pipe() if gated else None
        self.h.gate = self.gate[0] if self.gate else None
        return [self.sup.spawn(slot) for slot in range(self.workers)]

    def open_gate(self, started: list[WorkerProcess]) -> float:
        """Once every worker is READY, let them all start at once; the throughput clock starts here, so
        forking eight workers one after the other is not in the figure."""
        assert self.gate is not None
        if self.h.bare:
            _wait(lambda: all((self.dir / f"{w.name}.ready").exists() for w in started), lambda: None, every=0.001)
        else:
            _wait(lambda: all(self.ledger.ready_at(w.name) is not None for w in started), self.ledger.poll, every=0.001)
        read, write = self.gate
        opened = time.monotonic()
        os.write(write, b"x" * len(started))
        os.close(write)
        os.close(read)
        self.gate = self.h.gate = None
        return opened

    def run_queued(self, n: int, sample: Callable[[], None] = lambda: None) -> float:
        """crashbench's workers on `n` queued jobs, let go at once: seconds from the go to the last end.
        Parsing the ledger while they run would put the runner's own work into the figure on a 2-core
        machine: end records are counted as bytes meanwhile, parsed once at the end."""
        started = self.start(bare=False, gated=True)
        opened = self.open_gate(started)
        counter = _EndCounter([self.ledger.path_for(w.name) for w in started])
        try:
            _wait(lambda: counter.count() >= n, lambda: None, sample, every=POLL)
        finally:
            counter.close()
        self.ledger.poll()
        return max(e.end for e in self.ledger.executions if e.end is not None) - opened

    def wait_ready(self, started: list[WorkerProcess]) -> None:
        _wait(lambda: all(self.ledger.ready_at(w.name) is not None for w in started), self.ledger.poll)

    def stop(self) -> None:
        # Interrupted, nothing of a measurement is kept: a worker blocked in a 1 s pop is not waited for.
        self.h.stop(grace=0.2 if _stop.raised else 2.0)

    def close(self) -> None:
        self.stop()
        try:
            self.h.close(clean_keys=True)
        finally:
            for client in self.nodes:
                client.close()


def _wait(
    done: Callable[[], bool], tick: Callable[[], None], sample: Callable[[], None] = lambda: None, every: float = 0.005
) -> None:
    """Poll until `done`. The figures come from the workers' own timestamps, not from when this notices,
    so it polls slowly: on 2 cores a busy poller would take CPU from the workers it measures."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while True:
        _check_stop()
        tick()
        if done():
            return
        sample()
        if time.monotonic() > deadline:
            raise RunAborted(f"bench: no progress for {WAIT_TIMEOUT:.0f} s")
        time.sleep(every)


class _EndCounter:
    """How many end records the workers' ledgers hold, by counting bytes (no parsing): an end record
    is never a file's first line, which is the READY record. Files stay open between polls."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.files = [path.open("rb") for path in paths]
        self.carry = [b""] * len(paths)
        self.ends = 0

    def count(self) -> int:
        for i, f in enumerate(self.files):
            data = self.carry[i] + f.read()
            cut = data.rfind(b"\n") + 1
            self.ends += data[:cut].count(b"\nE ")
            self.carry[i] = data[cut - 1 :] if cut else data  # keep the newline a record may follow
        return self.ends

    def close(self) -> None:
        for f in self.files:
            f.close()


def _jobs(prefix: str, n: int, high_share: float) -> list[Job]:
    every = round(1 / high_share) if high_share > 0 else 0
    return [
        Job(f"{prefix}{i:07d}", json.dumps({"n": i, "priority": "high" if every and i % every == 0 else "low"}))
        for i in range(n)
    ]


def _enqueue(design: Design, jobs: list[Job]) -> float:
    start = time.perf_counter()
    for i in range(0, len(jobs), 1000):
        _check_stop()
        design.enqueue(jobs[i : i + 1000])
    return time.perf_counter() - start


def measure(server: ServerInfo, spec: str, settings: BenchSettings, workers: int, repeat: int, tag: str) -> Measurement:
    s = _Session(server, spec, settings, workers, tag)
    try:
        n = settings.jobs
        # The bare loop goes first on odd repeats, so that neither side always gets the warmer server.
        bare_first = repeat % 2 == 1
        bare_jobs_per_s = _bare(s, settings) if bare_first else 0.0
        # 1. enqueue
        before = commandstats(s.nodes)
        enqueue_s = _enqueue(s.design, _jobs("t", n, settings.high_share))
        enqueued = commandstats(s.nodes)
        # 2. throughput, harness workers
        server_cpu0, client_cpu0 = cpu(server.pid), children_cpu()
        peak = [0]
        server_proc = psutil.Process(server.pid) if server.pid else None

        def sample() -> None:
            if server_proc is not None:
                with contextlib.suppress(psutil.Error):
                    peak[0] = max(peak[0], server_proc.memory_info().rss)

        wall = s.run_queued(n, sample)
        s.stop()  # every call the workers sent has returned: the count is complete
        after = commandstats(s.nodes)
        server_cpu1 = cpu(server.pid)
        client_cpu = (children_cpu() - client_cpu0) / wall if wall else 0.0
        jobs_per_s = n / wall
        # 3. latency at half that rate, with fresh workers
        s.wait_ready(s.start(bare=False))
        latency = _latency(s, settings, jobs_per_s / 2)
        s.stop()
        # 4. the bare loop
        if not bare_first:
            bare_jobs_per_s = _bare(s, settings)
        worker_cmds = delta(after, enqueued)
        return Measurement(
            design=spec, workers=workers, repeat=repeat, jobs=n, jobs_per_s=round(jobs_per_s, 1),
            bare_jobs_per_s=round(bare_jobs_per_s, 1), enqueue_per_s=round(n / enqueue_s, 1),
            enqueue_commands_per_job=round(sum(delta(enqueued, before).values()) / n, 4),
            commands_per_job=round(sum(worker_cmds.values()) / n, 4),
            commands=dict(sorted(worker_cmds.items())),
            latency=latency,
            server_cpu=round((server_cpu1 - server_cpu0) / wall, 3)
            if server_cpu0 is not None and server_cpu1 is not None else None,
            client_cpu=round(client_cpu, 3),
            server_peak_rss_mb=round(peak[0] / 2**20, 2) if peak[0] else None,
        )  # fmt: skip
    finally:
        s.close()


def _latency(s: _Session, settings: BenchSettings, rate: float) -> dict[str, Latency]:
    """Open loop: M jobs, one every 1/rate s, on time whatever the queue does."""
    jobs = _jobs("l", settings.latency_jobs, settings.high_share)
    enqueued_at: dict[str, float] = {}
    start = time.monotonic()
    for i, job in enumerate(jobs):
        due = start + i / rate
        _check_stop()
        while (now := time.monotonic()) < due:
            if due - now > 0.002:
                time.sleep(due - now - 0.001)
        enqueued_at[job.id] = time.monotonic()
        s.design.enqueue([job])
    ids = set(enqueued_at)
    pending = set(ids)

    def all_done() -> bool:  # each job looked up once it is done, never a Counter of every execution per look
        pending.difference_update([j for j in pending if s.ledger.has_completed(j)])
        return not pending

    _wait(all_done, s.ledger.poll)
    ended = {e.job: e.end for e in s.ledger.executions if e.job in ids and e.end is not None}
    high = {j.id for j in jobs if '"high"' in j.payload}
    out = {}
    for name, members in (("all", ids), ("high", high), ("low", ids - high)):
        values = sorted((ended[j] - enqueued_at[j]) * 1000 for j in members)
        if values:
            p50, p99 = round(quantile(values, 0.50), 3), round(quantile(values, 0.99), 3)
            out[name] = Latency(p50, p99, round(values[-1], 3), len(values))
    return out


def _bare(s: _Session, settings: BenchSettings) -> float:
    n = settings.jobs
    _enqueue(s.design, _jobs("b", n, settings.high_share))
    started = s.start(bare=True, gated=True)
    opened = s.open_gate(started)
    _wait(lambda: s.design.backlog() == 0, lambda: None, every=POLL)
    s.stop()
    figures = [(w.name, (s.dir / f"{w.name}.bare").read_text().split()) for w in started]
    last = max(float(f[2]) for _, f in figures)
    acked = sum(int(f[1]) for _, f in figures)
    if acked != n:
        raise RunAborted(f"bench: the bare loop of {s.cls.name} acked {acked} jobs, not {n}")
    return n / (last - opened)


def jobs_per_s(server: ServerInfo, spec: str, settings: BenchSettings, tag: str, urls: Sequence[str]) -> float:
    """The throughput phase alone: N queued jobs, one of crashbench's workers per URL, each on its own."""
    s = _Session(server, spec, settings, len(urls), tag, urls)
    try:
        _enqueue(s.design, _jobs("t", settings.jobs, settings.high_share))
        return settings.jobs / s.run_queued(settings.jobs)
    finally:
        s.close()


def restarts(server: ServerInfo, spec: str, settings: BenchSettings, tag: str) -> Restart:
    """SIGKILL an idle worker and start its replacement, as a crash run does: kill -> replacement READY."""
    s = _Session(server, spec, settings, 2, tag)
    try:
        sup = s.sup
        s.wait_ready(s.start(bare=False))
        samples = []
        for _ in range(settings.restarts):
            victim = sup.slots[0]
            killed = time.monotonic()
            sup.send(victim, signal.SIGKILL)
            replacement = sup.spawn(0)
            _wait(lambda r=replacement: s.ledger.ready_at(r.name) is not None, s.ledger.poll)
            ready_at = s.ledger.ready_at(replacement.name)
            assert ready_at is not None
            samples.append(round((ready_at - killed) * 1000, 3))
            sup.wait_exit(victim, 5.0)
        return Restart(spec, samples, round(statistics.median(samples), 3))
    finally:
        s.close()


def run_bench(
    settings: BenchSettings,
    redis_url: str | None = None,
    server_binary: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
    cluster: tuple[int, int] | None = None,  # an embedded cluster: (primaries, replicas per primary)
) -> BenchResult:
    for spec in settings.designs:
        load_design(spec)  # an unknown design is a usage error before the server starts
    workdirs.remove_orphans()
    run_id = secrets.token_hex(4)
    started = time.monotonic()
    _stop.raised = False
    with _stop.installed(), open_server(redis_url, server_binary, cluster=cluster) as (server, _):
        if server.cluster and settings.proxy:  # the proxy stands in front of one address
            raise UsageError("bench --proxy: the proxy fronts one server, not a cluster")
        try:
            # First: a server the proxy cannot front (a unix socket) fails the bench now, not at its end.
            costs = proxy.costs(server, settings, jobs_per_s, f"{{{run_id}}}", progress) if settings.proxy else []
            measurements: list[Measurement] = []
            for spec in settings.designs:
                for workers in settings.workers:
                    for repeat in range(settings.repeat):
                        progress(f"{spec}: {workers} workers, repeat {repeat + 1}/{settings.repeat}")
                        tag = f"{{{run_id}}}:b{len(measurements)}"  # a hash tag: a design's keys in one slot
                        measurements.append(measure(server, spec, settings, workers, repeat, tag))
            restart = []
            for spec in settings.designs:
                progress(f"{spec}: restarts")
                restart.append(restarts(server, spec, settings, f"{{{run_id}}}:r-{safe_name(spec)}"))
            progress("memory per 1M queued jobs")
            mem = memory(server, settings.memory_jobs, f"{{{run_id}}}", _check_stop) if settings.memory_jobs else []
            env = environment(server, {})
        finally:
            if server.external:  # what an interruption left (the memory backlog), never others'
                with contextlib.suppress(redis.RedisError):
                    cleanup_keys(server.url, f"crashbench:{{{run_id}}}:")
    return BenchResult(
        new_id(run_id), now_iso(), settings, measurements, summarize(measurements), restart, mem, env,
        round(time.monotonic() - started, 2), costs,
    )  # fmt: skip
