"""The queue's depth as the harness reads it, for the timeline's depth chart: how many jobs wait
(held, not delayed, not inside a handler by the ledgers), how many wait for a retry's due time, how
many are dead-lettered.

A design whose `locate` is the default reads each key's entries on their own, so its keys are read a
piece at a time (crashbench.evidence.inspector.pieces) and only counted: a reading of a million waiting
jobs costs a byte per job, not the ~250 bytes that holding the whole reading did. A job found in two
places counts where it was found first (the full reading would count it once too, as delayed if either
place is). A library's `locate` may join keys, so its reading is taken whole, as for the counts.
A reading in pieces can also be taken in slices of time (`Reader.step`): the entries it reads later
are read later, as a reading of a list in chunks already was. Given the run's token, such a piece is
counted by the harness's own search (crashbench.evidence.search: one regex over the piece's bytes)
rather than through `locate`, which decodes each entry: a backlog of 100,000 jobs is then read in a
fraction of the time, so that sampling the depth stays a small share of any run; a stream's undelivered
entries are not read at all but counted (its groups' lag), only its pending entries are searched, and
a list, set, sorted set or hash of more than LARGE (500) entries is counted by its length, one job an entry
(a job stored twice there counts twice in the chart: the counts never come from it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import redis

from crashbench import jobids
from crashbench.designs import Design
from crashbench.evidence import inspector
from crashbench.evidence.search import Needle
from crashbench.model.queue import matches
from crashbench.model.timeline import Depth, rel


@dataclass(frozen=True, slots=True)
class Reading:
    pending: int
    delayed: int
    dead: int
    taken_s: float


class Reader:
    """One reading, taken a slice at a time on the runner's loop (`step`), so that reading a backlog of
    ten million entries (seconds) never holds up the loop that restarts killed workers."""

    PIECE = 500  # entries per piece: read and located in about 2 ms, the finest a slice can be
    LARGE = PIECE  # entries beyond which a key is counted, not read (with the run's token)

    def __init__(
        self, design: Design, raw: redis.Redis, inside: AbstractSet[str], needle: Needle | None = None
    ) -> None:
        self.design, self.raw, self.inside, self.needle = design, raw, inside, needle
        self.inside_codes = {jobids.code(j) for j in inside}
        whole = type(design).locate is not Design.locate  # a library's locate may join keys
        self.pieces = None if whole else self._pieces()
        self.held, self.dead = jobids.Marks(), jobids.Marks()
        self.pending = self.delayed = self.dead_n = 0
        self.spent = 0.0  # seconds spent in steps: the reading's cost
        self.thread: threading.Thread | None = None  # a whole reading's (see _step_whole)
        self.error: Exception | None = None

    def step(self, budget_s: float = math.inf) -> Reading | None:
        """Read for about `budget_s`; the reading once it is complete, else None."""
        if self.pieces is None:
            return self._step_whole(budget_s)
        started = time.perf_counter()
        try:
            for piece in self.pieces:
                self._count(piece)
                if time.perf_counter() - started >= budget_s:
                    return None
        finally:
            self.spent += time.perf_counter() - started
        return Reading(self.pending, self.delayed, self.dead_n, self.spent)

    def _step_whole(self, budget_s: float) -> Reading | None:
        """A library's reading, taken whole on a thread of its own: its job hashes take the better part
        of a second to read and parse for a thousand jobs (seconds on a loaded machine), and the runner's
        loop, which makes the faults and restarts killed workers, must not wait on them. `budget_s`
        inf: wait for it. An error the reading met is raised here, on the runner's thread."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._read_whole, name="crashbench-depth", daemon=True)
            self.thread.start()
        if budget_s != math.inf and self.thread.is_alive():
            return None
        self.wait()
        if self.error is not None:
            raise self.error
        return Reading(self.pending, self.delayed, self.dead_n, self.spent)

    def wait(self) -> None:
        """Until a reading on its own thread is over (at once when none is)."""
        if self.thread is not None:
            self.thread.join()

    def _read_whole(self) -> None:
        started = time.perf_counter()
        try:
            located = self.design.locate(inspector.take(self.raw, self.design.key_patterns()))
            self.pending = sum(1 for j in located.held if j not in located.delayed and j not in self.inside)
            self.delayed, self.dead_n = len(located.delayed), len(located.dead)
        except Exception as error:  # raised again on the runner's thread by step()
            self.error = error
        finally:
            self.spent = time.perf_counter() - started

    def _pieces(self) -> Iterator[inspector.StoredKey]:
        """The design's keys a piece at a time; with the run's token, a stream's undelivered entries are
        counted, not read (inspector.stream_counted), each a job waiting."""
        for name, text, kind in inspector.listing(self.raw, self.design.key_patterns()):
            counted = self._counted(name, text, kind) if self.needle else None
            if counted is None:
                yield from inspector.key_pieces(self.raw, name, text, kind, self.PIECE)
                continue
            key, waiting = counted
            rel = self.design.relative(text)
            if not matches(rel, self.design.BOOKKEEPING):
                if matches(rel, self.design.DEAD_LETTERS):
                    self.dead_n += waiting
                elif matches(rel, self.design.DELAYED):
                    self.delayed += waiting
                else:
                    self.pending += waiting  # undelivered: inside no handler
            yield key  # its pending entries, searched as any piece

    def _counted(self, name: bytes, text: str, kind: str) -> tuple[inspector.StoredKey, int] | None:
        """A stream, or a list, set, sorted set or hash of more than LARGE entries: its entries waiting
        counted, one job each, not read (None: read it). A big backlog waits in one such key, and
        holds no job inside a handler (those sit in small processing lists or pending entries)."""
        if kind == "stream":
            return inspector.stream_counted(self.raw, name, text)
        size = {"list": self.raw.llen, "set": self.raw.scard, "zset": self.raw.zcard, "hash": self.raw.hlen}.get(kind)
        if size is None or (n := int(size(name))) <= self.LARGE:
            return None
        return inspector.StoredKey(text, kind), n

    def _count(self, piece: inspector.StoredKey) -> None:
        if self.needle is not None:
            self._search(piece, self.needle)
            return
        found = self.design.locate(inspector.Snapshot({piece.name: piece}))
        for j in found.held:
            if self.held.add(jobids.code(j)):
                if j in found.delayed:
                    self.delayed += 1
                elif j not in self.inside:
                    self.pending += 1
        self.dead_n += sum(1 for j in found.dead if self.dead.add(jobids.code(j)))

    def _search(self, piece: inspector.StoredKey, needle: Needle) -> None:
        """The piece's jobs counted by the run's token: the job numbers after it, at C speed."""
        design = self.design
        rel = design.relative(piece.name)
        if matches(rel, design.BOOKKEEPING):
            return
        if piece.type == "stream":
            blob = b"\0".join(v for _, _, fields in piece.stream_places() if fields for v in fields.values())
        elif piece.type == "hash":
            blob = b"\0".join(piece.fields.values())
        else:
            blob = b"\0".join(piece.items)
        dead, delayed = matches(rel, design.DEAD_LETTERS), matches(rel, design.DELAYED)
        marks, inside = (self.dead if dead else self.held), self.inside_codes
        for m in needle.findall(blob):
            c = int(m)
            if marks.add(c):
                if dead:
                    self.dead_n += 1
                elif delayed:
                    self.delayed += 1
                elif c not in inside:
                    self.pending += 1


