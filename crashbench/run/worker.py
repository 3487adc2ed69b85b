"""The worker: the body of every forked worker process.

Fetch a job, mark the start in the ledger, run the handler, mark the end (or the failure), ack (or
fail). Signal handlers only set a flag; the loop notices it between jobs, so SIGTERM is a graceful
stop: the current job finishes, the design hands back anything else, the worker exits. A worker
also stops on its own when the runner is gone (its parent pid changes).

A library adapter's worker (`serve_library`) runs the library's own loop instead.

Under `--worker-python` the forked process execs `python -m crashbench.run.worker SPEC NAME LEDGER PARENT`
(see crashbench.control.interpreter); `main` rebuilds the spec from its JSON file. That file holds the URL
with its password masked; the real one comes in the environment (URL_ENV), never on a command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import redis

from crashbench.control import clockprobe, connect, memlimit
from crashbench.control.connect import DOWN, refused
from crashbench.control.interpreter import URL_ENV
from crashbench.designs import Design, LibraryDesign, load_design
from crashbench.designs.handler import crash
from crashbench.model import hostclock
from crashbench.model.ledger import LedgerWriter
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.workload import Workload, spend
from crashbench.redact import redact_url, secrets_of

OOM_PAUSE_S = 0.02  # a worker whose write the server refused (OOM) tries again after this long
RECONNECT_S = 30.0  # a worker that cannot reach its server for this long gives up (exit 1)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs; inherited through fork, so nothing is serialized."""

    redis_url: str
    design: type[Design]
    prefix: str
    settings: DesignSettings
    workload: Workload
    fetch_timeout: float = 0.1  # also bounds how late a worker notices a stop request
    url_file: str | None = None  # with a broker fault: where the current server's URL is (failover)

    def to_json(self, design_spec: str) -> str:
        """For a worker that is not a fork of the harness; `design_spec` is how load_design finds the class."""
        return json.dumps(
            {
                "redis_url": redact_url(self.redis_url),  # the real one goes through URL_ENV
                "design": design_spec,
                "prefix": self.prefix,
                "settings": dataclasses.asdict(self.settings),
                "workload": self.workload.to_json(),
                "fetch_timeout": self.fetch_timeout,
                "url_file": self.url_file,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        d = json.loads(text)
        return cls(
            d["redis_url"],
            load_design(d["design"]),
            d["prefix"],
            DesignSettings(**d["settings"]),
            Workload.from_json(d["workload"]),
            d["fetch_timeout"],
            d.get("url_file"),
        )


def run_handler(spec: WorkerSpec, design: Design, name: str, job: Job) -> bool:
    """The job's work: sleep its duration, heartbeating inside when that is on. False: it raised."""
    remaining = spec.workload.duration_s(job.id)
    every = spec.settings.heartbeat_every
    work = spec.workload.job_work  # asleep, or holding the GIL (workload.spend)
    while every and remaining > every:
        spend(every, work)
        remaining -= every
        design.heartbeat(name, job, hostclock.now())
    if remaining > 0:
        spend(remaining, work)
    if spec.workload.crash_rate and spec.workload.crashes(job.id):
        crash(spec.workload.crash_how)  # the job kills this worker (a crash loop); never returns
    return not spec.workload.fails(job.id, job.attempt)


def limit_memory(spec: WorkerSpec, name: str) -> None:
    """Crash jobs that die of memory need a limit to blow: set before the worker runs any job
    (crashbench.control.memlimit), inherited by what a library forks."""
    if spec.workload.crash_rate and spec.workload.crash_how == "memory":
        memlimit.limit(name)


def serve_library(spec: WorkerSpec, name: str, ledger_path: Path) -> int:
    """A library adapter's worker: the library's own loop, with its own signal handling; its task
    (crashbench.designs.handler.handle) finds the ledger and the workload through the environment, which also
    reaches the children the library forks."""
    os.environ["CRASHBENCH_LEDGER"] = str(ledger_path)
    os.environ["CRASHBENCH_WORKLOAD"] = spec.workload.to_json()
    design = Connector(spec, name).design()
    assert isinstance(design, LibraryDesign)
    ledger = LedgerWriter(ledger_path)
    limit_memory(spec, name)
    design.start_worker(name, hostclock.now())
    said: list[bool] = []

    def ready() -> None:  # once, although a library may call its start-up hook in each thread
        if not said:
            said.append(True)
            ledger.ready(hostclock.now())

    design.serve(name, ready)
    ledger.close()
    return 0


def wait_gate(gate: int | None) -> None:
    """`crashbench bench` starts every worker's loop at once, after all are READY: one byte each."""
    if gate is not None:
        os.read(gate, 1)


def run_batch(spec: WorkerSpec, design: Design, name: str, ledger: LedgerWriter, clock: Callable[[], float]) -> None:
    """One fetch: run its jobs in order, writing the ledger as they go, then ack the finished ones.
    A batching design hands over several jobs at once; they are acked together after the last one
    ran, so a kill in between runs the finished ones again (bounded by the batch size)."""
    finished = []
    jobs = design.fetch_batch(name, spec.fetch_timeout, clock())
    started = False  # whether the current job's start record is written already
    for i, job in enumerate(jobs):
        if not started:
            ledger.start(job.id, clock())
        started = False
        # The ledger's end record is the handler's side effect; it is written before the ack.
        if run_handler(spec, design, name, job):
            if i + 1 < len(jobs):
                ledger.end_and_start(job.id, clock(), jobs[i + 1].id)
                started = True
            else:
                ledger.end(job.id, clock())
            finished.append(job)
        else:
            ledger.fail(job.id, clock())
            design.fail(name, job, clock())
    if finished:
        held = design.ack_batch(name, finished, clock())
        ledger.acked([job.id for job in finished], clock(), held if isinstance(held, list) else None)


class StopRequest:
    """SIGTERM / SIGINT only set a flag; the worker's loop reads it between jobs (a graceful stop)."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


class Connector:
    """The worker's client and design, made again after a connection error, from the address file
    when there is one (a failover moves the server), with backoff, for at most RECONNECT_S."""

    def __init__(self, spec: WorkerSpec, name: str) -> None:
        self.spec = spec
        self.name = name

    def design(self) -> Design:
        url = Path(self.spec.url_file).read_text().strip() if self.spec.url_file else self.spec.redis_url
        # A socket timeout longer than the blocking pop (fetch_timeout) turns a connection that went
        # silent (half-open) into a TimeoutError, so a reconnect, instead of a pop that waits for ever.
        # 0 asks for none at all, as redis-py before 6 shipped (redis-py 8's own default is 5 s). No
        # health-check interval: every read is bounded already, and its PINGs would show up in the
        # commands per job that crashbench bench counts.
        st = self.spec.settings.socket_timeout or None
        timeouts = {"socket_timeout": st, "socket_connect_timeout": st}
        client = connect.connect(url, decode_responses=True, **timeouts)  # a cluster's client for a cluster URL
        return self.spec.design(client, self.spec.prefix, self.spec.settings)

    def again(self) -> Design:
        deadline, pause = time.monotonic() + RECONNECT_S, 0.01
        while True:
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
            design = self.design()
            try:
                # A read of the run's slot, not a PING: on a cluster, any node answers PING while the
                # run's primary is down and its replica not yet promoted.
                design.r.exists(self.spec.prefix)
                return design
            except DOWN:
                design.r.close()
                if time.monotonic() > deadline:
                    raise


def run_worker(spec: WorkerSpec, name: str, ledger_path: Path, parent_pid: int, gate: int | None = None) -> int:
    if spec.design.own_worker:
        return serve_library(spec, name, ledger_path)
    stop = StopRequest()
    clock = hostclock.now
    connect = Connector(spec, name)
    design = connect.design()
    ledger = LedgerWriter(ledger_path)
    try:
        design.start_worker(name, clock())
    except DOWN:
        if spec.url_file is None:  # no broker fault: a server that does not answer is an error
            raise
        # A replacement started while the server is down (a worker fault overlapping a broker fault):
        # it waits for the server, as a running worker does.
        design = connect.again()
        design.start_worker(name, clock())
    limit_memory(spec, name)
    ledger.ready(clock())
    wait_gate(gate)

    while not stop.requested and os.getppid() == parent_pid:
        try:
            run_batch(spec, design, name, ledger, clock)
        except DOWN:
            # The server is down, restarting or failed over. Once it answers again, what this worker
            # still holds there (a job whose ack did not get through) is not being worked on: hand it
            # back, as on a graceful stop, and start over. Those jobs run again (acks lost).
            design = connect.again()
            with contextlib.suppress(*DOWN):
                design.stop_worker(name, clock())
                design.start_worker(name, clock())
        except redis.ResponseError as exc:
            # The server refuses writes (an eviction fault's noeviction limit, a primary that lost its
            # replicas under min-replicas-to-write): what the call was doing did not happen; the same call
            # again a little later, as a worker that outlives the refusal would.
            if not refused(exc):
                raise
            time.sleep(OOM_PAUSE_S)
    if stop.requested:
        design.stop_worker(name, clock())
    ledger.close()
    design.r.close()
    return 0


def run_bare(spec: WorkerSpec, name: str, out_path: Path, parent_pid: int, gate: int | None = None) -> int:
    """The design's own commands and nothing else: fetch and ack, no ledger, no handler. `crashbench
    bench` runs it beside run_worker to show what the harness itself costs. Writes, at exit, when it
    started, how many jobs it acked and when the last ack returned."""
    stop = StopRequest()
    clock = time.monotonic
    design = Connector(spec, name).design()
    design.start_worker(name, clock())
    out_path.with_suffix(".ready").write_text("")
    wait_gate(gate)
    ready, acked, last = clock(), 0, 0.0
    while not stop.requested and os.getppid() == parent_pid:
        jobs = design.fetch_batch(name, spec.fetch_timeout, clock())
        if jobs:
            design.ack_batch(name, jobs, clock())
            acked, last = acked + len(jobs), clock()
    out_path.write_text(f"{ready:.6f} {acked} {last:.6f}\n")
    design.r.close()
    return 0


def real_url(shown: str, environ: Mapping[str, str] = os.environ) -> str:
    """The URL the spec file shows masked, from the environment. The environment's is taken only
    when it is that URL (the same once masked): a stale CRASHBENCH_REDIS_URL of the user's must not
    send a worker to another server."""
    given = environ.get(URL_ENV, "")
    if given and redact_url(given) == shown:
        return given
    if secrets_of(shown):  # masked credentials ("***"): connecting with them can only fail, less clearly
        raise SystemExit(f"crashbench worker: {URL_ENV} does not hold the URL of the spec ({shown}); cannot connect")
    return shown


def main(argv: list[str]) -> int:
    spec_file, name, ledger_path, parent_pid = argv
    clockprobe.start(name)  # a skewed clock (crashbench.faults.clock): its reading, its watch
    spec = WorkerSpec.from_json(Path(spec_file).read_text())
    spec = dataclasses.replace(spec, redis_url=real_url(spec.redis_url))
    return run_worker(spec, name, Path(ledger_path), int(parent_pid))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
