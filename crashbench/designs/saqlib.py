"""saq and saq:reliable: the saq library (0.26, asyncio) with its own Worker, as a user runs it.

saq pins redis-py < 8, so its workers run under `--worker-python PATH` like arq's. This module must
import without saq: the harness side (enqueue, backlog, state, locate) speaks saq's key layout and
JSON job format with plain redis-py, and only `serve`, in the worker, imports saq.

Keys: saq's own layout, outside crashbench's namespace (so these designs refuse --redis-url). The
queue's name is the run prefix P without its trailing ":" and each job's key is P + crashbench's id
(saq's abort keys are named by the job key alone, so the key must be unique across runs):
    saq:P incomplete    sorted set of saq ids (saq:job:P P<id>) by due time: every job not ended
    saq:P queued        list of ids waiting; a worker BLMOVEs one into
    saq:P active        list of ids being run; a job leaves both only when it ends or is swept
    saq:job:P P<id>     the job (JSON): status, attempts, timeout, heartbeat, retries, ...; kept ttl
                        (600 s) after it ends with status complete / failed / aborted
    saq:abort:P<id>     set for 5 s while a sweep aborts the job
    saq:P sweep, schedule, stats, worker_info:<uuid>   locks and the workers' health
A list names saq ids only; a job is held there only while its body exists. A body no list names
and not ended (a sweep whose worker died in its 5 s wait leaves it "aborting") is held at
"no list (<status>)": nothing delivers it again.

saq acknowledges nothing before a job ends: a killed worker's jobs stay in `active` with status
active. Every worker runs a sweep every timers["sweep"] s (one at a time: the sweep key is a lock of
that many seconds); it takes a job in `active` that is not active, or whose `started` is older than
its timeout, or whose `touched` is older than its heartbeat. For each (one after another), it
aborts the job (out of every list), waits up to 5 s (fixed in saq) for its worker to confirm, then
retries it if `retries > attempts` (back to `queued`), else finishes it ABORTED. A handler that
raises is retried the same way, else finished FAILED. A heartbeat is saq's `touched`: the job
function itself must write it (`await job.update()`), which ours does every heartbeat / 2 s.
The sweep also takes a job a live worker has just moved to `active` but not yet marked active
(tobymao/saq#124), and it acts on the copies it read, one job after another, 5 s each: a job that
ended meanwhile looks stuck by then and is aborted from its stale copy (attempts 0 if it was
"queued"), so it is retried (run again) or recorded aborted although it completed. A sweep whose
worker is killed during its 5 s wait leaves the job "aborting" in no list: nothing delivers it.
SIGTERM / SIGINT stop the Worker as the `saq` command does: running jobs are cancelled at once and
retried (shutdown_grace_period_s is unset), while their handler threads run on.

    saq            as installed: timeout 10 s, heartbeat 0 (off), retries 1 (a single attempt),
                   sweep every 60 s: a killed worker's jobs are ABORTED, never run again, 15-75 s
                   after the kill plus 5 s for each job ahead of them in the sweep
    saq:reliable   timeout = job_timeout(), heartbeat = stale_after (whole seconds), retries =
                   max_attempts, sweep every 1 s: a killed job runs again ~heartbeat + 1 + 5 s on
                   when it is first in its sweep (a heartbeat this short makes every later copy
                   in that sweep look stuck: they are run again)

Both run saq's default concurrency (10 jobs per worker process); [library."<design>"] sets Job
fields (timeout, heartbeat, retries, ttl, retry_delay, retry_backoff) and any other Worker argument
(concurrency, timers merged into ours, shutdown_grace_period_s, ...).

App mode ([app]: crashbench.designs.app, crashbench.designs.saqapp): `--app module:settings` (saq's
settings dict) and `--task NAME`, one of its functions. The workers run saq's Worker from the user's
settings, its queue swapped for one on the run's server with the name above; the harness reads the
settings through the workers' interpreter (app.probe). Each job is what queue.enqueue(NAME,
key=P<id>, **payload) writes, with the design's Job fields: saq passes keyword arguments only, so
each payload must be a JSON object. The user's function does not refresh saq's heartbeat (ours
does), so in app mode the heartbeat is off unless [library] sets it: a killed job is found stuck by
its timeout. The ledger comes from saq's own before_process / after_process hooks, job.status
telling complete from failed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

import redis

from crashbench.designs import DesignSettings, Job, LibraryDesign, Located, QueueState, observe_for, sentinels
from crashbench.designs import app as user
from crashbench.designs.handler import handle
from crashbench.errors import UsageError
from crashbench.jobids import plain
from crashbench.model.stored import Snapshot

if TYPE_CHECKING:
    from crashbench.control.interpreter import WorkerPython

FUNCTION = "crashbench_handle"
SWEEP_ABORT_WAIT_S = 5.0  # RedisQueue.sweep(abort=5.0): how long it waits on a swept job's worker
# saq's Job and Worker defaults (saq.job.Job, saq.worker.Worker.__init__): timeout 10 s,
# heartbeat 0 (off), retries 1, ttl 600 s; timers sweep 60 s.
JOB_DEFAULTS: dict[str, Any] = {"timeout": 10, "heartbeat": 0, "retries": 1, "ttl": 600}
JOB_FIELDS = {"timeout", "heartbeat", "retries", "ttl", "retry_delay", "retry_backoff"}
SWEEP_DEFAULT_S = 60
FAILED = {"failed", "aborted"}  # saq's unsuccessful terminal statuses

# saq's Queue._enqueue script: a job already incomplete, or being aborted, is not enqueued again.
ENQUEUE = """
if not redis.call('ZSCORE', KEYS[1], KEYS[2]) and redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('SET', KEYS[2], ARGV[1])
    redis.call('ZADD', KEYS[1], ARGV[2], KEYS[2])
    if ARGV[2] == '0' then redis.call('RPUSH', KEYS[3], KEYS[2]) end
    return 1
