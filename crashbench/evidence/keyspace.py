"""No place for a job to hide: the final reading covers everything the run could have written, and
the harness's own search (crashbench.evidence.search) decides where each job sits, not the design.

The design's `key_patterns`, `relative`, `BOOKKEEPING` and `job_of` / `locate` still say how it means
its keys to be read, and its reading (`Located`) is kept where the search agrees with it. Where they
disagree, the job counts where the search found it, and a problem names the keys (exit 4):

    job_of_disagrees        an entry of a declared key carries a job the design's reading does not
                            place, the design places a job where no entry carries it, or (through
                            `job_of`) in more or fewer entries than carry it
    bookkeeping_holds_jobs  a key the design declares bookkeeping holds a job it does not account for
                            (a bare id in a set of ids is bookkeeping's business, not a job)
    undeclared_key          a key outside the design's key_patterns holds a job
    outside_namespace       a key outside the run's namespace that the run wrote: a namespaced design's
                            new key (job or not), or any key holding one of this run's jobs

What is read (`Scope`):
- on a server crashbench started (the run has it alone): every key of every database, of every
  primary of a cluster; keys outside the design's patterns are searched as they stream by, never kept;
- on a server it did not start: the run's namespace, in full, and the key names of the run's database
  before and after the run: a key that appeared outside the namespace is read and searched. Names
  rather than keyspace notifications, which would mean changing the server's configuration (crashbench
  touches nothing of a server it did not start but its namespace). What the names cannot see is a
  write into a key that existed before: the threat model (docs/explanation/counts-and-evidence.md) says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis

from crashbench.control.connect import is_cluster, primaries, spread_pattern
from crashbench.control.lease import alive_key, namespace
from crashbench.designs import Design
from crashbench.evidence.inspector import key_pieces, types
from crashbench.evidence.search import Needle
from crashbench.model.counts import Problem
from crashbench.model.queue import Located, matches
from crashbench.model.stored import Snapshot, StoredKey

CAP = 100  # ids and keys named per problem
Label = tuple[str, int]  # (node "host:port", database)
DECLARED = ("held", "dead", "delayed")  # the classes of keys the design reads its jobs from


@dataclass(frozen=True, slots=True)
class Place:
    """Where the search found a job: the key, as Located says it (`where`), and its class."""

    key: str
    where: str
    cls: str  # "held" | "dead" | "delayed" | "bookkeeping" | "undeclared" | "outside"


class Scope:
    """The servers and databases a run's reading covers, and the key names there before the run, by
    database over every primary (a failover during the run changes which node is a primary)."""

    def __init__(self, url: str, started: bool) -> None:
        self.url, self.started = url, started
        self.before: dict[int, set[bytes]] = {}

    def clients(self, url: str | None = None) -> Iterator[tuple[Label, redis.Redis]]:
        """(label, client) per primary and database in scope, bytes in and out; closed by the caller."""
        for node in primaries(url or self.url, decode_responses=False):
            cls, kw = node.connection_pool.connection_class, node.connection_pool.connection_kwargs
            host = f"{kw.get('host', '')}:{kw.get('port', '')}"
            dbs = [int(kw.get("db", 0) or 0)]
            if self.started and not is_cluster(url or self.url):  # a cluster has database 0 only
                got = {_text(k): v for k, v in node.config_get("databases").items()}
                dbs = range(int(got.get("databases", 1)))
            node.close()
            for db in dbs:
                pool = redis.ConnectionPool(connection_class=cls, **{**kw, "db": db})
                try:
                    yield (host, db), redis.Redis(connection_pool=pool)
                finally:
                    pool.disconnect()

    def take_before(self) -> None:
        """The key names in scope now, before the design's setup writes anything."""
        for (_, db), client in self.clients():
            self.before.setdefault(db, set()).update(client.scan_iter(count=1000))


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


