"""sentinel-partition: a split brain. The topology's primary cut off from the sentinels, its replicas and
every client that found it through the sentinels, while a minority goes on writing to it: the producer
(whose enqueues the old primary acknowledges are Jepsen's lost writes) and the first
`[broker] minority_workers` worker slots, all of them given the primary's own port.

    at the fault    the primary's writes paused, its replicas caught up with it (so that what misses
                    them is exactly what it acknowledges from now on) and read by the harness, then the
                    partition (SentinelTopology.cut: silent, as dropped packets are) and the primary's
                    clients let go on. (A replica's client writes cannot be paused instead, as the cluster
                    faults do: the sentinels' PUBLISH on it would wait, and they would find it down.)
    the promotion   the sentinels find it down (DOWN_AFTER_MS), agree and promote a replica on their own;
                    the moment any of them names it is the promotion (`back_at`). What it took over with is
                    its reading at the cut: cut off from its primary and refusing client writes, a replica
                    cannot change meanwhile, which the offset it took over at confirms (the checker
                    compares it with the primary's at the cut). Once it has the replicas
                    min-replicas-to-write asks for, the harness follows it, as every client of the
                    sentinels does
    the heal        `downtime` s after the promotion: the old primary's client writes paused for good
                    (PAUSE_MS: until the sentinels turn it into a replica of the new one, which they do some
                    8 s after they reach it again, and throw away what it alone took), its last word read,
                    the minority's workers' address file pointed at the sentinels (they time out on it
                    and reconnect there), the producer moved to the harness's own client (the sentinels'),
                    and the partition gone

With min-replicas-to-write the old primary refuses writes (NOREPLICAS) once its replicas' acknowledgements
are older than min-replicas-max-lag: the producer's enqueues from then on are refused (indeterminate, never
lost), and the minority's workers can no longer take jobs from it.

Counts (the split_brain checker; the broker checker's not_replicated compares both sides' readings):
acked_on_old_primary, refused_on_old_primary, old_primary_only, workers_on_old_primary.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from crashbench.errors import ServerUnavailable
from crashbench.evidence.checker import History, Section, Sections, checker
from crashbench.faults.family import Band
from crashbench.faults.sentinel.broker import MINORITY_NAME
from crashbench.model.counts import Problem
from crashbench.model.faults import JOB_SAMPLE, BrokerFaultRecord, Fault
from crashbench.model.queue import EnqueueUnconfirmed, Job
from crashbench.model.timeline import FaultEvent, Timeline, rel

KIND = "sentinel-partition"
PAUSE_MS = 30_000  # the longest the old primary's writes wait after the heal (its demotion comes first)
PROMOTION_TIMEOUT_S = 30.0
CATCH_UP_S = 5.0  # the longest the replicas get to catch up with the paused primary before the cut
PRODUCER_NAME = "crashbench-producer"
ACTIVE_S = 1  # a connection idle no longer than this (CLIENT LIST's idle, whole seconds) is in use


class OldPrimaryEnqueues:
    """The producer's enqueues on the old primary's own port (the producer's `through`): one attempt each,
    bounded; one that raised (refused with NOREPLICAS, or unanswered) is not acknowledged."""

    def __init__(self, design: Any) -> None:
        self.design = design

    def enqueue(self, chunk: list[Job]) -> bool:
        try:
            self.design.enqueue(chunk)
        except (redis.RedisError, EnqueueUnconfirmed):
            return False
        return True

    def close(self) -> None:
        self.design.r.close()


class SplitBrain:
    """The partition, from the run's loop: cut at the fault's time, the promoted replica read as the
    sentinels name it, healed `duration` s later (see the module's text)."""

    fine = False  # stepped once a tick (crashbench.faults.family.Driver)

    def __init__(self, fault: Fault, run: Any) -> None:
        self.fault, self.broker, self.producer = fault, run.broker, run.producer
        self.topology = run.broker.topology
        self.locate, self.reconnect, self.mark, self.clock = run.locate, run.reconnect, run.mark, run.clock
        self.persistence, self.t0 = run.sc.broker.persistence, run.t0
        self.min_replicas = run.sc.broker.min_replicas_to_write
        self.record: BrokerFaultRecord | None = None
        self.held_at_fault: set[str] = set()  # the old primary's last word, as the partition heals
        self.held_after_promotion: set[str] = set()
        self.events: list[FaultEvent] = []
        self.state = "before"  # cut, promoting (the promoted replica read, waiting for its replicas), promoted, healed
        self._promoted: tuple[str, int] | None = None
        self._at_cut: dict[int, set[str]] = {}  # each replica's reading at the cut, by port
        self._heal_at = 0.0
        self._deadline = 0.0
        primary = self.topology.primary
        client = redis.Redis(
            host="127.0.0.1", port=primary.port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2,
            retry=Retry(NoBackoff(), 0), client_name=PRODUCER_NAME,
        )  # fmt: skip
        self.old = OldPrimaryEnqueues(run.design_cls(client, run.prefix, run.sc.settings(run.spec)))
        self.producer.through = self.old  # the producer is on the old primary's side from the start

    @property
    def down(self) -> bool:
        """No primary the sentinels' clients can reach: from the cut until the promoted replica is theirs."""
        return self.state in ("cut", "promoting")

    @property
    def done(self) -> bool:
        return self.producer.done and self.state == "healed"

    def step(self, now: float) -> None:
        if self.state == "before" and now >= self.t0 + self.fault.at:
            self._cut()
        elif self.state == "cut":
            self._watch(now)
        elif self.state == "promoting" and self._has_replicas():
            self.state = "promoted"
            self.reconnect()  # the runner's client and design, on the promoted replica (the sentinels' primary)
        elif self.state == "promoted" and now >= self._heal_at:
            self._heal()

    def _cut(self) -> None:
        """The primary's writes paused, its replicas caught up and read, the partition made, its writes let go."""
        primary = ("127.0.0.1", self.topology.primary.port)
        self._call(primary, "CLIENT", "PAUSE", 2000, "WRITE")
        offset = int(self._info(primary)["master_repl_offset"])
        deadline = time.monotonic() + CATCH_UP_S
        for replica in self.topology.replicas:
            while int(self._info(("127.0.0.1", replica.port))["master_repl_offset"]) < offset:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(f"the replica on port {replica.port} did not catch up with its primary")
                time.sleep(0.002)
            self._at_cut[replica.port] = self._held(("127.0.0.1", replica.port))
        self.topology.cut()
        self._call(primary, "CLIENT", "UNPAUSE")
        now = self.clock()
        self.record = BrokerFaultRecord(
            KIND, self.persistence, rel(now, self.t0), 0, [], self.producer.acknowledged, primary_offset=offset
        )
        self.producer.lagging = True  # its enqueues from now on reach the old primary alone
        self.state, self._deadline = "cut", time.monotonic() + PROMOTION_TIMEOUT_S
        self.mark(now, "partition")

    def _watch(self, now: float) -> None:
        """Whether any sentinel names another primary; if so, what it took over with: its reading at the
        cut, when it can have changed no more (its replication cut, client writes refused), which the
        offset it took over at confirms (the checker compares it with the primary's at the cut)."""
        cut_off = ("127.0.0.1", self.topology.monitored_port)
        promoted = next((a for a in self.topology.named() if a != cut_off), None)
        if promoted is None:
            if time.monotonic() > self._deadline:
                raise ServerUnavailable(f"the sentinels promoted no replica within {PROMOTION_TIMEOUT_S:.0f} s")
            return
        at = self.clock()
        assert self.record is not None
        self.held_after_promotion = self._at_cut.get(promoted[1], set())
        self.record.back_at, self.record.promoted_held = rel(at, self.t0), len(self.held_after_promotion)
        # second_repl_offset is one past the offset it took over at
        self.record.promoted_offset = int(self._info(promoted).get("second_repl_offset", 0)) - 1
        self.broker.primary, self._promoted = promoted, promoted
        self.state, self._heal_at = "promoting", at + self.fault.duration
        self.mark(at, "promoted")

    def _held(self, address: tuple[str, int]) -> set[str]:
        reader = redis.Redis(host=address[0], port=address[1], socket_timeout=10)
        try:
            return set(self.locate(reader).held)
        finally:
            reader.close()

    def _has_replicas(self) -> bool:
        """The promoted replica has the replicas min-replicas-to-write asks for (at once without it)."""
        if not self.min_replicas:
            return True
        assert self._promoted is not None
        return int(self._info(self._promoted).get("min_slaves_good_slaves", 0)) >= self.min_replicas

    def _heal(self) -> None:
        assert self.record is not None
        primary = ("127.0.0.1", self.topology.primary.port)
        clients = self._client_list(primary)
        workers = sum(1 for c in clients if c.get("name") == MINORITY_NAME and int(c.get("idle", 0)) <= ACTIVE_S)
        self._call(primary, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # its last word: nothing changes it from now on
        self.held_at_fault = held = self._held(primary)
        self.record.held_at_fault, self.record.held_ids = len(held), sorted(held)[:JOB_SAMPLE]
        self.broker.join_majority()
        self.producer.through = None  # the harness's own client from now on: the sentinels' primary
        self.producer.lagging = False
        self.old.close()
        self.topology.heal()
        now = self.clock()
        only = len(held - self.held_after_promotion)
        self.events.append(
            FaultEvent("sentinel", "healed", rel(now, self.t0), {"workers_on_old_primary": workers, "old_only": only})
        )
        self.state = "healed"
        self.mark(now, "healed")

    def history(self) -> dict[str, Any]:
        return {"held_after_promotion": sorted(self.held_after_promotion), "fault_events": list(self.events)}

    @staticmethod
    def _client(address: tuple[str, int]) -> redis.Redis:
        return redis.Redis(host=address[0], port=address[1], decode_responses=True, socket_timeout=5)

    def _call(self, address: tuple[str, int] | None, *args: str | int) -> None:
        assert address is not None
        client = self._client(address)
        try:
            client.execute_command(*args)
        finally:
            client.close()

    def _info(self, address: tuple[str, int]) -> dict[str, Any]:
        client = self._client(address)
        try:
            return dict(client.info("replication"))
        finally:
            client.close()

    def _client_list(self, address: tuple[str, int]) -> list[dict[str, Any]]:
        client = self._client(address)
        try:
            return list(client.client_list())
        finally:
            client.close()


@checker("split_brain")
def split_brain(h: History, before: Sections) -> Section:
    """A split brain's counts: what the old primary acknowledged and refused between the cut and the heal
    (the producer's enqueues), what it alone held as the partition healed (both sides' readings), and the
    minority's workers it still served then."""
    tl = h.timeline
    f = tl.broker_fault
    if f is None or f.kind != KIND:
        return Section("split_brain")
    healed = next((e for e in tl.fault_events if e.family == "sentinel" and e.what == "healed"), None)
    until = healed.t if healed is not None else float("inf")
    counts = {
        "acked_on_old_primary": sum(len(e.ids) for e in tl.enqueues if e.ok and e.lag),
        "refused_on_old_primary": sum(len(e.ids) for e in tl.enqueues if not e.ok and f.at <= e.t < until),
        "old_primary_only": len(set(tl.held_at_fault) - set(tl.held_after_promotion)) if healed else 0,
        "workers_on_old_primary": int(healed.data.get("workers_on_old_primary", 0)) if healed else 0,
    }
    problems = []
    if f.promoted_offset is not None and f.primary_offset is not None and f.promoted_offset != f.primary_offset:
        problems.append(
            Problem(
                "split_brain",
                f"the promoted replica took over at replication offset {f.promoted_offset}, not at the primary's "
                f"{f.primary_offset} as it was cut off: its reading at the cut is not what it took over with",
            )
        )
    return Section("split_brain", counts=counts, problems=problems)


def bands(tl: Timeline) -> list[Band]:
    """The partition across every lane, from the cut to the heal, the promotion in its tip."""
    f = tl.broker_fault
    if f is None or f.kind != KIND:
        return []
    healed = next((e.t for e in tl.fault_events if e.family == "sentinel" and e.what == "healed"), None)
    promoted = f"a replica promoted at {f.back_at:.3f} s" if f.back_at is not None else "no replica promoted"
    until = f"healed at {healed:.3f} s" if healed is not None else "never healed"
    tip = f"primary cut off at {f.at:.3f} s, {promoted}, {until} (the old primary alone held {f.held_at_fault} jobs)"
    return [Band(f.at, healed, KIND, "split brain", tip)]
