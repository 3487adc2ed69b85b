"""A run's keys on a server crashbench did not start: a safety expiry that the living run keeps
pushing back, and a key that says the run is alive.

A SIGKILLed crashbench cannot delete its keys, and on a server it did not start nobody else will.
So while a run on such a server lives, the runner owns a `Lease` and its main loop calls `tick`, which
- sets `crashbench:{<run-id>}:alive` (who and since when) with a TTL of ALIVE_TTL_S, every ALIVE_EVERY_S;
- every PASS_EVERY_S, SCANs the run's namespace `crashbench:{<run-id>}:` and gives each key an expiry
  of KEY_TTL_S, pushed back on each pass (a sharded design's run: also its shards' `{<run-id>.<shard>}`
  keys, on every primary of a cluster). A pass goes one SCAN batch per tick, so a tick stays cheap
  however many keys the run has; keys created between passes get theirs on the next pass.
A key that carries an expiry of its own, shorter than half of ours (a heartbeat key), is left alone:
that expiry is the design's business. The normal end still deletes every key (the session does);
`--keep` keeps them without an expiry, and the alive key still says when the run is gone.
`crashbench clean` (crashbench.cli.clean) lists namespaces and removes those whose run is gone.
A server crashbench started itself dies with it: the session gives its runs no lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from crashbench.control import connect

KEY_TTL_S = 600  # how long a dead run's keys stay at most
PASS_EVERY_S = 30.0  # far below KEY_TTL_S: a slow pass never lets a living run's keys expire
ALIVE_TTL_S = 120  # longer than any pause between ticks (counting a run, enqueueing the next one)
ALIVE_EVERY_S = 10.0
BATCH = 500  # keys per SCAN call, so one tick's work is bounded

# Per key: (re)set our expiry unless the key has a shorter one of its own; one round trip per batch.
_EXPIRE = """
local n = 0
for _, key in ipairs(KEYS) do
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or ttl > tonumber(ARGV[2]) then
    redis.call('PEXPIRE', key, ARGV[1])
    n = n + 1
  end