else
    return nil
end
"""


async def crashbench_handle(ctx: dict[str, Any], *, job_id: str) -> None:
    job = ctx["job"]
    # The handler is synchronous (it sleeps): a thread keeps saq's event loop, timeout and sweep alive.
    # saq counts attempts itself (1 on the first run, +1 per dequeue), so a retry is attempt 2.
    work = asyncio.ensure_future(asyncio.to_thread(handle, job_id, job.attempts))
    # saq's heartbeat is the job's `touched` time, which only the job function refreshes.
    while job.heartbeat and not (await asyncio.wait({work}, timeout=job.heartbeat / 2))[0]:
        await job.update()
    await work


def _body(raw: bytes | str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _in_sweep(body: dict[str, Any]) -> bool:
    """Whether a sweep may still retry this job: it is aborting, or aborted with retries left."""
    retries, attempts = body.get("retries", JOB_DEFAULTS["retries"]), body.get("attempts", 0)
    return body.get("status") == "aborting" or (body.get("status") == "aborted" and retries > attempts)


def _unlisted(status: object) -> str:
    """Where a job is held that no list names, only its body: "no list (aborting)"."""
    return f"no list ({status})"


class SaqQueue(LibraryDesign):
    name = "saq"
    summary = "saq as installed: a killed worker's jobs are swept after 15-75 s and ABORTED (retries 1)"
    library = "saq"
    namespaced = False
    reliable: ClassVar[bool] = False
    DEFAULT_CONCURRENCY = 10  # saq.worker.Worker(concurrency=10)
    # A sweep takes a job out of every list and decides on it up to 5 s later (longer when status
    # messages restart its wait): backlog() may miss it meanwhile, so a drain waits that long on 0.
    SETTLE_S = SWEEP_ABORT_WAIT_S + 1.0
    # A job that raised, or was swept, with no retry left keeps its body, status failed / aborted,
    # for its ttl (600 s): saq's record of the failure. (With ttl -1 saq deletes it: then lost.)
    drops_failed = False
    runs_apps = True
    delays = True  # enqueue(scheduled=): `incomplete` scored by the due time; the schedule timer queues it

    def __init__(self, client: redis.Redis, prefix: str, settings: DesignSettings) -> None:
        super().__init__(client, prefix, settings)
        self.function = settings.task or FUNCTION
        self.app_options: dict[str, Any] = {}  # app mode: the user's concurrency and timers (load_app)
        self.queue = prefix.rstrip(":")
        self.keys = {k: f"saq:{self.queue}:{k}" for k in ("incomplete", "queued", "active")}
        self.ids = f"saq:job:{self.queue}:{prefix}"  # saq id = this + crashbench's id
        self.enqueue_script = client.register_script(ENQUEUE)
        self._aborting = (0, 0.0)  # backlog(): jobs a sweep has in hand, and until when that count stands
        self._aborting_since: dict[str, float] = {}  # ... and when each was first seen so, key expired

    def job_options(self) -> dict[str, Any]:
        """The Job fields every job is enqueued with: ours, then the scenario's."""
        options: dict[str, Any] = {}
        if self.reliable:
            # saq types these as whole seconds; rounding up keeps each above what it is sized by.
            options = {
                "timeout": math.ceil(self.job_timeout()),
                "heartbeat": max(1, math.ceil(self.settings.stale_after)),
                "retries": self.settings.max_attempts,
            }
        if self.settings.task:  # the user's function does not refresh the heartbeat (module docstring)
            options.pop("heartbeat", None)
        options.update((k, v) for k, v in self.settings.options.items() if k in JOB_FIELDS)
        return options

    def worker_options(self) -> dict[str, Any]:
        """saq Worker arguments: ours, then the scenario's (its `timers` merged into ours)."""
        timers = {"sweep": 1} if self.reliable else {}
        options: dict[str, Any] = {"concurrency": self.concurrency()}
        if self.settings.task:  # the user's settings, then queue.concurrency when given
            timers = {**timers, **self.app_options.get("timers", {})}
            theirs = self.app_options.get("concurrency", self.concurrency())
            options["concurrency"] = self.settings.concurrency or theirs
        options.update((k, v) for k, v in self.settings.options.items() if k not in JOB_FIELDS)
        options["timers"] = {**timers, **options.get("timers", {})}
        return options

    def load_app(self, python: WorkerPython | None) -> None:
        described = user.probe(python, "crashbench.designs.saqapp:describe_app", self.settings.app, self.settings.task)
        self.app_options = described["options"]

    def _job(self, name: str) -> Any:
        return self.job_options().get(name, JOB_DEFAULTS[name])

    def redelivery_s(self) -> float:
        """From a worker's death to the sweep deciding its job: whichever of timeout / heartbeat
        finds it stuck first, then a sweep period, then the sweep's wait on the dead worker."""
        found = min((s for s in (self._job("timeout"), self._job("heartbeat")) if s), default=math.inf)
        sweep = self.worker_options()["timers"].get("sweep", SWEEP_DEFAULT_S)
        return found + sweep + SWEEP_ABORT_WAIT_S

    def observe_window(self) -> float:
        # Up to its first decision. The sweep then takes the dead workers' jobs one after another, 5 s
        # each, running none of them as installed (16-30 after 2-5 mid-job kills): each one it takes
        # changes the backlog, progress that keeps the drain watching (crashbench.run.drain).
        return observe_for(self.redelivery_s())

    def configuration(self) -> dict[str, Any]:
        return {
            "timeout_s": self._job("timeout"), "heartbeat_s": self._job("heartbeat"),
            "retries": self._job("retries"), "concurrency": self.worker_options()["concurrency"],
            "sweep_s": self.worker_options()["timers"].get("sweep", SWEEP_DEFAULT_S),
            "sweep_abort_wait_s": SWEEP_ABORT_WAIT_S,
        }  # fmt: skip

    def config_warnings(self) -> list[str]:
        timeout = self._job("timeout")
        if not timeout:  # 0 disables it
            return []
        return self.library_timeout_warning(
            "job timeout", timeout,
            "saq cancels the job (its handler thread runs on), then retries it or records it failed",
        )  # fmt: skip

    def enqueue(self, jobs: Sequence[Job]) -> None:
        # What saq's Queue.enqueue writes (Job.to_dict: fields at their default are left out).
        now_ms = int(time.time() * 1000)
        options = {k: v for k, v in self.job_options().items() if JOB_DEFAULTS.get(k) != v}
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            key = self.prefix + job.id
            # enqueue(scheduled=epoch seconds): the score in `incomplete`, no `queued` entry until the
            # schedule timer (every second) finds it due.
            scheduled = {"scheduled": now_ms / 1000 + job.delay_s} if job.delay_s else {}
            body = {"function": self.function, "kwargs": self._kwargs(job), "queue": self.queue, "key": key,
                    **options, "queued": now_ms, "status": "queued", **scheduled}  # fmt: skip
            keys = [self.keys["incomplete"], self.ids + job.id, self.keys["queued"], f"saq:abort:{key}"]
            self.enqueue_script(keys=keys, args=[json.dumps(body), scheduled.get("scheduled", 0)], client=pipe)
        pipe.execute()

    def _kwargs(self, job: Job) -> dict[str, Any]:
        if not self.settings.task:
            return {"job_id": job.id}
        args, kwargs = user.arguments(job)
        if args:
            raise UsageError(
                f"saq passes a job keyword arguments only: job {plain(job.id)}'s payload is not a JSON object",
                hint="give --payloads whose payloads are objects (a task's keyword arguments)",
            )
        return kwargs

    def serve(self, worker: str, ready: Callable[[], None]) -> None:
        if self.settings.task:
            from crashbench.designs.saqapp import serve_app

            serve_app(self, ready)
            return
        from saq import Worker

        async def startup(ctx: dict[str, Any]) -> None:
            ready()

        async def main() -> None:
            # As saq.worker.start (the `saq` command) runs a Worker; Worker.start itself stops on
            # SIGINT / SIGTERM. Each job's handler runs in a thread of the default executor: as many as
            # the concurrency, so no job waits for a thread while its timeout runs.
            options = self.worker_options()
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(options["concurrency"]))
            queue = self.saq_queue()
            try:
                await queue.connect()
                await Worker(queue, functions=[(FUNCTION, crashbench_handle)], startup=startup, **options).start()
            finally:
                await queue.disconnect()

        asyncio.new_event_loop().run_until_complete(main())

    def saq_queue(self) -> Any:
        """saq's queue on the run's server, in the worker's event loop. saq has no Sentinel support of its own:
        on a Sentinel topology (a worker's, under sentinel-kill), redis.asyncio's Sentinel client, which saq's
        Redis queue takes as its client."""
        from saq import Queue

        if (parts := sentinels.topology(self.r)) is None:
            return Queue.from_url(self.url(), name=self.queue)
        from saq.queue.redis import RedisQueue

        return RedisQueue(sentinels.async_master(parts), name=self.queue)

    def backlog(self) -> int:
        # `incomplete` holds every job not ended, but not always: a job a stale sweep retried while it
        # still ran is in `queued` once its finish took it out of `incomplete`. Hence the lists too.
        pipe = self.r.pipeline(transaction=False)
        incomplete, active, queued = (
            pipe.zcard(self.keys["incomplete"]).llen(self.keys["active"]).llen(self.keys["queued"]).execute()
        )
        if held := max(incomplete, active + queued):
            return held
        # A job a sweep has in hand is in no list until the sweep retries or finishes it: its abort
        # key marks it for 5 s, then its body: "aborting" (the wait restarts on every status message),
        # or "aborted" with retries left (a queued job is finished aborted, then retried). Read only
        # once the lists are empty, at the end of a run.
        if aborts := sum(1 for _ in self.r.scan_iter(match=f"saq:abort:{self.prefix}*", count=1000)):
            return aborts
        now = time.monotonic()
        if now < self._aborting[1]:  # bodies are costly to read: a count found stands 0.25 s
            return self._aborting[0]
        aborting = [n for n, raw in self._bodies().items() if _in_sweep(_body(raw))]
        # One still so two waits after its key expired lost its sweep (a killed worker): nothing will
        # ever decide it, and it is in no list, so the queue no longer holds it.
        self._aborting_since = {n: self._aborting_since.get(n, now) for n in aborting}
        deciding = sum(1 for n in aborting if now - self._aborting_since[n] < 2 * SWEEP_ABORT_WAIT_S)
        self._aborting = (deciding, now + 0.25 if deciding else 0.0)
        return deciding

    def _bodies(self) -> dict[str, str]:
        """saq id -> stored job, for every job body of this run."""
        names = list(self.r.scan_iter(match=self.ids + "*", count=1000))
        found: dict[str, str] = {}
        for i in range(0, len(names), 1000):
            chunk = names[i : i + 1000]
            found |= {n: raw for n, raw in zip(chunk, self.r.mget(chunk), strict=True) if raw is not None}
        return found

    def _places(self, queued: list[str], active: list[str], incomplete: list[str]) -> list[tuple[str, str]]:
        """(saq id, where) for every place a job sits: each entry of `queued` and `active`, and
        `incomplete` for an id in neither (a retry waiting for its retry_delay, or one no list names)."""
        listed = set(queued) | set(active)
        return [
            *((i, "queued") for i in queued), *((i, "active") for i in active),
            *((i, "incomplete") for i in incomplete if i not in listed),
        ]  # fmt: skip

    @staticmethod
    def _kind(where: str, body: dict[str, Any]) -> str:
        # Only the schedule pass moves an id from `incomplete` to `queued`, and only once its score
        # (due time) is > 0: a delayed retry's or a scheduled job's; any other is never delivered.
        delayed = where == "incomplete" and (body.get("retry_delay") or body.get("scheduled"))
        return "delayed" if delayed else "held"

    def state(self) -> QueueState:
        queued = self.r.lrange(self.keys["queued"], 0, -1)
        active = self.r.lrange(self.keys["active"], 0, -1)
        places = self._places(queued, active, self.r.zrange(self.keys["incomplete"], 0, -1))
        names = sorted({i for i, _ in places})
        bodies = dict(zip(names, self.r.mget(names), strict=True)) if names else {}
        held = {i.removeprefix(self.ids): w for i, w in places if i.startswith(self.ids) and bodies.get(i)}
        failed: set[str] = set()
        for n, raw in self._bodies().items():
            status = _body(raw).get("status")
            if status in FAILED:
                failed.add(n.removeprefix(self.ids))
            elif status != "complete" and n not in names:
                held[n.removeprefix(self.ids)] = _unlisted(status)
        return QueueState(held=held, failed=failed)

    def key_patterns(self) -> list[str]:
        # saq:P..., saq:job:P... and saq:abort:P...: a neighbouring run's P differs before its ":".
        return [f"saq:{self.prefix}*", f"{self.ids}*", f"saq:abort:{self.prefix}*"]

    def locate(self, snapshot: Snapshot) -> Located:
        found = Located()
        bodies = {
            name: _body(stored.items[0])
            for name, stored in snapshot.keys.items()
            if name.startswith(self.ids) and stored.type == "string" and stored.items
        }

        def members(key: str) -> list[str]:
            stored = snapshot.keys.get(key)
            return [m.decode(errors="replace") for m in stored.items] if stored is not None else []

        places = self._places(*(members(self.keys[k]) for k in ("queued", "active", "incomplete")))
        for saq_id, where in places:
            if saq_id in bodies:  # saq skips an id whose body is gone
                found.add(saq_id.removeprefix(self.ids), where, self._kind(where, bodies[saq_id]))
        listed = {saq_id for saq_id, _ in places}
        for saq_id, body in bodies.items():
            status = body.get("status")
            if status in FAILED or status == "complete":
                found.add(saq_id.removeprefix(self.ids), "job", "failed" if status in FAILED else "succeeded")
            elif saq_id not in listed:  # its body alone: a sweep that lost its worker left it "aborting"
                found.add(saq_id.removeprefix(self.ids), _unlisted(status))
        return found


class SaqReliable(SaqQueue):
    name = "saq:reliable"
    summary = "saq with timeout above the longest job, a heartbeat, retries = max_attempts, sweep every 1 s"
    reliable = True