@dataclass(slots=True)
class Findings:
    """What the search found: every job (as crashbench spells it) with one place per entry that carries
    it, and the keys outside the namespace the run wrote (with or without jobs)."""

    jobs: dict[str, list[Place]] = field(default_factory=dict)
    outside: list[str] = field(default_factory=list)
    undeclared: set[str] = field(default_factory=set)  # jobs with a place outside the design's declared keys

    def add(self, job: str, place: Place) -> None:
        places = self.jobs.get(job)
        if places is None:
            self.jobs[job] = [place]
        else:
            places.append(place)
        if place.cls not in DECLARED:
            self.undeclared.add(job)


def _classify(design: Design, name: str) -> tuple[str, str]:
    """(class, where) of a key the design's patterns cover: its class as the design declares it (through
    its own `relative`), its place by its real name (without the run's prefix), which no design renames."""
    rel, where = design.relative(name), name.removeprefix(design.prefix)
    if matches(rel, design.BOOKKEEPING):
        return "bookkeeping", where
    if matches(rel, design.DEAD_LETTERS):
        return "dead", where
    return ("delayed" if matches(rel, design.DELAYED) else "held"), where


def _entries(key: StoredKey) -> Iterator[tuple[str, bytes, bytes | None]]:
    """(stream place or "", the bytes to search, the bare member or field an id alone would be) per
    entry of a key."""
    if key.type == "stream":
        for where, _, fields in key.stream_places():
            if fields is not None:
                yield where, b"\0".join(b for kv in fields.items() for b in kv), None
    elif key.type == "hash":
        for f, v in key.fields.items():
            yield "", f + b"\0" + v, f
    else:
        for item in key.items:
            yield "", item, item


def blob(key: StoredKey) -> bytes:
    """Every byte a key's entries hold, one run (a stream's and a hash's fields and values, separated)."""
    if key.type == "stream":
        return b"\0".join(b for fields in key.entries.values() for kv in fields.items() for b in kv)
    if key.type == "hash":
        return b"\0".join(b for kv in key.fields.items() for b in kv)
    return b"\0".join(key.items)


def search_key(needle: Needle, key: StoredKey, cls: str, where: str, found: Findings) -> None:
    """Every job the key's name and entries carry, by the run's token, with its place: one per entry."""
    here = Place(key.name, where, cls)
    if cls != "bookkeeping":  # a bookkeeping key named after a job (its lock, its result) is no copy of it
        for job in needle.ids(key.name.encode()):
            found.add(job, here)
    raw, b64 = needle.anywhere(blob(key))
    if not (raw or b64):
        return
    if cls != "bookkeeping" and not b64 and key.type in ("list", "set", "zset", "string"):
        findall, add = needle.findall, found.add  # the common case, a queue of JSON jobs: at C speed
        for item in key.items:
            for m in dict.fromkeys(findall(item)):
                add(m.decode(), here)
        return
    for place, data, bare in _entries(key):
        ids = list(dict.fromkeys(needle.ids(data, b64)))
        if not ids:
            continue
        if cls == "bookkeeping" and bare is not None and bare == needle.raw + ids[0].encode():
            value = key.fields.get(bare, b"") if key.type == "hash" else b""
            if not needle.ids(value, b64):
                continue  # a bare id in a set (or a field whose value is no job): bookkeeping's own
        at = Place(key.name, place, cls) if place else here
        for job in ids:
            found.add(job, at)


def search(design: Design, needle: Needle, snapshot: Snapshot, scope: Scope, url: str, run_db: int) -> Findings:
    """The search over the design's own reading (`snapshot`), then over everything else in `scope`
    (`url`: the server now, which a failover may have changed)."""
    found = Findings()
    for key in snapshot.keys.values():
        cls, where = _classify(design, key.name)
        search_key(needle, key, cls, where, found)
    inside = [design.prefix + "*", spread_pattern(design.prefix)]
    harness = alive_key(namespace(design.prefix)).encode()
    for label, client in scope.clients(url):
        before, in_run_db = scope.before.get(label[1], set()), label[1] == run_db
        wanted: list[tuple[bytes, str, str, str]] = []  # name, shown, class, where
        for name in sorted(client.scan_iter(count=1000)):
            text = name.decode(errors="replace")
            if (in_run_db and text in snapshot.keys) or name == harness:
                continue  # read with the design's keys already; the harness's own lease
            shown = text if in_run_db else f"db{label[1]}/{text}"
            ours, new = in_run_db and matches(text, inside), name not in before
            if ours:
                wanted.append((name, shown, "undeclared", text.removeprefix(design.prefix)))
            elif design.namespaced:
                if new:
                    found.outside.append(shown)
                if scope.started or new:
                    wanted.append((name, shown, "outside", shown))
            elif scope.started:
                wanted.append((name, shown, "undeclared", shown))
        for (name, shown, cls, where), kind in zip(wanted, types(client, [w[0] for w in wanted]), strict=True):
            for piece in key_pieces(client, name, shown, kind):
                search_key(needle, piece, cls, where, found)
    return found