end
return n
"""


def namespace(prefix: str) -> str:
    """`crashbench:{<run-id>}:` from any key prefix under it (`crashbench:<run-id>:` before the hash tag)."""
    parts = prefix.split(":")
    return ":".join(parts[:2]) + ":"


def alive_key(ns: str) -> str:
    return ns + "alive"


class Lease:
    def __init__(self, url: str, ns: str, expire: bool, spread: bool = False) -> None:
        # Short timeouts: a tick must not hold the runner's loop when the server is slow or gone.
        # The namespace's keys, its alive key with them, are in one slot (the run id is a hash tag): on a
        # cluster, the primary that holds that slot is the one server to talk to.
        self.client = connect.node_for(url, ns, socket_timeout=2, socket_connect_timeout=2)
        # A design that spreads its keys over slots (Design.spread) has them on every primary, under its
        # shard prefixes: each primary is scanned in turn, for the pattern that covers those too.
        many = spread and connect.is_cluster(url)
        self.nodes = connect.primaries(url, socket_timeout=2, socket_connect_timeout=2) if many else [self.client]
        self.pattern = connect.spread_pattern(ns) if spread else ns + "*"
        self.spread = spread
        self.ns = ns
        self.expire = expire
        self.owner = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time())})
        self.scripts = [node.register_script(_EXPIRE) for node in self.nodes]
        self.node = 0  # the primary the pass is on
        self.cursor = 0
        self.scanning = False
        self.next_pass = 0.0
        self.next_alive = 0.0

    def tick(self, now: float) -> None:
        """One bounded step; a server that is gone is noticed by the run's own commands, and the
        lease tries again on the next tick."""
        with contextlib.suppress(redis.RedisError, OSError):
            self._step(now)

    def _step(self, now: float) -> None:
        if now >= self.next_alive:
            self.client.set(alive_key(self.ns), self.owner, ex=ALIVE_TTL_S)
            self.next_alive = now + ALIVE_EVERY_S
        if not self.expire:
            return
        if not self.scanning and now >= self.next_pass:
            self.scanning, self.cursor, self.node = True, 0, 0
        if self.scanning:
            node = self.nodes[self.node]
            self.cursor, keys = node.scan(self.cursor, match=self.pattern, count=BATCH)
            keys = [k for k in keys if k != alive_key(self.ns).encode()]
            # A script's keys must share a slot on a cluster: a spread design's, one call per slot.
            by_slot: dict[int, list[bytes]] = {}
            for k in keys:
                by_slot.setdefault(key_slot(k) if self.spread else 0, []).append(k)
            for group in by_slot.values():
                self.scripts[self.node](keys=group, args=[KEY_TTL_S * 1000, KEY_TTL_S * 500])
            if self.cursor == 0:
                self.node += 1
                if self.node == len(self.nodes):
                    self.scanning = False
                    self.next_pass = now + PASS_EVERY_S

    def close(self) -> None:
        for node in {id(n): n for n in [self.client, *self.nodes]}.values():
            node.close()


# -- crashbench clean ------------------------------------------------------------------------------

# A run's namespace, nothing else is ours: the run id in braces (its hash tag), with a shard's suffix
# in them (crashbench.control.connect.shard_prefix), or bare as crashbench wrote it before it ran on clusters.
RUN_ID = re.compile(rb"crashbench:(?:\{([0-9a-f]{8})(?:\.[^}:]*)?\}|([0-9a-f]{8})):")
SAMPLE = 100  # keys per namespace whose idle time is read


@dataclass(slots=True)
class Namespace:
    ns: str
    keys: int = 0  # besides the alive key
    alive: bool = False
    idle_s: int | None = None  # since any sampled key was last touched; None: the server does not say
    sample: list[tuple[redis.Redis, bytes]] = field(default_factory=list)  # (the primary that has it, key)

    def gone(self, grace_s: float) -> bool:
        """No run keeps it alive, and (a run before its first tick has no alive key yet) none of its
        keys was touched within `grace_s`."""
        return not self.alive and (self.idle_s is None or self.idle_s >= grace_s)


def namespaces(clients: Sequence[redis.Redis], router: redis.Redis) -> list[Namespace]:
    """Every run namespace on the servers of `clients` (each primary of a cluster, or the one server),
    with its key count, liveness and idle time. A namespace whose keys span primaries (a sharded
    design's) is one entry; its alive key is read through `router`, a client that finds any key (a
    cluster client on a cluster), since it may live on another primary than some of its keys."""
    found: dict[str, Namespace] = {}
    for client in clients:
        for key in client.scan_iter(match="crashbench:*", count=1000):
            m = RUN_ID.match(key)
            if m is None:
                continue
            tagged, bare = m.group(1), m.group(2)
            ns = f"crashbench:{{{tagged.decode()}}}:" if tagged else f"crashbench:{bare.decode()}:"
            entry = found.setdefault(ns, Namespace(ns))
            if key == alive_key(ns).encode():
                continue
            entry.keys += 1
            if len(entry.sample) < SAMPLE:
                entry.sample.append((client, key))
    listed = sorted(found.values(), key=lambda n: n.ns)
    pipe = router.pipeline(transaction=False)
    for entry in listed:
        pipe.exists(alive_key(entry.ns))
    for entry, exists in zip(listed, pipe.execute() if listed else [], strict=True):
        entry.alive = bool(exists)
    for entry in listed:
        # OBJECT IDLETIME is refused under an LFU eviction policy: then liveness alone decides.
        with contextlib.suppress(redis.ResponseError):
            idle = [client.object("idletime", key) for client, key in entry.sample]
            entry.idle_s = min((int(i) for i in idle if i is not None), default=None)
    return listed
