"""The hosts' driver, stepped from the run's loop (never a sleep): each planned host fault at its time,
healed `duration` s later, one after another on the same host as planned.

    host-crash      the workers on the host marked as the fault's (the run does not respawn them), its init
                    SIGKILLed (the kernel SIGKILLs every process in its PID namespace with it), each worker
                    waited for and its final ledger read: the jobs it was in. After the downtime a new
                    init (the reboot) and a new worker in each of its slots; over once each said READY.
    host-pause      every process on the host SIGSTOPped (listed from its PID namespace), SIGCONT after.
    host-partition  the host's packets to and from the server dropped (iptables, its network namespace);
                    with `apart`, its packets to and from those hosts instead (crashbench.faults.hosts.links).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crashbench.model.faults import Fault, HostFault
from crashbench.model.timeline import FaultEvent, rel

if TYPE_CHECKING:
    from crashbench.faults.hosts.machine import Hosts
    from crashbench.faults.hosts.ssh import SshHosts

FAMILY = "hosts"


@dataclass(slots=True)
class Doing:
    """One host fault as it goes: started (harness clock), healed, the new workers it waits READY from."""

    fault: HostFault
    started: float | None = None
    healed: float | None = None
    frozen: int = 0  # processes the pause stopped
    waiting: list[Any] = field(default_factory=list)  # WorkerProcess: a rebooted host's new workers

    @property
    def done(self) -> bool:
        return self.healed is not None and not self.waiting


class HostFaults:
    fine = False

    def __init__(self, planned: list[Fault], run: Any) -> None:
        self.doing = [Doing(f) for f in planned if isinstance(f, HostFault)]
        self.hosts: Hosts | SshHosts = run.net.hosts
        self.sup, self.ledger, self.clock, self.t0 = run.sup, run.ledger, run.clock, run.t0
        self.events: list[FaultEvent] = []

    @property
    def done(self) -> bool:
        return all(d.done for d in self.doing)

    def _event(self, what: str, t: float, **data: Any) -> None:
        self.events.append(FaultEvent(FAMILY, what, rel(t, self.t0), data))

    def step(self, now: float) -> None:
        for d in self.doing:
            f = d.fault
            busy = any(
                o.started is not None and not o.done for o in self.doing if o is not d and o.fault.host == f.host
            )
            if d.started is None and now >= self.t0 + f.at and not busy:
                self._start(d)
            elif d.started is not None and d.healed is None and now >= d.started + f.duration:
                self._heal(d)
            elif d.waiting:
                self._ready(d)

    def _start(self, d: Doing) -> None:
        f, host = d.fault, self.hosts.hosts[d.fault.host]
        if f.kind == "host-crash":
            victims = [w for s in host.slots if (w := self.sup.slots.get(s)) is not None and w.alive]
            for w in victims:
                w.signalled = signal.SIGKILL  # the fault's: the run neither counts nor respawns it
            host.crash()
            d.started = self.clock()  # as the kill lands (over SSH: after the connection, within its round trip)
            jobs: list[str] = []
            for w in victims:
                self.sup.wait_exit(w, 5.0)
                self.ledger.poll(w.name)  # final: nothing it started can end any more
                jobs += [ex.job for ex in self.ledger.open_in(w.name)]
            self._event("crash", d.started, index=f.index, host=f.host, slots=list(host.slots),
                        workers=[w.name for w in victims], jobs=jobs)  # fmt: skip
        elif f.kind == "host-pause":
            d.started = self.clock()
            d.frozen = host.pause()
            frozen = rel(self.clock(), self.t0)  # every one of them stopped, as the kernel reports
            self._event("pause", d.started, index=f.index, host=f.host, slots=list(host.slots),
                        processes=d.frozen, frozen_at=frozen)  # fmt: skip
        else:
            host.cut(f.apart)
            d.started = self.clock()
            self._event("partition", d.started, index=f.index, host=f.host, slots=list(host.slots),
                        apart=list(f.apart))  # fmt: skip

    def _heal(self, d: Doing) -> None:
        f, host = d.fault, self.hosts.hosts[d.fault.host]
        if f.kind == "host-crash":
            host.boot()
            d.healed = self.clock()
            d.waiting = [self.sup.spawn(s) for s in host.slots]
            self._event("boot", d.healed, index=f.index, host=f.host, workers=[w.name for w in d.waiting])
        elif f.kind == "host-pause":
            d.healed = self.clock()  # before the SIGCONTs: nothing on it runs before this moment
            host.resume()
            self._event("resume", d.healed, index=f.index, host=f.host)
        else:
            host.heal()
            d.healed = self.clock()
            self._event("heal", d.healed, index=f.index, host=f.host)

    def _ready(self, d: Doing) -> None:
        if all(self.ledger.ready_at(w.name) is not None for w in d.waiting):
            last = max(self.ledger.ready_at(w.name) for w in d.waiting)
            self._event("ready", last, index=d.fault.index, host=d.fault.host)
            d.waiting = []
