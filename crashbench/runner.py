"""One crash run of one design: enqueue, start workers, inject the fault schedule, drain, count.

Single-threaded on purpose: the main loop (`_tick`) tails the ledger, reaps workers, runs the
design's recovery on its timer and reports progress; signal handlers only set a flag it reads
(crashbench.stopflag). The result is tallied from what the run recorded (crashbench.tally).
Every process started here is stopped in `finally`, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

from crashbench import inspector, lease, tally, workdirs
from crashbench.broker import Broker, Producer, wait_back
from crashbench.designs import Design, Job, Located, library_settings, load_design, safe_name
from crashbench.errors import CrashbenchError, Interrupted, RunAborted, UnexpectedError
from crashbench.faults import PlannedKill, plan_kills
from crashbench.interpreter import WorkerPython
from crashbench.ledger import Execution, Ledger
from crashbench.results import BrokerFaultRecord, DesignRun, KillRecord, WorkerExit
from crashbench.scenario import Scenario
from crashbench.stopflag import StopFlag
from crashbench.supervisor import Supervisor, WorkerProcess
from crashbench.timeline import Depth, DesignFlags, Enqueue, Mark, Spawn, Timeline, rel
from crashbench.worker import DOWN, WorkerSpec, run_worker
from crashbench.workload import job_ids

Clock = Callable[[], float]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Progress:
    design: str
    phase: str  # "starting" | "faults" | "draining" | "counting"
    enqueued: int
    done: int
    kills: int
    kills_total: int
    alive: int
    elapsed: float


def _jobs(ids: list[str]) -> list[Job]:
    """The run's jobs for these ids; the payload carries the job's number."""
    return [Job(j, f'{{"n": {int(j)}}}') for j in ids]


class CrashRun:
    STARTUP_TIMEOUT = 30.0  # a library worker under load can take seconds to come up
    TICK = 0.005  # main-loop period; waiting for a victim to enter a handler polls 10x faster
    DEPTH_EVERY = 0.25  # seconds between the harness's readings of the queue's depth (the timeline)
    DEPTH_COST = 30  # ... and at least this many times as long as the last reading took
    MID_JOB_WAIT = 5.0  # seconds a mid-job fault waits for its victim to be inside a handler

    def __init__(
        self,
        scenario: Scenario,
        design_spec: str,
        redis_url: str,
        run_id: str,
        progress: Callable[[Progress], None] | None = None,
        stop: StopFlag | None = None,
        keep_dir: bool = False,
        clock: Clock = time.monotonic,
        index: int = 0,
        variant: str = "",
        worker_python: WorkerPython | None = None,
        repeat: int = 0,
        broker: Broker | None = None,
        external: bool = False,  # a server crashbench did not start: the run's keys get a lease
        warn: Callable[[str], None] | None = None,  # told, before the run starts, what in its settings is unsafe
    ) -> None:
        self.sc = scenario
        self.spec = design_spec
        self.design_cls: type[Design] = load_design(design_spec)
        self.prefix = f"crashbench:{run_id}:{index}-{safe_name(design_spec)}:"
        self.variant = variant
        self.index = index
        self.repeat = repeat
        self.url = redis_url
        self.progress = progress
        self.stop = stop or StopFlag()
        self.keep_dir = keep_dir
        self.clock = clock
        self.dir = workdirs.make("run", memory=True)
        (self.dir / "logs").mkdir()
        (self.dir / "ledger").mkdir()
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.raw = inspector.raw_client(redis_url)  # the inspector's own connection, never the design's
        self.lease = lease.Lease(redis_url, lease.namespace(self.prefix), expire=not keep_dir) if external else None
        self.design = self.design_cls(self.client, self.prefix, scenario.settings(design_spec))
        self.window = scenario.drain_timeout or self.design.observe_window()
        self.configuration, self.warnings = library_settings(self.design)
        self.warn = warn
        self.ledger = Ledger(self.dir / "ledger")
        self.broker = broker
        url_file = str(broker.url_file) if broker else None
        settings = scenario.settings(design_spec)
        wspec = WorkerSpec(redis_url, self.design_cls, self.prefix, settings, scenario.workload(), url_file=url_file)
        self.producer: Producer | None = None
        self.broker_fault: BrokerFaultRecord | None = None
        parent = os.getpid()
        self.worker_python = worker_python
        spec_file = self.dir / "worker.json"
        spec_file.write_text(wspec.to_json(design_spec))

        def prepare(name: str) -> Callable[[], int]:
            path = self.ledger.path_for(name)
            if (wp := self.worker_python) is not None:
                argv = wp.argv(str(spec_file), name, str(path), str(parent))
                env = wp.env()
                return lambda: os.execve(wp.python, argv, env)
            return lambda: run_worker(wspec, name, path, parent)

        self.sup = Supervisor(prepare, self.dir / "logs", clock, tree=self.design_cls.own_worker)
        self.kills: list[KillRecord] = []
        self.exits: list[WorkerExit] = []
        self.phase = "starting"
        self.t0 = 0.0
        self._next_recover = 0.0
        self._next_progress = 0.0
        self._paused: dict[str, tuple[float, WorkerProcess]] = {}  # worker -> (resume at, process)
        self._held_at_fault: set[str] = set()  # the inspector's reading when the broker fault struck
        self.inspect_s = 0.0  # time spent reading Redis for the evidence
        self.enqueues: list[tuple[float, list[str]]] = []  # (harness clock, ids) sent before the workers start
        self.marks: list[tuple[float, str, int]] = []  # recovery passes, broker events, the drain's start
        self.depth: list[Depth] = []
        self._next_depth = 0.0
        self.started = 0.0  # wall clock at t0
        self.cut_off = False  # the drain hit its bound while the queue still made progress

    # -- the run ---------------------------------------------------------------------------------

    def execute(self) -> DesignRun:
        try:
            run = self._execute()
            if run.problems:  # the evidence behind a wrong report is worth keeping
                self.keep_dir = True
                run.workdir = str(self.dir)
            return run
        except (CrashbenchError, KeyboardInterrupt, redis.ConnectionError):
            raise
        except Exception as exc:
            # A design (or crashbench) raised where nothing expected it: never exit 1, which means a
            # threshold was violated. The ledgers and worker logs stay for a post-mortem.
            self.keep_dir = True
            raise UnexpectedError.from_exception(exc, f"{self.spec} ({self.phase})", self.dir) from exc
        finally:
            self.sup.stop_all(grace=self._grace())
            self.ledger.close()
            self.client.close()
            self.raw.close()
            if self.lease is not None:
                self.lease.close()
            if not self.keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:  # marked, so that the next run's orphan sweep leaves it alone
                workdirs.keep(self.dir)

    def _grace(self) -> float:
        # SIGTERM is a graceful stop: a worker first finishes the job it is in.
        return 1.0 + 2 * self.sc.longest_job_s

    def _execute(self) -> DesignRun:
        for text in self.warnings if self.warn is not None else ():
            self.warn(text)
        self.design.setup()
        ids = job_ids(self.sc.jobs)
        if self.broker is None:
            # Chunks built and sent one by one, the stop flag read between them: 10M jobs take over
            # 30 s to build and send, and Ctrl-C must not wait for that.
            for start in range(0, len(ids), 1000):
                if self.stop.raised:
                    raise Interrupted("interrupted while enqueueing: nothing left running")
                chunk = ids[start : start + 1000]
                self.enqueues.append((self.clock(), chunk))
                self.design.enqueue(_jobs(chunk))
        self.t0 = self.clock()
        self.started = time.time()
        for slot in range(self.sc.workers):
            self.sup.spawn(slot)
        self._wait_ready()

        self.phase = "faults"
        if self.broker is not None:
            self._broker_phase(_jobs(ids))
        for planned in plan_kills(self.sc):
            self.kills.append(self._inject(planned))
        faults_end = self.clock()

        self.phase = "draining"
        self.marks.append((self.clock(), "drain", -1))
        drained = self._drain(faults_end)
        drained_at = self.clock()

        self.phase = "counting"
        self._report(force=True)
        self.sup.stop_all(grace=self._grace())
        self._collect_exits()
        self.ledger.finish()  # every writer is gone: the last read, and a torn last record is reported
        # Every worker is stopped now, so every heartbeat is stale: advance the clock past the threshold.
        self.design.recover(self.clock() + self.sc.stale_after)
        return self._result(ids, drained, drained_at, faults_end)

    def _tick(self) -> None:
        if self.stop.raised:
            raise Interrupted("interrupted: workers stopped, nothing left running")
        self.ledger.poll()
        self._collect_exits()
        now = self.clock()
        for name, (resume_at, w) in list(self._paused.items()):
            if now >= resume_at:
                self.sup.thaw(w)
                del self._paused[name]
        if now >= self._next_recover and self.phase != "starting":
            gave_back = self._tolerant(lambda: self.design.recover(now), None)
            self.marks.append((now, "recover", gave_back if isinstance(gave_back, int) else -1))
            self._next_recover = now + self.sc.recover_every
        if now >= self._next_depth and self.phase != "starting":
            self._sample_depth(now)
        if self.lease is not None:
            self.lease.tick(now)  # the keys' safety expiry (crashbench.lease)
        self._report()

    def _report(self, force: bool = False) -> None:
        now = self.clock()
        if self.progress is None or (now < self._next_progress and not force):
            return
        self._next_progress = now + 0.1
        self.progress(
            Progress(
                self.spec,
                self.phase,
                self.sc.jobs,
                self.ledger.done,
                len(self.kills),
                self.sc.kills,
                len(self.sup.alive()),
                now - self.t0,
            )
        )

    def _collect_exits(self) -> None:
        for w in self.sup.reap():
            if w.signalled is not None:
                continue
            self.exits.append(WorkerExit(w.name, w.describe_exit(), w.log_tail()))
            if len(self.exits) > 2 * self.sc.workers:
                raise RunAborted(
                    f"{self.spec}: {len(self.exits)} workers exited on their own; the last one "
                    f"({w.name}, {w.describe_exit()}) logged:\n{w.log_tail()}"
                )
            if self.phase in ("starting", "faults", "draining"):
                self.sup.spawn(w.slot)

    def _sample_depth(self, now: float) -> None:
        """The queue's depth by the harness's own reading. Every DEPTH_EVERY seconds, or less often
        when the reading is slow (a large backlog): it costs at most 1/DEPTH_COST of the run."""
        started = self.clock()
        located = self._tolerant(self._locate, None)
        cost = self.clock() - started
        self._next_depth = now + max(self.DEPTH_EVERY, self.DEPTH_COST * cost)
        if located is None:
            return
        inside = {ex.job for w in self.sup.alive() for ex in self.ledger.open_in(w.name)}
        held = located.held.keys()
        pending = sum(1 for j in held if j not in located.delayed and j not in inside)
        self.depth.append(Depth(rel(now, self.t0), pending, len(inside), len(located.delayed), len(located.dead)))

    def _tolerant(self, call: Callable[[], T], down: T) -> T:
        """`call()`, or `down` while a broker fault has the server down (without one, errors propagate)."""
        if self.broker is None:
            return call()
        try:
            return call()
        except DOWN:
            return down

    def _broker_phase(self, jobs: list[Job]) -> None:
        """Produce during the run; kill (and restart) or fail over the server at `fault_at`."""
        assert self.broker is not None
        producer = self.producer = Producer(jobs, self.sc.produce_s, self.t0)
        due = self.t0 + self.sc.fault_at
        lag_due = due - self.sc.replica_lag if self.sc.replica_lag else None
        back_due: float | None = None
        while not producer.done or self.broker_fault is None or back_due is not None:
            self._tick()
            now = self.clock()
            producer.produce(self.design, now)
            if lag_due is not None and now >= lag_due:
                self.broker.cut_replica()
                self.marks.append((now, "replica_cut", -1))
                lag_due = None
            if lag_due is None and self.sc.replica_lag:
                producer.lagging = True
            if self.broker_fault is None and now >= due:
                # The harness's own reading of what the server holds as it dies: nothing runs in this
                # loop between this read and the fault, and workers only take jobs away meanwhile.
                held = set(self._locate().held)
                self._held_at_fault = held
                now = self.clock()
                self.broker_fault = BrokerFaultRecord(
                    self.sc.fault, self.sc.persistence, rel(now, self.t0), len(held),
                    sorted(held)[: tally.JOB_SAMPLE], len(producer.acknowledged),
                )  # fmt: skip
                if self.sc.fault == "failover":
                    self.broker.failover()
                    self.marks.append((now, "failover", -1))
                    self._reconnect()
                else:
                    self.broker.kill()
                    self.marks.append((now, "down", -1))
                    back_due = now + self.sc.downtime
            if back_due is not None and now >= back_due:
                self.broker.restart()
                wait_back(self.broker.url)
                back_due = None
            if self.broker_fault is not None and self.broker_fault.back_at is None and back_due is None:
                back_at = self.clock()
                self.broker_fault.back_at = rel(back_at, self.t0)
                self.marks.append((back_at, "up", -1))
            time.sleep(self.TICK)

    def _reconnect(self) -> None:
        """After a failover: the runner's own client and design, on the promoted replica."""
        self.client.close()
        self.raw.close()
        url = self.broker.url if self.broker else self.url
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.raw = inspector.raw_client(url)
        self.design = self.design_cls(self.client, self.prefix, self.sc.settings(self.spec))

    def _wait_ready(self) -> None:
        deadline = self.clock() + self.STARTUP_TIMEOUT
        while not all(self.ledger.ready_at(w.name) is not None for w in self.sup.slots.values()):
            if self.clock() > deadline:
                raise RunAborted(f"{self.spec}: workers not ready after {self.STARTUP_TIMEOUT:.0f} s")
            self._tick()
            time.sleep(self.TICK)

    def _inject(self, planned: PlannedKill) -> KillRecord:
        due = self.t0 + planned.at
        sig = self.sc.signum
        mid_job_wanted = self.sc.kill_when == "mid-job"
        # If no job reaches the victim (the queue ran dry), kill it anyway after a while, counted
        # from when it was due and ready; the record then says it was not mid-job.
        wait = max(self.MID_JOB_WAIT, 20 * self.sc.longest_job_s)
        while True:
            self._tick()
            now = self.clock()
            victim = self.sup.slots[planned.slot]
            ready = self.ledger.ready_at(victim.name)
            if now < due or ready is None or victim.name in self._paused:
                time.sleep(self.TICK)
                continue
            if mid_job_wanted and now < max(due, ready) + wait:
                if self.ledger.inside(victim.name) is None:
                    time.sleep(self.TICK / 10)
                    continue
                if not self._frozen_inside(victim):
                    continue
                return self._kill(planned, victim, sig, due, frozen=True)
            return self._kill(planned, victim, sig, due, frozen=False)

    def _frozen_inside(self, victim: WorkerProcess) -> bool:
        """Freeze the victim; keep it frozen only if it is inside a handler (checked after the freeze)."""
        if not self.sup.freeze(victim):
            self.sup.thaw(victim)
            return False
        self.ledger.poll(victim.name)
        if self.ledger.inside(victim.name) is None:
            self.sup.thaw(victim)
            return False
        return True

    def _kill(self, planned: PlannedKill, victim: WorkerProcess, sig: int, due: float, frozen: bool) -> KillRecord:
        at = self.clock()
        self.ledger.poll(victim.name)
        # Exact when frozen (checked after the freeze); for "any", as of this last look.
        opened = self.ledger.open_in(victim.name)
        replacement = None
        target = self.sc.kill_target if self.design_cls.own_worker else "worker"
        inside = opened[-1] if opened else None
        child = inside.pid if inside and inside.pid != victim.pid else 0
        if sig == signal.SIGSTOP:
            # A pause, not a death: the worker keeps its slot and resumes after `pause` seconds.
            self.sup.send(victim, sig)
            self._paused[victim.name] = (at + self.sc.pause, victim)
        else:
            target, killed = self.sup.deliver(victim, sig, target, child, frozen)
            if target != "child":
                replacement = self.sup.spawn(planned.slot)
            if sig == signal.SIGKILL:
                self.sup.wait_dead(victim if target != "child" else None, killed)
                opened = self._killed_inside(victim, child if target == "child" else 0)
                inside = opened[-1] if opened else None
        return KillRecord(
            index=planned.index,
            planned_at=planned.at,
            at=round(at - self.t0, 6),
            slot=planned.slot,
            worker=victim.name,
            pid=victim.pid,
            signal=signal.Signals(sig).name,
            target=target,
            mid_job=inside is not None,
            job=inside.job if inside else None,
            jobs=[ex.job for ex in opened],
            waited_ms=round((at - due) * 1000, 3),
            replacement=replacement.name if replacement else None,
        )

    def _killed_inside(self, victim: WorkerProcess, child: int) -> list[Execution]:
        """Once a SIGKILL landed and every process it hit is gone, the victim's ledger is final: the
        executions it died inside are what that ledger says alone (started, never ended), not an
        earlier look, oldest first. `child`: only that process died; its worker lives on and may have
        started another job."""
        self.ledger.poll(victim.name)
        opened = [ex for ex in self.ledger.open_in(victim.name) if not child or ex.pid == child]
        if child:
            self.ledger.abandon(victim.name, child)  # its executions will never end
        return opened

    def _drain(self, faults_end: float) -> bool:
        """Wait until the backlog is 0 and no worker is inside a handler. Give up once no handler has
        started for `window` seconds (the queue is stuck, or waits on a recovery timeout longer than
        the window): a slow queue that still makes progress is not cut off, a stuck one is not waited
        on forever. At most 10 windows after the last fault, whatever happens: a drain that hits that
        bound while handlers still start is `cut_off`, its backlog undrained rather than stranded."""
        next_check = 0.0
        settle, empty_since = self.design.SETTLE_S, None  # drained once empty for `settle` seconds
        deadline, hard = faults_end + self.window, faults_end + 10 * self.window
        started = len(self.ledger.executions)
        while (now := self.clock()) < min(deadline, hard):
            self._tick()
            if len(self.ledger.executions) != started:
                started = len(self.ledger.executions)
                deadline = now + self.window
            if now >= next_check:
                next_check = now + 0.02
                busy = any(self.ledger.inside(w.name) for w in self.sup.alive())
                if busy or self._tolerant(self.design.backlog, -1) != 0:
                    empty_since = None
                else:
                    empty_since = now if empty_since is None else empty_since
                    if now - empty_since >= settle:
                        return True
            time.sleep(self.TICK)
        self.cut_off = deadline > hard  # a handler started within the last window: still making progress
        return False

    # -- counting --------------------------------------------------------------------------------

    def _locate(self) -> Located:
        snapshot = inspector.take(self.raw, self.design.key_patterns())
        self.inspect_s += snapshot.taken_s
        return self.design.locate(snapshot)

    def _result(self, ids: list[str], drained: bool, drained_at: float, faults_end: float) -> DesignRun:
        state = self.design.state()
        located = self._locate()
        t0 = self.t0
        producer = self.producer
        if producer is not None:
            enqueues = [Enqueue(rel(t, t0), chunk, ok, lag) for t, chunk, ok, lag in producer.chunks]
        else:
            enqueues = [Enqueue(rel(t, t0), chunk) for t, chunk in self.enqueues]
        cls = self.design_cls
        tl = Timeline(
            index=self.index, spec=self.spec, variant=self.variant, prefix=self.prefix, repeat=self.repeat,
            scenario=self.sc.to_dict(), design=DesignFlags(cls.drops_failed, cls.own_worker, cls.exactly_once),
            t0=t0, started=self.started, window=self.window, produced=producer is not None,
            configuration=self.configuration, warnings=self.warnings, enqueues=enqueues,
            spawns=[Spawn(rel(w.spawned_at, t0), w.name, w.slot, w.pid) for w in self.sup.workers],
            ready={w.name: rel(r, t0) for w in self.sup.workers if (r := self.ledger.ready_at(w.name)) is not None},
            executions=[
                Execution(ex.job, ex.worker, rel(ex.start, t0), None if ex.end is None else rel(ex.end, t0),
                          ex.failed, ex.pid, ex.xid)
                for ex in self.ledger.executions
            ],
            ledger_problems=list(self.ledger.problems), planned=plan_kills(self.sc), kills=self.kills,
            marks=[Mark(rel(t, t0), what, n) for t, what, n in self.marks], depth=self.depth,
            broker_fault=self.broker_fault, exits=self.exits, held_at_fault=sorted(self._held_at_fault),
            located=located, state=state, faults_end=rel(faults_end, t0), drained_at=rel(drained_at, t0),
            drained=drained, cut_off=self.cut_off, inspect_s=round(self.inspect_s, 4),
            workdir=str(self.dir) if self.keep_dir else None,
        )  # fmt: skip
        return tally.design_run(tl)
