"""The producer: the harness's enqueues of the run's jobs while the workers run (`produce = "during"`,
a broker fault, or a network fault on the producer), `produce_s` seconds long, CHUNK jobs per call, so
that some enqueues meet a fault. One that returned is *acknowledged*; one that raised, timed out, or was
not replicated in time (WAIT) is *indeterminate* (Jepsen's word) and never retried. The timeline reads
its chunks (crashbench.model.timeline); a broker fault's driver marks the ones sent while the replica
lagged (crashbench.faults.broker.ReplicaCut)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from crashbench.control.connect import DOWN, refused
from crashbench.designs import Design
from crashbench.model.queue import DesignSettings, EnqueueUnconfirmed, Job, Receipts, receipts

CHUNK = 10  # jobs per enqueue call while producing during the run
PRODUCER_TIMEOUT = 5.0  # s: the producer's connection through the proxy when the scenario sets no socket timeout


def producer_bound(socket_timeout: float) -> float:
    """How long the harness waits for one enqueue through the proxy (Through): a built-in design's
    gives up after its timeout, twice over with a reconnect, so this never cuts one short."""
    return 2 * (socket_timeout or PRODUCER_TIMEOUT) + 0.5


class Through:
    """The producer's enqueues through the network fault proxy (a fault on the producer), with its own
    design: each in a thread, waited for at most `bound` s. One that has not returned by then is
    indeterminate and abandoned with its design, as Jepsen abandons a client whose operation timed out;
    the next enqueue gets a fresh design. A library's client may have no socket timeout at all, and the
    harness must not hang with it (nor its Ctrl-C). Abandoned calls end when the proxy closes."""

    def __init__(self, fresh: Callable[[], Design], bound: float) -> None:
        self.fresh, self.bound = fresh, bound
        self.designs = [fresh()]
        self.abandoned = 0

    @classmethod
    def to(cls, url: str, design_cls: type[Design], prefix: str, settings: DesignSettings, timeout: float) -> Through:
        """Enqueues of a `design_cls` design through the proxy at `url`."""
        return cls(lambda: design_cls(producer_client(url, timeout), prefix, settings), producer_bound(timeout))

    def enqueue(self, chunk: list[Job]) -> bool:
        design, outcome = self.designs[-1], []

        def call() -> None:
            try:
                design.enqueue(chunk)
            except Exception:  # whatever the library raises: the enqueue got no answer
                outcome.append(False)
            else:
                outcome.append(True)

        thread = threading.Thread(target=call, name="crashbench-producer", daemon=True)
        thread.start()
        thread.join(self.bound)
        if thread.is_alive():
            self.abandoned += 1
            self.designs.append(self.fresh())
            return False
        return outcome[0]

    def close(self) -> None:
        for design in self.designs:
            with contextlib.suppress(Exception):
                design.r.close()


class Producer:
    """Enqueues the run's jobs over `produce_s` seconds, CHUNK at a time, and records each chunk: when,
    its ids, whether its enqueue was acknowledged (else indeterminate), and whether that was while the
    replica lagged. The timeline reads the chunks (crashbench.model.timeline). With `through`, its
    enqueues go through the proxy (Through), else through the design it is given."""

    def __init__(
        self,
        ids: Sequence[str],
        jobs: Callable[[Sequence[str]], list[Job]],
        produce_s: float,
        start: float,
        through: Through | None = None,
    ) -> None:
        self.ids = ids
        self.jobs = jobs  # a chunk's ids -> its jobs, made when the chunk is due
        self.through = through
        self.every = produce_s / max(1, -(-len(ids) // CHUNK))
        self.start = start
        self.next = 0
        self.lagging = False  # set once the replica stopped following the primary (replica_lag)
        # (harness clock, ids, acknowledged, lagging, what the enqueue returned: a stream's entry ids)
        self.chunks: list[tuple[float, Sequence[str], bool, bool, Receipts]] = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.ids)

    @property
    def acknowledged(self) -> int:
        """Enqueues acknowledged so far."""
        return sum(len(ids) for _, ids, ok, _, _ in self.chunks if ok)

    def produce(self, design: Design, now: float) -> None:
        """Enqueue the next chunk if it is due by `now`: one per call, so that a slow enqueue (a WAIT
        that times out) holds back the producer, never the runner's loop."""
        if not self.done and now >= self.start + (self.next // CHUNK) * self.every:
            ids = self.ids[self.next : self.next + CHUNK]
            chunk = self.jobs(ids)
            self.next += CHUNK
            entries: Receipts = None
            if self.through is not None:
                ok = self.through.enqueue(chunk)
            else:
                try:
                    entries = receipts(design.enqueue(chunk), ids, design.name)
                except Exception as exc:
                    if not unanswered(exc):
                        raise
                    ok = False
                else:
                    ok = True
            self.chunks.append((now, ids, ok, ok and self.lagging, entries))


UNANSWERED = (*DOWN, EnqueueUnconfirmed, redis.exceptions.OutOfMemoryError)  # OOM: an eviction fault's


def unanswered(exc: BaseException) -> bool:
    """Whether an enqueue raised because the server did not take it: the connection failed (a broker
    fault), the write was refused (OOM) or not confirmed. A library wraps the first in its own error
    (kombu's OperationalError, taskiq's SendTaskError): its cause or context is looked at, to the bottom."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UNANSWERED) or refused(current):  # NOREPLICAS: min-replicas-to-write
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def producer_client(url: str, socket_timeout: float) -> redis.Redis:
    """The producer's own connection when a network fault targets it (through the proxy). Always
    bounded, since the producer runs in the harness's loop; and one attempt per enqueue: redis-py
    retries a command that failed on the connection, and a retried enqueue that had landed would
    enqueue the job twice. An enqueue without an answer is recorded indeterminate, never retried."""
    t = socket_timeout or PRODUCER_TIMEOUT
    return redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=t, socket_connect_timeout=t, retry=Retry(NoBackoff(), 0)
    )
