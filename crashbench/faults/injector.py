"""Fault injection: the planned faults (crashbench.faults), fired from the runner's loop, one step per
tick, never blocking it, so faults of different kinds overlap (a worker killed while the server is
down). Worker faults fire in order of their start; a broker fault and network faults at their own.

Every worker fault freezes its victim (SIGSTOP, until the kernel reports it stopped) before it reads
the fault's time and delivers the signal, so no handler of the victim starts or ends between the two:
the result settles each fault's verdict from the final ledger against that time, for every signal
(crashbench.evidence.signaled). A mid-job fault waits for its victim to be inside a handler: it freezes
the victim, checks the ledger again, and only then delivers the signal. After a SIGKILL, the
executions it interrupted are read from the victim's final ledger, once every process the signal hit
is gone.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from crashbench.control.proxyctl import ProxyProcess
from crashbench.control.supervisor import Supervisor, WorkerProcess
from crashbench.faults.broker import Broker, ReplicaCut, wait_back
from crashbench.faults.family import Producer
from crashbench.model.faults import JOB_SAMPLE, BrokerFaultRecord, Fault, NetworkFaultRecord, SignalRecord
from crashbench.model.ledger import Execution, Ledger
from crashbench.model.queue import Located
from crashbench.model.timeline import rel

if TYPE_CHECKING:
    from crashbench.faults.netns import Partitions

Clock = Callable[[], float]


class WorkerFaults:
    fine = True  # stepped 10x a tick while it waits for a victim to enter a handler (faults.family.Driver)
    MID_JOB_WAIT = 5.0  # seconds a mid-job fault waits for its victim to be inside a handler

    def __init__(
        self,
        planned: list[Fault],
        sup: Supervisor,
        ledger: Ledger,
        clock: Clock,
        own_worker: bool,  # the design's worker is a library's process tree (kill targets apply)
        longest_job_s: float,
    ) -> None:
        self.queue = deque(f for f in planned if f.on_worker and f.after != "drained")
        self.later = deque(f for f in planned if f.on_worker and f.after == "drained")  # fire_later's
        self.since = 0.0  # the queue's times count from t0 + since (the drain's end, for `later`)
        self.sup, self.ledger, self.clock = sup, ledger, clock
        self.own_worker = own_worker
        # If no job reaches the victim (the queue ran dry), it is hit anyway after a while (see
        # _give_up_at); the record then says it was not mid-job.
        self.wait = max(self.MID_JOB_WAIT, 20 * longest_job_s)
        self.starts_seen = 0  # handler starts in the ledgers as last seen, and when they last grew
        self.last_start: float | None = None
        self.t0 = 0.0
        self.records: list[SignalRecord] = []
        self.paused: dict[str, tuple[float, WorkerProcess]] = {}  # worker -> (resume at, process)
        self.healed: list[tuple[float, str]] = []  # (harness clock, worker): a pause's end, SIGCONT sent

    @property
    def done(self) -> bool:
        return not self.queue

    @property
    def total(self) -> int:
        return len(self.records) + len(self.queue) + len(self.later)

    def fire_later(self, tick: Callable[[], None], period: float) -> None:
        """The faults timed from the queue's drain (after = "drained"), fired from now on: the runner
        calls this once its queue has drained, and `tick` between steps as its fault loop does."""
        self.queue, self.later = self.later, deque()
        self.since = self.clock() - self.t0
        while self.queue:
            tick()
            time.sleep(period / 10 if self.step(self.clock()) else period)

    def thaw_due(self, now: float) -> None:
        for name, (resume_at, w) in list(self.paused.items()):
            if now >= resume_at:
                self.sup.thaw(w)
                del self.paused[name]
                self.healed.append((self.clock(), name))

    def step(self, now: float) -> bool:
        """Fire the next worker fault if it can fire now. True: it waits for its victim to enter a
        handler (the loop should look again soon)."""
        if not self.queue:
            return False
        fault = self.queue[0]
        due = self.t0 + self.since + fault.at
        victim = self.sup.slots[fault.slot]
        ready = self.ledger.ready_at(victim.name)
        if now < due or ready is None or victim.name in self.paused:
            return False
        if fault.kill_when == "mid-job" and now < self._give_up_at(max(due, ready), now):
            self.ledger.poll(victim.name)  # the latest word: a short job may be over by the next tick
            if self.ledger.inside(victim.name) is None or not self._frozen_inside(victim):
                return True
            self.records.append(self._hit(fault, victim, due))
        else:
            self.sup.freeze(victim)  # stopped as the fault's time is read (or as good as: gone, or stuck)
            self.records.append(self._hit(fault, victim, due))
        self.queue.popleft()
        return False

    def _give_up_at(self, since: float, now: float) -> float:
        """When a mid-job fault stops waiting for its victim to enter a handler: `wait` after it was
        due and its victim READY, and after the latest handler start seen anywhere in the run. While
        handlers still start there is work the victim can take (a library's worker may say READY
        seconds before it consumes, and a loaded machine runs everything late); once none has started
        for `wait`, the queue ran dry (or is stuck) and the victim is hit anyway. Before any handler
        started anywhere: three times as long, so a design that never runs one is still hit."""
        if (n := len(self.ledger.executions)) != self.starts_seen:
            self.starts_seen, self.last_start = n, now
        if self.last_start is None:
            return since + 3 * self.wait
        return max(since, self.last_start) + self.wait

    def _frozen_inside(self, victim: WorkerProcess) -> bool:
        """Freeze the victim; keep it frozen only if it is inside a handler (checked after the freeze).
        The process the ledger says runs the handler is stopped first, before the tree is listed."""
        inside = self.ledger.inside(victim.name)
        if inside is not None:
            self.sup.stop_first(victim, inside.pid)
        if not self.sup.freeze(victim):
            self.sup.thaw(victim)
            return False
        self.ledger.poll(victim.name)
        if self.ledger.inside(victim.name) is None:
            self.sup.thaw(victim)
            return False
        return True

    def _hit(self, fault: Fault, victim: WorkerProcess, due: float) -> SignalRecord:
        at = self.clock()
        sig = int(signal.Signals[fault.signal])
        self.ledger.poll(victim.name)
        # The victim is frozen: this look is what it holds at `at` (bar a record not yet written).
        opened = self.ledger.open_in(victim.name)
        replacement = None
        target = fault.target if self.own_worker else "worker"
        inside = opened[-1] if opened else None
        # The ledger's pids are the worker's own (a host's PID namespace's): so is `child`, and so it is recorded.
        child = inside.pid if inside and inside.pid != self.sup.own_pid(victim) else 0
        if sig == signal.SIGSTOP:
            # A pause, not a death: the worker keeps its slot and resumes after `duration` seconds.
            self.sup.send(victim, sig)
            self.paused[victim.name] = (at + fault.duration, victim)
        else:
            target, killed = self.sup.deliver(victim, sig, target, child, frozen=True)
            if target != "child":
                replacement = self.sup.spawn(fault.slot)
            if sig == signal.SIGKILL:
                self.sup.wait_dead(victim if target != "child" else None, killed)
                opened = self._killed_inside(victim, child if target == "child" else 0)
                inside = opened[-1] if opened else None
        return SignalRecord(
            index=fault.index, planned_at=round(self.since + fault.at, 6), at=rel(at, self.t0), slot=fault.slot,
            worker=victim.name, pid=victim.pid, signal=fault.signal, target=target, mid_job=inside is not None,
            job=inside.job if inside else None, jobs=[ex.job for ex in opened], waited_ms=round((at - due) * 1000, 3),
            replacement=replacement.name if replacement else None, child=child if target == "child" else 0,
        )  # fmt: skip

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


class BrokerFaults:
    """The producer and the server's own fault (crashbench.faults.broker): the replica cut `replica_lag` s
    before a failover, the kill and the restart `downtime` later, or the failover."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(
        self,
        planned: list[Fault],
        broker: Broker,
        producer: Producer,
        replica_lag: float,
        persistence: str,
        locate: Callable[[], Located],
        reconnect: Callable[[], None],
        mark: Callable[[float, str], None],
        clock: Clock,
    ) -> None:
        self.fault = next(f for f in planned if f.kind in ("broker-kill", "failover", "power-loss"))
        self.broker, self.producer = broker, producer
        self.persistence = persistence
        self.locate, self.reconnect, self.mark, self.clock = locate, reconnect, mark, clock
        self.t0 = 0.0
        self.record: BrokerFaultRecord | None = None
        self.held_at_fault: set[str] = set()  # the harness's reading when the fault struck
        self.held_after_promotion: set[str] = set()  # read on a cluster only (crashbench.faults.cluster)
        self._cut = ReplicaCut(self.broker.cut_replica, self.producer, replica_lag, self.mark, self.clock)
        self._back_due: float | None = None

    @property
    def down(self) -> bool:
        """Struck and not back yet: the server (the shard's primary) answers nothing meanwhile."""
        return self.record is not None and self.record.back_at is None

    @property
    def done(self) -> bool:
        return self.producer.done and self.record is not None and self._back_due is None

    def step(self, now: float) -> None:
        due = self._cut.step(now, self.t0 + self.fault.at)
        if self.record is None and now >= due:
            # The harness's own reading of what the server holds as it dies: nothing runs in this
            # loop between this read and the fault, and every client's writes wait meanwhile, so the
            # reading is a snapshot (a job moving into a key the reading's SCAN had not listed yet
            # would otherwise be read nowhere). The fault ends the pause.
            self.broker.pause_writes()
            held = set(self.locate().held)
            self.held_at_fault = held
            now = self.clock()
            kind = self.fault.kind  # broker-kill, power-loss (its kill cuts the power: faults.power) or failover
            self.record = BrokerFaultRecord(
                kind, self.persistence, rel(now, self.t0), len(held), sorted(held)[:JOB_SAMPLE],
                self.producer.acknowledged,
            )  # fmt: skip
            if kind == "failover":
                self.broker.failover()
                self.mark(now, "failover")
                self.reconnect()
                self.producer.lagging = False  # its enqueues go to the promoted replica from now on
            else:
                self.broker.kill()
                self.mark(now, "down")
                self._back_due = now + self.fault.duration
        if self._back_due is not None and now >= self._back_due:
            self.broker.restart()
            wait_back(self.broker.url)
            self._back_due = None
        if self.record is not None and self.record.back_at is None and self._back_due is None:
            back_at = self.clock()
            self.record.back_at = rel(back_at, self.t0)
            self.mark(back_at, "up")


