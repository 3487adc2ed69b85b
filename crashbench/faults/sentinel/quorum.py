"""sentinel-quorum: kill sentinels until the quorum is lost, then the primary. With one sentinel of three
left, none can agree the primary is down (a quorum of 2) nor be elected to fail it over (a majority of
the three): nothing is promoted, however long the primary stays dead. After `downtime` the killed
sentinels are started again, with what they had learned (their rewritten config files, as a restarted
sentinel on its host has), and the sentinels fail over: the outage is the quorum's loss plus a
promotion. Whether anything was promoted while the quorum was lost is read off the sentinels themselves:
the record's back_at before its quorum_back_at would say it was.
"""

from __future__ import annotations

from crashbench.faults.family import Band
from crashbench.faults.sentinel.kill import SentinelFaults
from crashbench.model.timeline import Timeline, rel

KIND = "sentinel-quorum"


class QuorumFaults(SentinelFaults):
    """Two sentinels SIGKILLed and the primary after them at the fault's time; the two started again
    after its duration; the fault lasts until the sentinels name another primary."""

    killed = False

    def step(self, now: float) -> None:
        topology = self.broker.topology
        if self.record is None and now >= self.t0 + self.fault.at:
            lost = topology.sentinels[1:]  # one of three is left: below the quorum and below a majority
            for sentinel in lost:
                sentinel.kill()
            self.mark(self.clock(), "quorum lost")
            self.killed = True
            self.kill_primary()
        elif self.down and self.killed and now >= self.t0 + self.fault.at + self.fault.duration:
            for sentinel in topology.sentinels[1:]:
                sentinel.restart()  # on its port, from its own config file: it knows the topology
            back = self.clock()
            assert self.record is not None
            self.record.quorum_back_at = rel(back, self.t0)
            self.killed = False
            self.mark(back, "quorum back")
        if self.down:
            self.await_promotion()  # while the quorum is lost too: a promotion then would be a finding


def bands(tl: Timeline) -> list[Band]:
    """The outage in two: no quorum (the primary dead, nobody able to promote), then the sentinels back
    and deciding, until the promotion."""
    f = tl.broker_fault
    if f is None or f.kind != KIND:
        return []
    back = f.quorum_back_at
    held = f"the primary held {f.held_at_fault} jobs"
    returned = f"the sentinels back at {back:.3f} s" if back is not None else "the sentinels never back"
    tip = f"two sentinels and the primary killed at {f.at:.3f} s ({held}); {returned}"
    lost = Band(f.at, back, KIND, "quorum lost, primary killed", tip)
    if back is None:
        return [lost]
    until = f"promoted at {f.back_at:.3f} s" if f.back_at is not None else "nothing promoted"
    return [
        lost,
        Band(back, f.back_at, f"{KIND} deciding", "sentinels back", f"the sentinels back at {back:.3f} s, {until}"),
    ]
