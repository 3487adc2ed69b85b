"""Clients for a run's URL, a single server or a Redis Cluster: what the runner, the worker, the
inspector, the lease and `crashbench clean` connect with.

URL forms:
- `redis://`, `rediss://`, `unix://`: one server (redis-py's own forms).
- `redis+cluster://[user:password@]host:port` (TLS: `rediss+cluster://`): a Redis Cluster; host:port is
  any of its nodes, which the client asks for the others (CLUSTER SLOTS). The scheme is the one Go
  and Node users know from cluster URL parsers (`redis+cluster://`, like `redis+sentinel://`); a
  cluster has one database, so no `/db`.
- `redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db]`: a primary found through Redis
  Sentinel, as redis-py's `Sentinel.master_for` finds it (and finds again after a failover, on the next
  connection error); the password is the data servers' (sentinels without one, as the embedded topology's,
  crashbench.control.sentinel). The form other clients' URL parsers know (Go's, Node's, kombu's `sentinel://`).
- A plain `redis://` URL whose server says `cluster_enabled:1` is that cluster too: `resolve` turns
  it into the cluster form once, at the start of a session, so that everything after sees one form.

A cluster client is redis-py's RedisCluster, with one change (`_Cluster`): the slot of XREADGROUP and
XREAD is read from the command itself instead of asking the server (COMMAND GETKEYS) before every
read, which would double a stream consumer's round trips. Every key of a run is in one slot (its
prefix carries a hash tag, crashbench.run.runner), so `node_for` gives a plain client of the one
primary that holds them all: the inspector, the lease and the cleanup read and write there, with
node-level commands (SCAN) that a cluster client would send to every primary.

The one exception is a design that spreads its keys (`Design.spread`, the sharded design): each of its
shards has a hash tag of its own, the run's with a suffix, `crashbench:{<run-id>.<shard>}:...`
(`shard_prefix`), so its keys fall on several primaries. `spread_pattern` is the SCAN pattern that finds
a prefix's keys in every such slot, and `reader` a client that reads them wherever they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}  # the cluster form -> redis-py's scheme


SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A `redis+sentinel://` URL's parts."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL; ValueError naming what is wrong (never the password)."""
    rest = url.split("://", 1)[1]
    creds, _, rest = rest.rpartition("@")
    hosts, _, path = rest.partition("/")
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a sentinel must be host:port, not {item!r}")
        sentinels.append((host.strip("[]"), int(port)))
    master, _, db = path.strip("/").partition("/")
    if not master:
        raise ValueError("no master name: redis+sentinel://host:port[,host:port]/master-name[/db]")
    if db and not db.isdigit():
        raise ValueError(f"the database must be a number, not {db!r}")
    password = unquote(creds.partition(":")[2]) or None if creds else None  # percent-encoded, as in redis://
    return SentinelURL(tuple(sentinels), master, int(db or 0), password)


def is_cluster(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


def seed_url(url: str) -> str:
    """A cluster URL as redis-py reads it, also for a plain client of the node it names: the
    single-server scheme, and no database (a cluster has only 0). Any other URL as it is."""
    if not is_cluster(url):
        return url
    scheme, rest = url.split("://", 1)
    parts = urlsplit(f"{SCHEMES.get(scheme.lower(), scheme)}://{rest}")
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, parts.fragment))


