"""sharded: reliable's queue split into S shards, each in a hash slot of its own, so that on a Redis
Cluster the shards sit on different primaries and the queue's work is spread over them.

Keys. The run prefix P = `crashbench:{<run-id>}:<i>-sharded:` holds one key:
    P shards               list of the S shard prefixes, written by setup() (the harness) and read by
                           every other instance (the workers), so all agree on them whatever the topology
Shard k's prefix Pk = `crashbench:{<run-id>.<k>-<n>}:<i>-sharded:` (crashbench.control.connect.shard_prefix)
carries a hash tag of its own: every key of a shard is in one slot (its scripts and pipelines), each
shard in another. `n` is the first number whose slot falls on primary k mod P of the P primaries (by
address), so on a cluster of P primaries the shards go round the primaries; on one server n = 0. Under
each Pk, reliable's keys, with reliable's recovery, retries and state (crashbench.designs.reliable):
    Pk pending, processing:<worker>, workers, heartbeats, delayed, dead, poisoned, requeued, stats

Enqueue: a job goes to shard crc32(id) mod S (any process places a job alike; even over many jobs).
Fetch: a worker's home shard is its number (w<n>) mod S; it takes from home (one pipelined HSET of its
heartbeat + LMOVE, as reliable's fetch), and when home is empty it steals from the next shards in
order, each with the same non-blocking call, and blocks on home only when every shard is empty. Why
steal: a shard's jobs must not wait on its home workers alone (fewer workers than shards, a killed
worker's replacement homed elsewhere, a shard that crc32 gave more jobs), and a steal is only tried
once home is empty, so while every shard has work each worker stays on its own primary.
Recovery is per shard: every worker registers (workers set, heartbeat) in every shard at start, since
it may steal from any, and each shard's reaper gives a dead worker's jobs back to that shard's pending
list. A worker's heartbeat is written only in the shard it fetches from, so its entry goes stale in the
others; their reaper then finds its processing list there empty and only drops the entry.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis.cluster import RedisCluster

from crashbench.control.connect import shard_prefix, spread_pattern
from crashbench.designs import Design, DesignSettings, Job, QueueState
from crashbench.designs.reliable import ReliableQueue

if TYPE_CHECKING:
    import redis


class ShardedQueue(Design):
    name = "sharded"
    counts_requeues = True
    summary = "reliable split over S shards, one hash slot (one primary) each, home shard + stealing: at-least-once"
    spread = True
    DEAD_LETTERS = ReliableQueue.DEAD_LETTERS
    DELAYED = ReliableQueue.DELAYED
    BOOKKEEPING = (*ReliableQueue.BOOKKEEPING, "shards")

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self._shards: list[ReliableQueue] | None = None

    # -- the shards ------------------------------------------------------------------------------

    def shard_count(self) -> int:
        """queue.shards, else one per primary of a cluster, else 1: on one server every shard shares its
        one event loop, so shards add round trips and nothing else unless asked for."""
        if self.settings.shards:
            return self.settings.shards
        return len(self.r.get_primaries()) if isinstance(self.r, RedisCluster) else 1

    def _tags(self, count: int) -> list[str]:
        if not isinstance(self.r, RedisCluster):
            return [f"{k}-0" for k in range(count)]
        owners = sorted(node.name for node in self.r.get_primaries())
        tags = []
        for k in range(count):
            n = 0
            while self.r.get_node_from_key(shard_prefix(self.prefix, f"{k}-{n}")).name != owners[k % len(owners)]:
                n += 1  # 1/P of the slots are each primary's: P tries on average
            tags.append(f"{k}-{n}")
        return tags

    def setup(self) -> None:
        prefixes = [shard_prefix(self.prefix, tag) for tag in self._tags(self.shard_count())]
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(self.key("shards"))
        pipe.rpush(self.key("shards"), *prefixes)
        pipe.execute()
        self._shards = None

    def shards(self) -> list[ReliableQueue]:
        """The shards as setup() placed them, read once from `P shards`."""
        if self._shards is None:
            prefixes = self.r.lrange(self.key("shards"), 0, -1)
            if not prefixes:
                raise RuntimeError(f"{self.prefix}shards is missing: setup() has not run")
            self._shards = [ReliableQueue(self.r, p, self.settings) for p in prefixes]
        return self._shards

    def _home(self, worker: str) -> int:
        digits = worker.lstrip("w")
        number = int(digits) if digits.isdigit() else zlib.crc32(worker.encode())
        return number % len(self.shards())

    # -- producer and worker ---------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[Job]) -> None:
        shards = self.shards()
        split: list[list[Job]] = [[] for _ in shards]
        for job in jobs:
            split[zlib.crc32(job.id.encode()) % len(shards)].append(job)
        for shard, mine in zip(shards, split, strict=True):
            if mine:
                shard.enqueue(mine)

    def start_worker(self, worker: str, now: float) -> None:
        for shard in self.shards():
            shard.start_worker(worker, now)

    def _take(self, k: int, worker: str, now: float) -> Job | None:
        """Shard k's next job without waiting: the heartbeat and the move in one round trip."""
        shard = self.shards()[k]
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(shard.key("heartbeats"), worker, repr(now))
        pipe.lmove(shard.key("pending"), shard.key("processing", worker), "RIGHT", "LEFT")
        return self._job(k, pipe.execute()[1])

    @staticmethod
    def _job(k: int, raw: str | None) -> Job | None:
        if raw is None:
            return None
        data = json.loads(raw)
        return Job(data["id"], data["payload"], receipt=(k, raw), attempt=data["attempts"] + 1)

    def fetch(self, worker: str, timeout: float, now: float) -> Job | None:
        count, home = len(self.shards()), self._home(worker)
        for k in [(home + i) % count for i in range(count)]:
            if (job := self._take(k, worker, now)) is not None:
                return job
        inner = self.shards()[home].fetch(worker, timeout, now)  # all empty: wait on home
        return None if inner is None else self._job(home, inner.receipt)

    def _inner(self, job: Job) -> tuple[ReliableQueue, Job]:
        """The shard a delivery came from, and the job as that shard handed it out (its raw receipt)."""
        k, raw = job.receipt
        return self.shards()[k], dataclasses.replace(job, receipt=raw)

    def ack(self, worker: str, job: Job, now: float) -> bool | None:
        shard, inner = self._inner(job)
        return shard.ack(worker, inner, now)

    def fail(self, worker: str, job: Job, now: float) -> None:
        shard, inner = self._inner(job)
        shard.fail(worker, inner, now)

    def heartbeat(self, worker: str, job: Job, now: float) -> None:
        shard, inner = self._inner(job)  # the shard whose reaper watches this job
        shard.heartbeat(worker, inner, now)

    def stop_worker(self, worker: str, now: float) -> None:
        for shard in self.shards():
            shard.stop_worker(worker, now)

    # -- recovery and what the queue holds -------------------------------------------------------

    def recover(self, now: float) -> int | None:
        return sum(shard.recover(now) or 0 for shard in self.shards())

    def backlog(self) -> int:
        return sum(shard.backlog() for shard in self.shards())

    def state(self) -> QueueState:
        out = QueueState()
        for shard in self.shards():
            one = shard.state()
            out.held.update(one.held)
            out.dead_lettered |= one.dead_lettered
            out.poisoned |= one.poisoned
            out.requeued |= one.requeued
            out.requeue_events += one.requeue_events
        return out

    def key_patterns(self) -> list[str]:
        return [spread_pattern(self.prefix)]  # P's key and every shard's, in whatever slot

    def relative(self, name: str) -> str:
        if "}" in self.prefix:  # P's key and a shard's differ only inside the hash tag
            return name.partition("}")[2].removeprefix(self.prefix.partition("}")[2])
        rel = name.removeprefix(self.prefix)  # an untagged prefix: a shard's keys are P{tag}:name
        return rel.partition("}:")[2] if rel.startswith("{") else rel
