"""sentinel-kill: SIGKILL the topology's primary; the fault lasts until the sentinels name another. Its
driver is the base of the family's other primary kills (quorum.py)."""

from __future__ import annotations

from typing import Any

from crashbench.faults.broker import pause_writes
from crashbench.model.faults import BrokerFaultRecord, Fault
from crashbench.model.timeline import rel

KIND = "sentinel-kill"
JOB_SAMPLE = 100  # held ids kept in the record, as the broker family keeps them


class SentinelFaults:
    """Kill the primary at the fault's time; the fault lasts until the sentinels name another one."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(self, fault: Fault, run: Any) -> None:
        self.fault, self.broker, self.producer = fault, run.broker, run.producer
        self.locate, self.reconnect, self.mark, self.clock = run.locate, run.reconnect, run.mark, run.clock
        self.persistence = run.sc.broker.persistence
        self.t0 = run.t0
        self.record: BrokerFaultRecord | None = None
        self.held_at_fault: set[str] = set()
        self.held_after_promotion: set[str] = set()

    @property
    def down(self) -> bool:
        return self.record is not None and self.record.back_at is None

    @property
    def done(self) -> bool:
        return self.producer.done and self.record is not None and self.record.back_at is not None

    def step(self, now: float) -> None:
        if self.record is None and now >= self.t0 + self.fault.at:
            self.kill_primary()
        elif self.down:
            self.await_promotion()

    def kill_primary(self) -> None:
        """SIGKILL the primary, after the harness's reading of what it held (its writes paused meanwhile)."""
        primary = self.broker.topology.primary
        pause_writes(primary.url)  # the harness's reading as the primary dies is a snapshot
        self.held_at_fault = held = set(self.locate().held)
        now = self.clock()
        self.record = BrokerFaultRecord(
            self.fault.kind, self.persistence, rel(now, self.t0), len(held), sorted(held)[:JOB_SAMPLE],
            self.producer.acknowledged,
        )  # fmt: skip
        primary.kill()
        self.mark(now, "down")

    def await_promotion(self) -> None:
        """Once the sentinels name another primary: the fault's end, the harness on the promoted one."""
        if self.broker.promoted():
            back = self.clock()
            assert self.record is not None
            self.record.back_at = rel(back, self.t0)
            self.mark(back, "promoted")
            self.reconnect()