class _Cluster(RedisCluster):
    def determine_slot(self, *args: Any) -> int | None:
        name = str(args[0]).upper() if args else ""
        if name in ("XREADGROUP", "XREAD"):
            # XREADGROUP GROUP g c [COUNT n] [BLOCK ms] [NOACK] STREAMS key... id...: the keys are the
            # first half of what follows STREAMS (looked for after the group and consumer names).
            words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
            start = 4 if name == "XREADGROUP" else 1
            at = next((i for i in range(start, len(words)) if words[i].upper() == "STREAMS"), None)
            if at is not None:
                rest = args[at + 1 :]
                slots = {self.keyslot(k) for k in rest[: len(rest) // 2]}
                if len(slots) == 1:
                    return slots.pop()
        return super().determine_slot(*args)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for `url`: redis.Redis for one server, a RedisCluster (which answers the same
    commands, routed by key) for a cluster. `kwargs` go to either (decode_responses, timeouts)."""
    if is_cluster(url):
        return _Cluster.from_url(seed_url(url), **kwargs)  # type: ignore[return-value]
    if is_sentinel(url):
        return sentinel_client(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def sentinel_client(url: str, **kwargs: Any) -> redis.Redis:
    """The primary the sentinels of a `redis+sentinel://` URL name, through redis-py's Sentinel support:
    its connections ask the sentinels again for the primary whenever they (re)connect."""
    from redis.sentinel import Sentinel

    parts = parse_sentinel(url)
    timeouts = {k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel = Sentinel(list(parts.sentinels), sentinel_kwargs=timeouts, **timeouts)
    return sentinel.master_for(parts.master, db=parts.db, password=parts.password, **kwargs)


def sentinel_primary_url(url: str) -> str:
    """The primary the sentinels of a `redis+sentinel://` URL name now, as a plain `redis://` URL with the
    URL's password and database (for the harness, which reads that primary itself). redis-py's errors as
    they come: MasterNotFoundError when no sentinel answers or none knows the name."""
    from redis.sentinel import Sentinel

    parts = parse_sentinel(url)
    timeouts = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    sentinel = Sentinel(list(parts.sentinels), sentinel_kwargs=timeouts, **timeouts)
    try:
        host, port = sentinel.discover_master(parts.master)
    finally:
        for client in sentinel.sentinels:
            client.close()
    auth = f":{quote(parts.password, safe='')}@" if parts.password else ""
    return f"redis://{auth}{host}:{port}/{parts.db}"


def node_for(url: str, key: str, **kwargs: Any) -> redis.Redis:
    """A plain client of the primary that serves `key`'s slot (the server itself for a single one)."""
    if not is_cluster(url):
        return redis.Redis.from_url(url, **kwargs)
    slot = key_slot(key.encode())
    for node, ranges in _primaries(url):
        if any(first <= slot <= last for first, last in ranges):
            return redis.Redis.from_url(_node_url(url, *node), **kwargs)
    raise redis.exceptions.ClusterDownError(f"no primary serves slot {slot}")


def shard_prefix(prefix: str, tag: str) -> str:
    """`prefix` with `.tag` added inside its hash tag: `crashbench:{<run-id>.<tag>}:...`, a slot of its
    own that the run's namespace still covers (`spread_pattern`). Only the first `{...}` of a key is its
    hash tag, so the suffix must go inside that one. A prefix without a tag gets `{tag}:` at its end."""
    head, brace, tail = prefix.partition("}")
    return f"{head}.{tag}}}{tail}" if brace and "{" in head else f"{prefix}{{{tag}}}:"


def spread_pattern(prefix: str) -> str:
    """The SCAN MATCH pattern of every key under `prefix` and under its shard prefixes: the hash tag left
    open (`crashbench:{<run-id>*}:rest*`). A run id has a fixed length, so no other run's tag matches."""
    head, brace, tail = prefix.partition("}")
    return f"{head}*}}{tail}*" if brace and "{" in head else prefix + "*"


def reader(url: str, prefix: str, spread: bool, **kwargs: Any) -> redis.Redis:
    """The harness's reading connection for a run's keys: the one primary of their slot (`node_for`),
    or, for a design that spreads its keys over slots, a cluster client, whose SCAN goes to every primary
    and whose reads are routed key by key. On one server, that server either way."""
    if spread and is_cluster(url):
        return connect(url, **kwargs)
    return node_for(url, prefix, **kwargs)


def library_url(url: str, key: str) -> str:
    """For a queue library, which takes one server's URL: a primary of the cluster that does not serve
    `key`'s slot (the run's), so that the library meets the cluster's redirections at its first command
    on the run's keys, rather than by the chance of where its own keys fall; the only one if there is one."""
    slot = key_slot(key.encode())
    found = _primaries(url)
    others = [node for node, ranges in found if not any(first <= slot <= last for first, last in ranges)]
    return _node_url(url, *(others or [found[0][0]])[0])


def primaries(url: str, **kwargs: Any) -> list[redis.Redis]:
    """A plain client per primary of a cluster; for a single server, its own."""
    if not is_cluster(url):
        return [redis.Redis.from_url(url, **kwargs)]
    return [redis.Redis.from_url(_node_url(url, *node), **kwargs) for node, _ in _primaries(url)]


def _primaries(url: str) -> list[tuple[tuple[str, int], list[tuple[int, int]]]]:
    """((host, port), slot ranges) of every primary that serves slots, as the node the URL names sees
    them: one CLUSTER NODES, where a cluster client would also load the server's command table."""
    seed = redis.Redis.from_url(seed_url(url), socket_connect_timeout=5, socket_timeout=10)
    try:
        nodes = cluster_nodes(seed)
        seed_host = seed.connection_pool.connection_kwargs.get("host", "127.0.0.1")
    finally:
        seed.close()
    found = []
    for node in nodes:
        if "master" not in node.flags or "fail" in node.flags or not node.slots:
            continue
        host, _, port = node.address.rpartition(":")
        # Slots being migrated show as [slot->-id] / [slot-<-id]: the node still serves them until done.
        ranges = [(int(a), int(b or a)) for r in node.slots if not r.startswith("[") for a, _, b in [r.partition("-")]]
        found.append(((host or seed_host, int(port)), ranges))
    return found


def _node_url(url: str, host: str, port: int) -> str:
    """The cluster URL's credentials and options, for one node as a single server."""
    parts = urlsplit(seed_url(url))
    userinfo = parts.netloc.rpartition("@")[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{userinfo}@{address}" if userinfo else address
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))


def _database_values(url: str) -> list[str]:
    if url.lower().startswith("unix"):
        return parse_qs(urlsplit(url).query).get("db", [])
    path = urlsplit(url).path.strip("/")
    return ([path] if path else []) + parse_qs(urlsplit(url).query).get("db", [])


def check_database(url: str) -> None:
    """A ValueError unless the URL's database (its path, or ?db=) is a whole number: redis-py takes
    `redis://host/abc` for database 0 without a word."""
    for v in _database_values(url):
        if not v.isdigit():
            raise ValueError(f"the database must be a whole number, not {v!r}")


def database_of(url: str) -> int:
    """The database a (checked) URL selects, as redis-py reads it: ?db= over the path; 0 for none."""
    values = [v for v in _database_values(url) if v.isdigit()]
    return int(values[-1]) if values and not is_cluster(url) else 0


def resolved(url: str) -> str:
    """`url` in the cluster form when its server is a cluster node (one round trip to find out)."""
    if is_cluster(url):
        return url
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        return resolve(url, client)
    finally:
        client.close()


def resolve(url: str, client: redis.Redis) -> str:
    """`url` in the cluster form when its server (`client`, connected to it) is a cluster node."""
    if is_cluster(url) or url.lower().startswith("unix"):
        return url
    if str(client.info("cluster").get("cluster_enabled", 0)) != "1":
        return url
    parts = urlsplit(url)
    return urlunsplit((f"{parts.scheme}+cluster", parts.netloc, "", parts.query, parts.fragment))


# What a client sees while the server is down, restarting, loading its data or demoted; on a cluster,
# also while a slot's primary is down and not yet replaced (CLUSTERDOWN, a slot map that says nothing),
# and on a plain connection to a primary just demoted (MOVED: the harness's reader, until it reconnects).
DOWN = (
    redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.ReadOnlyError,
    redis.exceptions.ClusterError, redis.exceptions.TryAgainError, redis.exceptions.SlotNotCoveredError,
    redis.exceptions.MovedError,
)  # fmt: skip


def refused(exc: BaseException) -> bool:
    """A write the server refused for now and may take later: out of memory (an eviction fault's
    noeviction limit), or too few replicas in reach (min-replicas-to-write: NOREPLICAS, which redis-py
    raises as a plain ResponseError, in a pipeline with the command's place before it)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    text = str(exc) if isinstance(exc, redis.ResponseError) else ""
    return text.startswith("NOREPLICAS ") or (text.startswith("Command # ") and "caused error: NOREPLICAS " in text)


@dataclass(frozen=True, slots=True)
class Node:
    """One line of CLUSTER NODES."""

    id: str
    address: str  # host:port
    flags: tuple[str, ...]  # "myself", "master", "slave", "fail?", "handshake", ...
    primary: str  # the primary's id for a replica, else "-"
    slots: tuple[str, ...]  # "0-5460", ...


def cluster_nodes(client: redis.Redis) -> list[Node]:
    """CLUSTER NODES of the node `client` talks to, as that node sees the cluster (the raw text, not
    redis-py's dict by address, which drops a node that shares an address during a handshake)."""
    raw = client.execute_command("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    nodes = []
    for line in text.splitlines():
        if fields := line.split():
            address = fields[1].split("@")[0].split(",")[0]  # ip:port@bus[,hostname]
            nodes.append(Node(fields[0], address, tuple(fields[2].split(",")), fields[3], tuple(fields[8:])))
    return nodes