class Sampler:
    """The depth chart's readings on the runner's loop: one every EVERY seconds, or less often when a
    reading is slow (a large backlog), so that they cost at most 1/COST of the run, SLICE per tick."""

    EVERY = 0.25  # seconds between readings
    COST = 50  # ... and at least this many times as long as the last reading took (<= 2 % of the run)
    SLICE = 0.005  # seconds of reading per tick: a big backlog is read over many ticks

    def __init__(self) -> None:
        self.samples: list[Depth] = []
        self.next = 0.0
        self.reading: tuple[float, Reader] | None = None  # (began, reader) in progress

    def due(self, now: float) -> bool:
        return self.reading is not None or now >= self.next

    def step(self, now: float, t0: float, begin: Callable[[], Reader], whole: bool = False) -> float:
        """Go on with the reading in progress (or begin one); `whole`: a fresh one, at once. Once it is
        complete, its sample, dated when it began. Returns the seconds spent reading."""
        if self.reading is None or whole:
            if self.reading is not None:
                self.reading[1].wait()  # no reading outlives the one that replaces it
            self.reading = (now, begin())
        began, reader = self.reading
        before = reader.spent
        found = reader.step(math.inf if whole else self.SLICE)
        if found is not None:
            self.reading = None
            self.next = now + max(self.EVERY, self.COST * found.taken_s)
            self.samples.append(Depth(rel(began, t0), found.pending, len(reader.inside), found.delayed, found.dead))
        return reader.spent - before

    def drop(self) -> None:
        """The server went down in the middle of a reading (a broker fault): that reading is dropped."""
        self.reading = None