class NetworkFaults:
    """Network faults through the proxy (crashbench.control.proxy), or as partitions (crashbench.faults.netns):
    each is switched on at its start and healed at its end. Toxics on one proxy slot at once add up; of
    partitions on one slot, the latest started holds. The proxy's slots: one per worker slot, then the
    producer's (`workers`), then the replica link's (`workers + 1`).

    A fault on the replica link first has the harness wait until the replica confirms everything the
    primary acknowledged (`sync_replica`), so "acknowledged while the link was cut" is exact, and marks
    the producer's enqueues from then on as lagging (what a failover may lose, as with replica_lag)."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(
        self, planned: list[Fault], proxy: ProxyProcess | None, clock: Clock, workers: int,
        producer: Producer | None = None, sync_replica: Callable[[], None] | None = None,
        partitions: Partitions | None = None,
    ) -> None:  # fmt: skip
        self.waiting = deque(f for f in planned if f.kind == "network")
        self.proxy, self.partitions, self.clock, self.workers = proxy, partitions, clock, workers
        self.producer, self.sync_replica = producer, sync_replica
        self.t0 = 0.0
        self.on: list[tuple[Fault, NetworkFaultRecord]] = []  # started, not healed
        self.records: list[NetworkFaultRecord] = []

    def proxy_slots(self, fault: Fault) -> tuple[int, ...]:
        return {"producer": (self.workers,), "replica": (self.workers + 1,)}.get(fault.target, fault.slots)

    @property
    def done(self) -> bool:
        """Every fault started; those with an end healed (the drain waits for nothing else)."""
        return not self.waiting and not any(f.duration for f, _ in self.on)

    def step(self, now: float) -> None:
        changed: set[int] = set()
        while self.waiting and now >= self.t0 + self.waiting[0].at:
            fault = self.waiting.popleft()
            if fault.target == "replica" and self.sync_replica is not None:
                self.sync_replica()
            record = NetworkFaultRecord(
                fault.index, fault.toxic["name"], list(fault.slots), rel(self.clock(), self.t0), None, fault.target
            )
            self.on.append((fault, record))
            self.records.append(record)
            changed |= set(self.proxy_slots(fault))
        for fault, record in list(self.on):
            if fault.duration and now >= self.t0 + fault.at + fault.duration:
                self.on.remove((fault, record))
                record.healed_at = rel(self.clock(), self.t0)
                changed |= set(self.proxy_slots(fault))
        for slot in sorted(changed):
            toxics = [f.toxic for f, _ in self.on if slot in self.proxy_slots(f)]
            if self.partitions is not None:
                if toxics:
                    self.partitions.apply(slot, toxics[-1]["name"], toxics[-1].get("probability", 0.0))
                else:
                    self.partitions.heal(slot)
            elif self.proxy is not None:
                self.proxy.set([slot], toxics)
        if self.producer is not None and any(f.target == "replica" for f, _ in self.on):
            self.producer.lagging = True  # from the first cut on, as broker.replica_lag: what may be lost
