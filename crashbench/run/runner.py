"""One crash run of one design: setup (enqueue, start the workers), the loop that fires the fault
schedule (crashbench.faults.injector), the drain (crashbench.run.drain), and the collection of what
the run recorded into its timeline (crashbench.model.timeline), which the result is computed from
(crashbench.evidence.tally).

Single-threaded on purpose: every wait calls `_tick`, which tails the ledger, reaps workers, runs the
design's recovery on its timer, samples the queue's depth and reports progress; signal handlers only
set a flag it reads (crashbench.control.stopflag). Every process started here is stopped in `finally`,
whatever happened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from crashbench import jobids
from crashbench.control import connect, lease
from crashbench.control.connect import DOWN
from crashbench.control.interpreter import WorkerPython
from crashbench.control.stopflag import StopFlag
from crashbench.designs import Design, library_settings, load_design, safe_name
from crashbench.errors import CrashbenchError, Interrupted, RunAborted, UnexpectedError, unsupported_on_cluster
from crashbench.evidence import depth, keyspace, tally
from crashbench.evidence.search import Needle
from crashbench.faults import plan, registry
from crashbench.faults.broker import Broker
from crashbench.faults.cluster import ClusterBroker
from crashbench.faults.family import Driver
from crashbench.faults.injector import WorkerFaults
from crashbench.faults.sentinel.broker import SentinelBroker
from crashbench.jobids import JobIds
from crashbench.model.faults import NetworkFault
from crashbench.model.queue import Located, Receipts, receipts
from crashbench.model.results import DesignRun, WorkerExit
from crashbench.model.spec import Scenario
from crashbench.model.workload import job_ids
from crashbench.run import collect, crashloop, reading
from crashbench.run.drain import WATCH_S, drain, watch
from crashbench.run.effects import AppRun
from crashbench.run.harness import Harness, Workers
from crashbench.run.network import RunNetwork
from crashbench.run.producer import Producer, Through
from crashbench.run.progress import Progress
from crashbench.run.target import RunHooks as RunHooks
from crashbench.run.target import RunTarget as RunTarget

T = TypeVar("T")


def _no_file(slot: int) -> str | None:
    return None


NO_HOOKS = RunHooks()  # a run nobody watches: its own stop flag, the monotonic clock


class CrashRun:
    STARTUP_TIMEOUT = 30.0  # a library worker under load can take seconds to come up
    TICK = 0.005  # main-loop period; waiting for a victim to enter a handler polls 10x faster
    # Seconds after a fault had the server down within which a worker's exit is the fault's doing (a library
    # worker that gives up on a lost server, RQ's): counted, respawned, but never a reason to abort the run.
    SERVER_SETTLE = 5.0

    def __init__(
        self,
        scenario: Scenario,
        target: RunTarget,
        hooks: RunHooks = NO_HOOKS,
        worker_python: WorkerPython | None = None,
        broker: Broker | ClusterBroker | SentinelBroker | None = None,
    ) -> None:
        self.sc, self.target, self.spec, self.broker = scenario, target, target.design, broker
        self.progress, self.warn, self.clock, self.keep_dir = hooks.progress, hooks.warn, hooks.clock, hooks.keep_dir
        self.stop = hooks.stop or StopFlag()
        self._mark_jobs()
        self.design_cls: type[Design] = load_design(self.spec)
        # The run id in braces is a hash tag: on a Redis Cluster, all of a session's keys share its slot.
        self.prefix = f"crashbench:{{{target.run_id}}}:{target.index}-{safe_name(self.spec)}:"
        self.on_cluster = connect.is_cluster(target.url)
        url = self._design_url()
        self.harness = self._harness(url, worker_python)
        self.ledger, self.sup, self.dir = self.harness.ledger, self.harness.sup, self.harness.dir
        self._inspect(url)
        self.window = scenario.run.drain_timeout or self.design.observe_window()
        self.configuration, self.warnings = library_settings(self.design)
        self.crashloop = crashloop.CrashLoop(self.sc.workload_model(), self.ledger, self.configuration)
        self.warnings = [*self.warnings, *self.crashloop.warnings]
        self._plan()
        self._empty_records()

    # -- setup, step by step ---------------------------------------------------------------------

    def _mark_jobs(self) -> None:
        """Every id this run enqueues carries its token, which the final reading searches every stored
        byte for (crashbench.evidence.search); this process strips it again on the way in."""
        self.token = jobids.token()
        jobids.register(self.token)
        self.app = AppRun(self.sc, self.token)  # the user's app's payloads and check, when it has one
        self.jobs_for = self.app.jobs_for
        self.needle = Needle(self.token)

    def _design_url(self) -> str:
        """The URL the design and its workers connect to. A library without a cluster client of its own
        gets one node, as its users give it: its error is its answer."""
        if self.on_cluster and self.design_cls.library and not getattr(self.design_cls, "cluster_client", False):
            return connect.library_url(self.target.url, self.prefix)
        return self.target.url

    def _harness(self, url: str, worker_python: WorkerPython | None) -> Harness:
        """The design, its workers' spec, the work directory, the ledger and the supervisor
        (crashbench.run.harness). A worker connects through the proxy, or from its slot's namespace,
        when the run has network faults (self.net, started before the first worker)."""
        workers = Workers(
            url=lambda slot: self.net.worker_url(url, slot) or self.target.workers_url or None,
            enter=lambda slot: self.net.enter(slot), pidns=lambda slot: self.net.pidns(slot),
            remote=lambda slot: self.net.remote(slot),
            python=worker_python, url_file=str(self.broker.url_file) if self.broker else None,
            url_file_of=self.broker.url_file_of if isinstance(self.broker, SentinelBroker) else _no_file,
            env=self._worker_env, fresh=any(self._worker_env(s) for s in range(self.sc.workload.workers)),
        )  # fmt: skip
        settings, workload = self.sc.settings(self.spec), self.sc.workload_model()
        return Harness("run", self.spec, url, self.prefix, settings, workload, self.clock, workers)

    def _worker_env(self, slot: int) -> dict[str, str]:
        """A slot's own environment, from every fault family that gives one (the clock's)."""
        return {k: v for f in registry.FAMILIES for k, v in f.worker_env(self.sc, slot).items()}

    def _inspect(self, url: str) -> None:
        """The harness's own connection (never the design's), to the primary that holds the run's slot;
        the keys' lease on a server crashbench did not start; everything the run could write: the whole
        server when crashbench started it (crashbench.evidence.keyspace)."""
        spread, external = self.design_cls.spread, self.target.external
        self.raw = connect.reader(url, self.prefix, spread, decode_responses=False)
        ns = lease.namespace(self.prefix)
        self.lease = lease.Lease(url, ns, expire=not self.keep_dir, spread=spread) if external else None
        self.scope = keyspace.Scope(self.target.url, started=not external)

    def _plan(self) -> None:
        """The faults, their drivers (once the fault phase begins) and whether a producer runs."""
        self.planned = plan(self.sc)
        # Each fault family's driver in this run (crashbench.faults.registry), by family name, once the
        # fault phase begins; the signal family's is `worker_faults`, built here with the supervisor.
        self.drivers: dict[str, Driver] = {}
        self.net = RunNetwork()  # the proxy or the namespaces, started first when the run has network faults
        # The producer enqueues during the run when asked, or when a broker fault or a fault on it may meet it.
        on_producer = any(isinstance(f, NetworkFault) and f.target == "producer" for f in self.planned)
        self.producing = self.broker is not None or self.sc.workload.produce == "during" or on_producer
        self.producer: Producer | None = None
        self.worker_faults = WorkerFaults(
            self.planned, self.sup, self.ledger, self.clock, self.design_cls.own_worker, self.sc.workload.longest_job_s
        )

    def _empty_records(self) -> None:
        """What the run records as it goes, none of it yet."""
        self.exits: list[WorkerExit] = []
        self.phase = "starting"
        self.t0 = 0.0
        self._next_recover = self._next_progress = 0.0
        self._down_at, self._fault_exits = -math.inf, 0  # the server last seen down; exits that followed it
        self.inspect_s = 0.0  # time spent reading Redis for the evidence
        self.enqueues: list[tuple[float, JobIds, Receipts]] = []  # (harness clock, ids, receipts), before t0
        self.marks: list[tuple[float, str, int]] = []  # recovery passes, broker events, the drain's start
        self.sampler = depth.Sampler()  # the harness's readings of the queue's depth (the timeline)
        self.started = 0.0  # wall clock at t0

    @property
    def design(self) -> Design:
        """The harness's instance of the design (a new one after a failover: `reconnect`)."""
        return self.harness.design

    # -- the run ---------------------------------------------------------------------------------

    def execute(self) -> DesignRun:
        try:
            run = self._execute()
            if run.problems:  # the evidence behind a wrong report is worth keeping
                self.keep_dir = True
                run.workdir = str(self.dir)
            return run
        except Exception as exc:
            if self.on_cluster and self.design_cls.library and not isinstance(exc, Interrupted):
                raise unsupported_on_cluster(self.spec, exc) from None
            if isinstance(exc, (CrashbenchError, redis.ConnectionError)):
                raise
            # A design (or crashbench) raised where nothing expected it: never exit 1, which means a
            # threshold was violated. The ledgers and worker logs stay for a post-mortem.
            self.keep_dir = True
            raise UnexpectedError.from_exception(exc, f"{self.spec} ({self.phase})", self.dir) from exc
        finally:
            try:
                self.harness.stop(grace=self._grace())
                if self.producer is not None and self.producer.through is not None:
                    self.producer.through.close()
                self.raw.close()
                if self.lease is not None:
                    self.lease.close()
                self.net.close()
            finally:  # the workdir goes (or stays, marked) and the workers' cgroups go, whatever failed above
                self.harness.close(keep=self.keep_dir)

    def _grace(self) -> float:
        # SIGTERM is a graceful stop: a worker first finishes the job it is in.
        return 1.0 + 2 * self.sc.workload.longest_job_s

    def _execute(self) -> DesignRun:
        for text in self.warnings if self.warn is not None else ():
            self.warn(text)
        target = self.target
        self.net = RunNetwork.start(self.planned, target.url, self.sc, self.broker, target.external, self.dir / "logs")
        # Before the job list exists: workers are forked from a process that never holds it, so a
        # restart costs the same at any job count (crashbench.control.zygote).
        self.sup.start_zygote()
        self.scope.take_before()
        self.design.setup()
        ids = job_ids(self.sc.workload.jobs)
        if not self.producing:
            # Chunks built and sent one by one, the stop flag read between them: 10M jobs take over
            # 30 s to build and send, and Ctrl-C must not wait for that.
            for start in range(0, len(ids), 1000):
                if self.stop.raised:
                    raise Interrupted("interrupted while enqueueing: nothing left running")
                chunk, t = ids[start : start + 1000], self.clock()  # a stream's receipts tell a trimmed entry
                self.enqueues.append((t, chunk, receipts(self.design.enqueue(self.jobs_for(chunk)), chunk, self.spec)))
        self.t0 = self.clock()
        self.started = time.time()
        for slot in range(self.sc.workload.workers):
            self.sup.spawn(slot)
        self._wait_ready()

        self.phase = "faults"
        self._fire_faults(ids)
        faults_end = self.clock()

        while True:  # a second round when faults are timed from the drain (crashbench.faults: after)
            self.phase = "draining"
            self.marks.append((self.clock(), "drain", -1))
            ended = drain(
                self._tick, self.clock, self.crashloop.starts, lambda: self.crashloop.busy(self.sup.alive()),
                lambda: self._tolerant(self.design.backlog, -1), faults_end, self.window, self.design.SETTLE_S,
                self.TICK, moves=not self.crashloop.active, not_before=collect.last_due(self),
            )  # fmt: skip
            if not self.worker_faults.later or not ended.drained:  # never drained: they are never due
                break
            self.phase = "faults"
            self.worker_faults.fire_later(self._tick, self.TICK)
            self._wait_ready()  # the last replacement's READY: its restart is measured too
            faults_end = self.clock()
        drained_at = self.clock()
        self._sample_depth(drained_at, whole=True)  # the depth chart ends on a reading, not one held over
        # The watch after the drain: its end, the most backlog() said, and what Redis held as it began.
        settled: tuple[float, int, list[str]] | None = None
        if ended.drained:
            held = sorted(collect.final_reading(self).located.held)
            backlog = lambda: self._tolerant(self.design.backlog, -1)  # noqa: E731
            most = watch(self._tick, self.clock, backlog, drained_at + WATCH_S, self.TICK)
            settled = (self.clock(), most, held)

        self.phase = "counting"
        self._report(force=True)
        before = collect.final_reading(self).located  # before anything is stopped: the queue as the run left it
        self.harness.stop(grace=self._grace())
        self._collect_exits()
        self.ledger.finish()  # every writer is gone: the last read, and a torn last record is reported
        # Every worker is stopped now, so every heartbeat is stale: advance the clock past the threshold.
        self.design.recover(self.clock() + self.sc.queue.stale_after)
        timeline = collect.timeline(self, ended.drained, ended.cut_off, drained_at, faults_end, settled, before)
        return tally.design_run(timeline, registry.checkers())

    def _tick(self) -> None:
        if self.stop.raised:
            raise Interrupted("interrupted: workers stopped, nothing left running")
        self.ledger.poll()
        self._collect_exits()
        now = self.clock()
        self.worker_faults.thaw_due(now)
        # While a broker fault has the server down, neither a recovery pass nor a depth reading: both
        # would only wait on the dead server (seconds, on a loaded machine), and the producer and the
        # worker faults, on this same loop, with them.
        down = self.down
        self._down_at = now if down else self._down_at
        if now >= self._next_recover and self.phase != "starting" and not down:
            gave_back = self._tolerant(lambda: self.design.recover(now), None)
            self.marks.append((now, "recover", gave_back if isinstance(gave_back, int) else -1))
            self._next_recover = now + self.sc.queue.recover_every
        if self.sampler.due(now) and self.phase != "starting" and not down:
            self._sample_depth(now)
        if self.lease is not None:
            self.lease.tick(now)  # the keys' safety expiry (crashbench.control.lease)
        self._report()

    def _report(self, force: bool = False) -> None:
        now = self.clock()
        if self.progress is None or (now < self._next_progress and not force):
            return
        self._next_progress = now + 0.1
        wf = self.worker_faults
        self.progress(Progress(self.spec, self.phase, self.sc.workload.jobs, self.ledger.done, len(wf.records),
                               wf.total, len(self.sup.alive()), now - self.t0))  # fmt: skip

    def _collect_exits(self) -> None:
        for w in self.sup.reap():
            if w.signalled is not None:
                continue
            if not self.crashloop.explains(w.name):  # a crash job's death is the workload's (run.crashloop)
                self.exits.append(WorkerExit(w.name, w.describe_exit(), w.log_tail()))
                self._fault_exits += self.clock() - self._down_at < self.SERVER_SETTLE
            if len(self.exits) - self._fault_exits > 2 * self.sc.workload.workers:
                if not self.down:
                    self.harness.client.ping()  # workers that died of a lost server: that is the error (exit 3)
                raise RunAborted(
                    f"{self.spec}: {len(self.exits)} workers exited on their own; the last one "
                    f"({w.name}, {w.describe_exit()}) logged:\n{w.log_tail()}"
                )
            if self.phase in ("starting", "faults", "draining"):
                self.sup.spawn(w.slot)

    def _sample_depth(self, now: float, whole: bool = False) -> None:
        def begin() -> depth.Reader:
            inside = {ex.job for w in self.sup.alive() for ex in self.ledger.open_in(w.name)}
            return depth.Reader(self.design, self.raw, inside, self.needle)

        spent = self._tolerant(lambda: self.sampler.step(now, self.t0, begin, whole), None)
        if spent is None:
            self.sampler.drop()
        else:
            self.inspect_s += spent

    def _tolerant(self, call: Callable[[], T], down: T) -> T:
        """`call()`, or `down` while a broker fault has the server down (without one, errors propagate)."""
        try:
            return call()
        except DOWN:
            if self.broker is None:
                raise
            return down

    @property
    def down(self) -> bool:
        """Whether a fault has the server down now (a driver that can take it down says so)."""
        return any(getattr(d, "down", False) for d in self.drivers.values())

    def mark(self, t: float, what: str) -> None:
        """A fault's event on the timeline (a broker's kill, restart, promotion, ...)."""
        self.marks.append((t, what, -1))

    def _fire_faults(self, ids: JobIds) -> None:
        """The one scheduler: every planned fault fired from this loop at its time, each family's by its
        driver (crashbench.faults.registry), so faults of every family may overlap; the producer
        enqueues meanwhile when the run has one."""
        self.worker_faults.t0 = self.t0
        through = None
        if (url := self.net.producer_url) is not None:  # a fault on the producer: its enqueues through the proxy
            through = Through.to(
                url, self.design_cls, self.prefix, self.sc.settings(self.spec), self.sc.queue.socket_timeout
            )
        producer = self.producer = (
            Producer(ids, self.jobs_for, self.sc.broker.produce_s, self.t0, through) if self.producing else None
        )
        built = [(f, d) for f in registry.FAMILIES if (d := f.driver(self)) is not None]
        self.drivers = {f.name: d for f, d in built}
        path = [d for f, d in built if not d.fine and not f.on_server]  # on the connections: before an enqueue
        server = [d for f, d in built if not d.fine and f.on_server]  # the server's: meeting the enqueue
        fine = [d for _, d in built if d.fine]
        while not all(d.done for d in self.drivers.values()) or (producer is not None and not producer.done):
            self._tick()
            for d in path:
                d.step(self.clock())
            if producer is not None:
                producer.produce(self.design, self.clock())
            for d in server:
                d.step(self.clock())
            # Waiting for a victim to enter a handler: its own ledger is looked at 10x as often as
            # the rest of the loop runs (a short job is over within a tick), nothing else is.
            until = self.clock() + self.TICK
            while any([d.step(self.clock()) for d in fine]) and self.clock() < until:
                time.sleep(self.TICK / 10)
            time.sleep(max(0.0, until - self.clock()))

    def reconnect(self) -> None:
        """After a failover: the runner's own client and design, on the promoted replica."""
        self.raw.close()
        url = self.broker.url if self.broker else self.target.url
        self.harness.reconnect(url)
        self.raw = connect.reader(url, self.prefix, self.design_cls.spread, decode_responses=False)

    def _wait_ready(self) -> None:
        deadline = self.clock() + self.STARTUP_TIMEOUT
        while not all(self.ledger.ready_at(w.name) is not None for w in self.sup.slots.values()):
            if self.clock() > deadline:
                raise RunAborted(f"{self.spec}: workers not ready after {self.STARTUP_TIMEOUT:.0f} s")
            self._tick()
            time.sleep(self.TICK)

    # -- counting --------------------------------------------------------------------------------

    def locate(self, raw: redis.Redis | None = None) -> Located:
        located, snapshot = reading.locate(self.design, raw or self.raw)
        self.inspect_s += snapshot.taken_s
        return located
