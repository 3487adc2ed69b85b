"""One crash run of one design: enqueue, start workers, inject the fault schedule, drain, count.

Single-threaded on purpose: the main loop (`_tick`) tails the ledger, reaps workers, runs the
design's recovery on its timer and reports progress; signal handlers only set a flag it reads.
Every process started here is stopped in `finally`, whatever happened.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TypeVar

import psutil
import redis

from crashbench import counts as counting
from crashbench import evidence, inspector, workdirs
from crashbench.broker import Broker, Producer, wait_back
from crashbench.designs import Design, Job, Located, load_design, safe_name
from crashbench.errors import CrashbenchError, Interrupted, RunAborted, UnexpectedError
from crashbench.faults import PlannedKill, plan_kills
from crashbench.interpreter import WorkerPython
from crashbench.ledger import Ledger
from crashbench.results import BrokerFaultRecord, DesignRun, KillRecord, Timings, WorkerExit
from crashbench.scenario import Scenario
from crashbench.supervisor import Supervisor, WorkerProcess
from crashbench.worker import DOWN, WorkerSpec, run_worker
from crashbench.workload import job_ids

Clock = Callable[[], float]
T = TypeVar("T")
JOB_SAMPLE = 100  # ids listed per outcome class in a result; the counts are always complete


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


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


class StopFlag:
    """SIGINT/SIGTERM set a flag for the main loop; a second one interrupts at once."""

    def __init__(self) -> None:
        self.raised = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raised:
            raise KeyboardInterrupt
        self.raised = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


class CrashRun:
    STARTUP_TIMEOUT = 30.0  # a library worker under load can take seconds to come up
    TICK = 0.005  # main-loop period; waiting for a victim to enter a handler polls 10x faster
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
    ) -> None:
        self.sc = scenario
        self.spec = design_spec
        self.design_cls: type[Design] = load_design(design_spec)
        self.prefix = f"crashbench:{run_id}:{index}-{safe_name(design_spec)}:"
        self.variant = variant
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
        self.design = self.design_cls(self.client, self.prefix, scenario.settings(design_spec))
        self.window = scenario.drain_timeout or self.design.observe_window()
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
        self._fault_at: float | None = None  # when the broker fault struck (harness clock)
        self._back_at: float | None = None  # when the server answered again
        self._held_at_fault: set[str] = set()  # the inspector's reading when the broker fault struck
        self.inspect_s = 0.0  # time spent reading Redis for the evidence
        self._hit: set[int] = set()  # executions a SIGKILL was recorded inside (by id())

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
            if not self.keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def _grace(self) -> float:
        # SIGTERM is a graceful stop: a worker first finishes the job it is in.
        return 1.0 + 2 * self.sc.longest_job_s

    def _execute(self) -> DesignRun:
        self.design.setup()
        ids = job_ids(self.sc.jobs)
        jobs = [Job(j, f'{{"n": {int(j)}}}') for j in ids]
        if self.broker is None:
            for start in range(0, len(jobs), 1000):
                self.design.enqueue(jobs[start : start + 1000])
        self.t0 = self.clock()
        for slot in range(self.sc.workers):
            self.sup.spawn(slot)
        self._wait_ready()

        self.phase = "faults"
        if self.broker is not None:
            self._broker_phase(jobs)
        for planned in plan_kills(self.sc):
            self.kills.append(self._inject(planned))
        faults_end = self.clock()

        self.phase = "draining"
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
            self._tolerant(lambda: self.design.recover(now), None)
            self._next_recover = now + self.sc.recover_every
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
                    self.sc.fault, self.sc.persistence, round(now - self.t0, 4), len(held), sorted(held)[:JOB_SAMPLE],
                    len(producer.acknowledged),
                )  # fmt: skip
                self._fault_at = now
                if self.sc.fault == "failover":
                    self.broker.failover()
                    self._reconnect()
                else:
                    self.broker.kill()
                    back_due = now + self.sc.downtime
            if back_due is not None and now >= back_due:
                self.broker.restart()
                wait_back(self.broker.url)
                back_due = None
            if self.broker_fault is not None and self.broker_fault.back_at is None and back_due is None:
                self._back_at = self.clock()
                self.broker_fault.back_at = round(self._back_at - self.t0, 4)
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
        inside = self.ledger.inside(victim.name)
        replacement = None
        target = self.sc.kill_target if self.design_cls.own_worker else "worker"
        child = inside.pid if inside and inside.pid != victim.pid else 0
        killed: list[psutil.Process] = []  # the processes below the victim that got the signal
        if sig == signal.SIGSTOP:
            # A pause, not a death: the worker keeps its slot and resumes after `pause` seconds.
            self.sup.send(victim, sig)
            self._paused[victim.name] = (at + self.sc.pause, victim)
        elif target == "child" and child and (proc := self.sup.send_below(victim, child, sig)):
            # Only the process running the job: the worker lives on and deals with its loss.
            if frozen:
                self.sup.thaw(victim)
            if sig == signal.SIGKILL:
                psutil.wait_procs([proc], timeout=5.0)
            killed = [proc]
        else:
            if target == "child":
                target = "worker"  # the job runs in the worker process itself
            rest = self.sup.below(victim) if target == "parent" else []
            victim.signalled = sig
            killed = self.sup.send(victim, sig, whole_tree=target != "parent")
            for p in rest if frozen else []:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGCONT)  # the orphans go on as they would
            if frozen and sig != signal.SIGKILL:
                self.sup.thaw(victim)  # let it act on the signal
            replacement = self.sup.spawn(planned.slot)
            if sig == signal.SIGKILL:
                self.sup.wait_exit(victim, 5.0)
                psutil.wait_procs(killed, timeout=5.0)
        if sig == signal.SIGKILL:
            # Every process that got the SIGKILL is gone, so the victim's ledger is final: mid-job is
            # what it says alone (an execution it started and never ended), not an earlier look.
            self.ledger.poll(victim.name)
            opened = self.ledger.open_in(victim.name)
            if target == "child":  # the worker lives on and may have started another job since
                opened = [ex for ex in opened if ex.pid == child]
            opened = [ex for ex in opened if id(ex) not in self._hit]  # not one an earlier fault left open
            inside = opened[-1] if opened else None
            if inside is not None:
                self._hit.add(id(inside))
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
            waited_ms=round((at - due) * 1000, 3),
            replacement=replacement.name if replacement else None,
        )

    def _drain(self, faults_end: float) -> bool:
        """Wait until the backlog is 0 and no worker is inside a handler. Give up once no handler has
        started for `window` seconds (the queue is stuck, or waits on a recovery timeout longer than
        the window): a slow queue that still makes progress is not cut off, a stuck one is not waited
        on forever. At most 10 windows after the last fault, whatever happens."""
        next_check = 0.0
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
                if not busy and self._tolerant(self.design.backlog, -1) == 0:
                    return True
            time.sleep(self.TICK)
        return False

    # -- counting --------------------------------------------------------------------------------

    def _locate(self) -> Located:
        snapshot = inspector.take(self.raw, self.design.key_patterns())
        self.inspect_s += snapshot.taken_s
        return self.design.locate(snapshot)

    def _recovery_ms(self, k: KillRecord) -> float | None:
        """Fault -> the next start of the job the victim was inside, by anyone: how long recovery took;
        +inf when it never started again nor completed (a job the queue never gave back)."""
        if k.job is None:
            return None
        at = self.t0 + k.at
        runs = [ex for ex in self.ledger.executions if ex.job == k.job]
        later = [ex.start for ex in runs if ex.start > at]
        if later:
            return round((min(later) - at) * 1000, 3)
        if any(ex.completed and ex.end is not None and ex.end > at for ex in runs):
            return None  # it finished where it was (a pause, a graceful stop): nothing to recover
        return math.inf

    def _result(self, ids: list[str], drained: bool, drained_at: float, faults_end: float) -> DesignRun:
        state = self.design.state()
        located = self._locate()
        # A parent-only kill leaves the job running in an orphan, which may finish it: no claim to check.
        kills = [evidence.KillFact(k.worker, k.signal, k.mid_job, k.job) for k in self.kills if k.target != "parent"]
        problems = evidence.check(
            evidence.Evidence(
                enqueued=ids, executions=self.ledger.executions, located=located, state=state, drained=drained,
                own_worker=self.design_cls.own_worker, kills=kills,
                ledger_problems=self.ledger.problems,
                acknowledged=self.producer.acknowledged if self.producer else None,
                indeterminate=self.producer.indeterminate if self.producer else None,
            )
        )  # fmt: skip
        c, classes = counting.count(
            ids,
            self.ledger.executions,
            located,
            state,
            drops_failed=self.design_cls.drops_failed,
            kills=len(self.kills),
            kills_mid_job=sum(k.mid_job for k in self.kills),
            workload=self.sc.workload(),
            settings=self.sc.settings(),
            indeterminate=self.producer.indeterminate if self.producer else (),
            broker_fault=(self._fault_at, self._back_at or self._fault_at) if self._fault_at is not None else None,
        )
        completed = self.ledger.completed
        c.undrained = 0 if drained else max(1, len(located.held))
        c.worker_crashes = len(self.exits)
        c.held_at_fault = sum(1 for j in self._held_at_fault if not completed[j])
        if self.producer is not None:
            c.acked_during_lag = sum(1 for j in self.producer.acked_during_lag if not completed[j])
        for k in self.kills:
            ready = self.ledger.ready_at(k.replacement) if k.replacement else None
            if ready is not None:
                k.replacement_ready_ms = round((ready - (self.t0 + k.at)) * 1000, 3)
            k.recovered_after_ms = self._recovery_ms(k)
        recoveries = sorted(k.recovered_after_ms for k in self.kills if k.recovered_after_ms is not None)
        c.unrecovered = sum(1 for r in recoveries if math.isinf(r))
        startups = [
            (ready - w.spawned_at) * 1000
            for w in self.sup.workers
            if (ready := self.ledger.ready_at(w.name)) is not None
        ]
        restarts = [k.replacement_ready_ms for k in self.kills if k.replacement_ready_ms is not None]
        wall = drained_at - self.t0
        timings = Timings(
            wall_s=round(wall, 4),
            jobs_per_s=round(c.done / wall, 2) if wall > 0 else 0.0,
            ideal_s=round(self.sc.ideal_s, 4),
            drained=drained,
            drain_s=round(drained_at - faults_end, 4),
            window_s=self.window,
            startup_ms_median=round(statistics.median(startups), 3) if startups else 0.0,
            startup_ms_max=round(max(startups), 3) if startups else 0.0,
            restart_ms_median=round(statistics.median(restarts), 3) if restarts else None,
            recovery_ms_p50=percentile(recoveries, 0.50),
            recovery_ms_p95=percentile(recoveries, 0.95),
            recovery_ms_max=recoveries[-1] if recoveries else None,
            inspect_s=round(self.inspect_s, 4),
        )
        return DesignRun(
            design=self.spec,
            variant=self.variant,
            prefix=self.prefix,
            seed=self.sc.seed,
            counts=c,
            timings=timings,
            kills=self.kills,
            repeat=self.repeat,
            schedule=plan_kills(self.sc),
            broker_fault=self.broker_fault,
            worker_exits=self.exits,
            duplicates=dict(sorted((j, n) for j, n in self.ledger.completed.items() if n > 1)[:JOB_SAMPLE]),
            workdir=str(self.dir) if self.keep_dir else None,
            jobs={
                k: sorted(classes[k])[:JOB_SAMPLE]
                for k in ("lost", "stranded", "dead_lettered", "failed", "unconfirmed")
            },
            problems=problems,
            total_queue=counting.total_queue(c, self.design_cls.exactly_once),
        )