def reconcile(
    located: Located, found: Findings, done: Callable[[str], bool], per_entry: bool
) -> tuple[Located, list[Problem]]:
    """The design's reading corrected by the search: a job it does not account for counts where the
    search found it, a job it places where no entry carries it counts nowhere; the problems that say so.
    `done`: whether the ledger saw a job complete (its places decide nothing). `per_entry`: the design
    reads its keys entry by entry through `job_of` (the default `locate`), so each job it places must be
    carried by as many entries of its declared keys as it places it in."""
    problems: list[Problem] = []
    accounted = located.held.keys() | located.dead.keys() | located.failed | located.succeeded | located.void
    by_cls: dict[str, dict[str, set[str]]] = {}
    for job, places in found.jobs.items():
        if job in accounted or done(job):
            continue
        for p in places:
            kind = "dead" if p.cls == "dead" else "delayed" if p.cls == "delayed" else "held"
            located.add(job, p.where, kind)
            by_cls.setdefault(p.cls, {}).setdefault(p.key, set()).add(job)
    nowhere = [j for j in located.held.keys() | located.dead.keys() if j not in found.jobs]
    for job in nowhere:
        located.held.pop(job, None)
        located.dead.pop(job, None)
        located.delayed.discard(job)
    miscounted = _miscounted(located, found) if per_entry else []
    what = {
        "held": ("job_of_disagrees", "the design's reading does not place {n} job(s) that entries of its keys carry"),
        "bookkeeping": ("bookkeeping_holds_jobs", "keys declared bookkeeping hold {n} job(s): stranded there"),
        "undeclared": ("undeclared_key", "keys outside the design's key_patterns hold {n} job(s): stranded there"),
        "outside": ("outside_namespace", "keys outside the run's namespace hold {n} job(s): stranded there"),
    }
    for cls in ("held", "dead", "delayed", "bookkeeping", "undeclared", "outside"):
        keys = by_cls.get(cls)
        if not keys:
            continue
        check, message = what.get(cls, what["held"])
        ids = sorted({j for js in keys.values() for j in js})
        problems.append(Problem(check, message.format(n=len(ids)) + f" ({_names(sorted(keys))})", ids[:CAP]))
    if nowhere:
        message = f"the design's reading places {len(nowhere)} job(s) where no stored entry carries them"
        problems.append(Problem("job_of_disagrees", message, sorted(nowhere)[:CAP]))
    if miscounted:
        message = f"job_of reads {len(miscounted)} job(s) from more or fewer entries than carry them"
        problems.append(Problem("job_of_disagrees", message, sorted(miscounted)[:CAP]))
    if found.outside:
        message = f"the run wrote {len(found.outside)} key(s) outside its namespace: {_names(found.outside)}"
        problems.append(Problem("outside_namespace", message))
    return located, problems


def _miscounted(located: Located, found: Findings) -> list[str]:
    """Jobs the design places in more (or fewer) entries of its declared keys than carry them."""
    out, dead, undeclared = [], located.dead, found.undeclared
    for job, places in found.jobs.items():
        mine = sum(1 for p in places if p.cls in DECLARED) if job in undeclared else len(places)
        if mine != len(located.held.get(job, ())) + len(dead.get(job, ())):
            out.append(job)
    return out


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
