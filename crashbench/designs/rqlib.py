"""rq and rq:reliable: the RQ library (python-rq 2.x) with its own worker, as a user runs it.

Keys: RQ's own layout, outside crashbench's namespace (so these designs refuse --redis-url):
    rq:queue:<Q>        list of job ids waiting        (Q = crashbench-<run>-<index>-<design>)
    rq:queue:<Q>:intermediate   ids a worker popped (BLMOVE) and its work horse has not yet started
    rq:job:<Q>-<id>     hash: the job (func crashbench.designs.rqlib.run_job, args (id,))
    rq:wip:<Q>          StartedJobRegistry: executing, scored by heartbeat expiry
    rq:scheduled:<Q>    ScheduledJobRegistry: retries waiting for their interval (rq:reliable), delayed jobs
                        (enqueue_in; scored in whole seconds, so RQ may start one up to 1 s early)
    rq:failed:<Q>       FailedJobRegistry: failed, including abandoned jobs (AbandonedJobError)
    rq:worker:<Q>-<w>   the worker's registration
    rq:results:<Q>-<id>, rq:executions:<Q>-<id>, rq:execution:<Q>-<id>:<e>, rq:finished:<Q>, ...
                        results and bookkeeping, not places a job waits in
A list or registry holds only the id: a job counts as held there only while its rq:job hash exists
(RQ skips an id whose hash is gone).

A job in rq:wip and in the intermediate list at once is one holding, "started:intermediate": the
worker BLMOVEs the id into the intermediate list (rq/queue.py, Queue.lmove), registers the execution
in rq:wip before it forks (rq/executions.py, prepare_execution -> Execution.create ->
StartedJobRegistry.add_execution), and only its work horse, in the MULTI that marks the job started,
takes the id off the intermediate list (rq/worker/base.py, prepare_job_execution, LREM when the
worker has one queue). Every job passes through that state; one whose horse never got its MULTI
through (a connection gone half-open at the fork) stays in it. RQ's own reading agrees: its cleanup
of the intermediate list leaves alone every id that is in the started registry (rq/intermediate_queue.py,
IntermediateQueue.cleanup) and only fails the ids that are not, so the job's fate is the started
registry's (its heartbeat expiry). An intermediate entry beside the queue or the scheduled registry
is no such transition and still counts as a second place.

The worker is RQ's default `Worker`: it forks a work horse per job (which leaves the worker's process
group), so faults go to the worker's whole process tree. A job whose horse dies stays in rq:wip
until its heartbeat expires (job_monitoring_interval + 60 s, the 60 s fixed by RQ) and a worker's
maintenance pass (every maintenance_interval, 600 s by default) finds it; then it is retried if the
job has retries left, else moved to the failed registry as abandoned. Until then it is stranded.

An idle worker runs maintenance only between dequeues, which block worker_ttl - 15 s at a time, so
a job comes back up to heartbeat TTL + maintenance_interval + that block after the kill. RQ's
job_timeout (180 s as installed) is a hard limit: the horse is killed and the job failed.

    rq            as installed: no retries, the default intervals, one job at a time per worker
    rq:reliable   per RQ's documentation: Retry(max=max_attempts - 1), maintenance every 1 s,
                  job_monitoring_interval 1 s, worker_ttl 16 s (idle dequeues of 1 s), so an abandoned
                  job is retried about 61 s after the kill; job_timeout RQ's 180 s, or above the
                  longest job where that is longer

With an [app] (crashbench.designs.app), RQ enqueues the user's function by its dotted path (--task
module.function, or --app MODULE --task function) with each job's payload, under the same retries and
timeouts; the ledger comes from RQ's own worker, given a job class (`job_class`) whose perform, in the
work horse, records the user's function starting, returning or raising.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import redis
from rq import Queue, Retry, Worker, get_current_job
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.jobids import canonical
from crashbench.model.stored import Snapshot


def run_job(job_id: str) -> None:
    """RQ's task: crashbench's handler, told which attempt this is. RQ counts `retries_left` down from
    the Retry's max (kept in the job's meta at enqueue), so the attempt is max - left + 1."""
    job = get_current_job()
    retries = int(job.meta.get("retries", 0)) if job is not None else 0
    left = job.retries_left if job is not None and job.retries_left is not None else retries
    handle(job_id, attempt=retries - left + 1)


class RQQueue(LibraryDesign):
    name = "rq"
    summary = "RQ 2.x as installed: work horse per job, no retries, abandoned jobs found after minutes"
    library = "rq"
    namespaced = False
    retries: ClassVar[bool] = False
    maintenance_interval: ClassVar[int] = 600  # RQ's defaults
    job_monitoring_interval: ClassVar[int] = 30
    worker_ttl: ClassVar[int] = 420  # an idle worker blocks worker_ttl - 15 s in its dequeue, skipping maintenance
    RQ_JOB_TIMEOUT: ClassVar[float] = 180  # RQ's Queue.DEFAULT_TIMEOUT
    runs_apps = True
    delays = True  # queue.enqueue_in: rq:scheduled:<Q>, moved when due by a worker's scheduler (with_scheduler)
    TASK = "crashbench.designs.rqlib.run_job"

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.raw = self._connection(client)
        # RQ job ids (queue name + "-" + crashbench's id) may hold letters, digits, "_" and "-" only.
        self.qname = "crashbench-" + re.sub(r"[^A-Za-z0-9_-]+", "-", prefix.removeprefix("crashbench:")).strip("-")
        self.queue = Queue(self.qname, connection=self.raw)
        self.task = self._user_task() if settings.task else self.TASK

    @staticmethod
    def _connection(client: redis.Redis) -> redis.Redis:
        """RQ's connection (bytes: RQ stores pickled data) to the client's server; on a Sentinel topology (a
        worker's, under sentinel-kill), the one RQ builds from its own SENTINEL settings."""
        if (parts := sentinels.topology(client)) is not None:
            from rq.cli.helpers import get_redis_from_config

            return get_redis_from_config(sentinels.rq_settings(parts))
        pool = client.connection_pool
        kwargs = {**pool.connection_kwargs, "decode_responses": False}
        return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))

    def _user_task(self) -> str:
        """The user's function, by the dotted path RQ enqueues it by; imported here to check it exists."""
        app, task = self.settings.app.partition(":")[0], self.settings.task.replace(":", ".")
        path = task if "." in task or not app else f"{app}.{task}"
        module, _, name = path.rpartition(".")
        if not module:
            raise UsageError(f"task {task!r}: give the function's dotted path, module.function (or --app MODULE)")
        if not callable(getattr(user.import_module(module, "task"), name, None)):
            raise UsageError(f"task {path!r}: module {module!r} has no function {name!r}")
        return path

    def _rq_id(self, job_id: str) -> str:
        return f"{self.qname}-{job_id}"

    def _job_id(self, rq_id: str) -> str:
        return rq_id.removeprefix(f"{self.qname}-").split(":")[0]  # rq:wip entries are "<job>:<execution>"

    def _option(self, name: str, default: Any) -> Any:
        """The scenario's [library.<design>] value (RQ Worker arguments, retry_max, job_timeout)."""
        return self.settings.options.get(name, default)

    def _timeout(self) -> float:
        """RQ's job_timeout in effect: the scenario's, else RQ's default (in rq:reliable raised above the
        longest job)."""
        default = max(self.RQ_JOB_TIMEOUT, self.job_timeout()) if self.retries else self.RQ_JOB_TIMEOUT
        return float(self._option("job_timeout", default))

    def redelivery_s(self) -> float:
        # The execution heartbeat expires job_monitoring_interval + 60 s after the kill; the next
        # maintenance pass (every maintenance_interval, and only between dequeues) then finds the job.
        heartbeat = self._option("job_monitoring_interval", self.job_monitoring_interval) + 60
        dequeue = max(0, self._option("worker_ttl", self.worker_ttl) - 15)
        return heartbeat + self._option("maintenance_interval", self.maintenance_interval) + dequeue

    def configuration(self) -> dict[str, Any]:
        return {
            "retries": self._option("retry_max", self.settings.max_attempts - 1 if self.retries else 0),
            "job_timeout_s": self._timeout(), "concurrency": 1,
            "maintenance_interval_s": self._option("maintenance_interval", self.maintenance_interval),
            "job_monitoring_interval_s": self._option("job_monitoring_interval", self.job_monitoring_interval),
        }  # fmt: skip

    def config_warnings(self) -> list[str]:
        return self.library_timeout_warning(
            "job_timeout", self._timeout(), "RQ kills the work horse of a job still running and records it failed"
        )

    def enqueue(self, jobs: Sequence[Job]) -> None:
        retries = self._option("retry_max", self.settings.max_attempts - 1 if self.retries else 0)
        retry = Retry(max=retries) if retries else None
        data = [
            Queue.prepare_data(
                self.task,
                *(user.arguments(j) if self.settings.task else ((j.id,), {})),
                job_id=self._rq_id(j.id),
                retry=retry,
                timeout=math.ceil(self._timeout()),
                meta={"retries": retries},
            )
            for j in jobs
        ]
        if immediate := [d for d, j in zip(data, jobs, strict=True) if not j.delay_s]:
            self.queue.enqueue_many(immediate)
        for d, j in zip(data, jobs, strict=True):  # RQ's own delay: enqueue_in, into rq:scheduled:<Q>
            if j.delay_s:
                self.queue.enqueue_in(
                    timedelta(seconds=j.delay_s), d.func, args=d.args, kwargs=d.kwargs, job_id=d.job_id,
                    retry=d.retry, job_timeout=d.timeout, meta=d.meta,
                )  # fmt: skip

    def _scheduler(self) -> bool:
        """Whether workers run RQ's scheduler (--with-scheduler): for retries, and for delayed jobs."""
        return self.retries or self.settings.delayed

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        job_id = self._job_id

        class ReadyWorker(Worker):
            def bootstrap(self, *args: Any, **kwargs: Any) -> None:
                super().bootstrap(*args, **kwargs)
                ready()  # registered and about to dequeue

        class LedgerJob(RQJob):
            """The job class of an app's worker: the ledger around the user's function itself, in the
            work horse, where crashbench's handler writes it (after RQ marked the job started)."""

            def perform(self) -> Any:
                user.started(job_id(self.id))
                try:
                    value = super().perform()
                except BaseException:  # the task raised, or RQ's timeout interrupted it
                    user.failed(job_id(self.id))
                    raise
                user.ended(job_id(self.id))
                return value

        ReadyWorker(
            [self.queue],
            job_class=LedgerJob if self.settings.task else RQJob,
            connection=self.raw,
            name=f"{self.qname}-{worker}",
            maintenance_interval=self._option("maintenance_interval", self.maintenance_interval),
            job_monitoring_interval=self._option("job_monitoring_interval", self.job_monitoring_interval),
            worker_ttl=self._option("worker_ttl", self.worker_ttl),
        ).work(logging_level="WARNING", with_scheduler=self._option("with_scheduler", self._scheduler()))

    def _ids(self, key: str, kind: str) -> list[str]:
        raw = self.raw.lrange(key, 0, -1) if kind == "list" else self.raw.zrange(key, 0, -1)
        return [self._job_id(x.decode()) for x in raw]

    def backlog(self) -> int:
        # Raw reads: RQ's own count() would run its cleanup, which is recovery the library must do itself.
        # The intermediate list counts: a worker killed between its BLMOVE and its horse's start leaves
        # the job there until a maintenance pass (a minute later at the earliest) fails it.
        # An id in the intermediate list that is also in rq:wip is one job, counted once (see the module).
        # One MULTI: read one key at a time, a job moving between two of them (the scheduler's retry into
        # the queue, a worker's BLMOVE) could be in none as each was read, and the drain end too soon.
        pipe = self.raw.pipeline(transaction=True)
        pipe.zrange(StartedJobRegistry(queue=self.queue).key, 0, -1)
        pipe.lrange(self.queue.intermediate_queue_key, 0, -1)
        pipe.llen(self.queue.key).zcard(ScheduledJobRegistry(queue=self.queue).key)
        started, moved, queued, scheduled = pipe.execute()
        running = {self._job_id(x.decode()) for x in started}
        intermediate = sum(1 for x in moved if self._job_id(x.decode()) not in running)
        return int(queued + intermediate + len(running) + scheduled)

    def state(self) -> QueueState:
        # As locate reads it: an id whose job hash is gone is nothing RQ can run, a hash no list or
        # registry names is held at "hash-only" (unless it records the job ended).
        bodies = self._hashes()
        held: dict[str, str] = {}
        for key, kind, where in (
            (self.queue.key, "list", "queue"), (self.queue.intermediate_queue_key, "list", "intermediate"),
            (ScheduledJobRegistry(queue=self.queue).key, "zset", "scheduled"),
            (StartedJobRegistry(queue=self.queue).key, "zset", "started"),
        ):  # fmt: skip
            held |= {j: where for j in self._ids(key, kind) if j in bodies}
        failed = set(self._ids(FailedJobRegistry(queue=self.queue).key, "zset"))
        ended = failed | set(self._ids(FinishedJobRegistry(queue=self.queue).key, "zset"))
        for job, key in bodies.items():
            if job not in held and job not in ended and self.raw.hget(key, "status") not in (b"finished", b"failed"):
                held[job] = "hash-only"
        return QueueState(held=held, failed=failed)

    def _hashes(self) -> dict[str, bytes]:
        """This queue's job hashes (rq:job:<Q>-<id>, not their rq:job:<Q>-<id>:<suffix> companions), by job."""
        head = RQJob.key_for(f"{self.qname}-").encode()
        names = self.raw.scan_iter(match=head + b"*", count=1000)
        return {self._job_id(n.decode()[len("rq:job:") :]): n for n in names if b":" not in n[len(head) :]}

    def key_patterns(self) -> list[str]:
        # Q has no ":" and ends in this run's index and design, so no other run's key matches: the
        # per-queue keys end in ":<Q>", the per-job ones carry "<Q>-<id>", the intermediate list and
        # its first-seen markers extend rq:queue:<Q>. RQ's global sets (rq:queues, rq:workers) and its
        # scheduler's registration are shared by every queue on the server and hold no job.
        q = self.qname
        return [f"rq:*:{q}", f"rq:*:{q}-*", f"rq:queue:{q}:*"]

    def _rq_member(self, member: bytes) -> str | None:
        rq_id = member.decode(errors="replace").split(":")[0]  # rq:wip entries are "<job>:<execution>"
        return rq_id if rq_id.startswith(f"{self.qname}-") else None

    def _members(self, key: str, snapshot: Snapshot, found: Located) -> list[str]:
        """The crashbench job ids a list / registry holds, one per member of this run's. A member whose job
        hash is gone (evicted, expired) is nothing RQ can run (its dequeue skips the id): recorded void in
        `found` (lost unless done; the harness's search, which finds the id there, knows why)."""
        stored = snapshot.keys.get(key)
        jobs = []
        for member in stored.items if stored is not None else ():
            if (rq_id := self._rq_member(member)) is None:
                continue
            body = snapshot.keys.get(RQJob.key_for(rq_id))
            if body is not None and body.type == "hash":
                jobs.append(self._job_id(rq_id))
            else:
                found.add(self._job_id(rq_id), key, "void")
        return jobs

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        started = self._members(StartedJobRegistry(queue=self.queue).key, snapshot, found)
        intermediate = self._members(self.queue.intermediate_queue_key, snapshot, found)
        # A started job still in the intermediate list is between the worker's registration of its
        # execution and its horse's first MULTI: one holding, which RQ's cleanup leaves to the started
        # registry (see the module's docstring). Any other intermediate entry is a place of its own.
        transition = set(started) & set(intermediate)
        for job in self._members(self.queue.key, snapshot, found):
            found.add(job, "queue")
        for job in intermediate:
            if job not in transition:
                found.add(job, "intermediate")
        for job in started:
            found.add(job, "started:intermediate" if job in transition else "started")
        for job in self._members(ScheduledJobRegistry(queue=self.queue).key, snapshot, found):
            found.add(job, "scheduled", "delayed")
        # The failed registry is RQ's record of the failure itself, kept failure_ttl (a year by
        # default): it counts whether or not the job hash is still there.
        failed = snapshot.keys.get(FailedJobRegistry(queue=self.queue).key)
        for member in failed.items if failed is not None else ():
            if (rq_id := self._rq_member(member)) is not None:
                found.add(self._job_id(rq_id), "failed", "failed")
        # The finished registry is RQ's record of a success (kept result_ttl, 500 s by default).
        finished = snapshot.keys.get(FinishedJobRegistry(queue=self.queue).key)
        for member in finished.items if finished is not None else ():
            if (rq_id := self._rq_member(member)) is not None:
                found.add(self._job_id(rq_id), "finished", "succeeded")
        self._hash_only(found, snapshot)
        return found

    def _hash_only(self, found: Located, snapshot: Snapshot) -> None:
        """A job hash no list or registry names (an eviction took the list, say): RQ never runs it, and
        no maintenance pass looks for it. Held at "hash-only", as Dramatiq's message body alone is
        ("msgs-only"), unless the hash itself records the job finished or failed."""
        placed = found.held.keys() | found.dead.keys() | found.failed | found.succeeded
        head = RQJob.key_for(f"{self.qname}-")
        for name, key in snapshot.keys.items():
            if not name.startswith(head) or key.type != "hash" or ":" in name[len(head) :]:
                continue
            job = self._job_id(name.removeprefix(RQJob.key_for("")))
            if canonical(job) in placed:  # Located's ids are canonical (the run's token stripped)
                continue
            status = key.fields.get(b"status", b"").decode(errors="replace")
            found.add(job, "hash-only", {"finished": "succeeded", "failed": "failed"}.get(status, "held"))


class RQReliable(RQQueue):
    name = "rq:reliable"
    summary = "RQ 2.x with Retry and 1 s maintenance: abandoned jobs retried ~61 s after the kill"
    retries = True
    maintenance_interval = 1
    job_monitoring_interval = 1
    worker_ttl = 16  # dequeue blocks 1 s at a time, so an idle worker still runs its maintenance
