"""The command-line options that override one scenario key each (`OVERRIDES`: flag, the key's flat name,
its type, its help), and the finite-number type they share. crashbench.cli.common applies them;
crashbench.cli.reference documents every key from their help texts."""

from __future__ import annotations

import math
from typing import Any

import click

from crashbench.model.faults import OLD_NAMES
from crashbench.model.workload import CRASH_HOW, DISTRIBUTIONS, JOB_WORK
from crashbench.scenario import (
    BROKER_FAULTS,
    FAILOVER_ADDRESS,
    FAULT_SIGNALS,
    KILL_TARGETS,
    KILL_WHEN,
    PERSISTENCE,
    POWER_CUT,
    PRODUCE,
    STREAM_TRIM,
    TOPOLOGY,
)


class FiniteFloat(click.FloatRange):
    """A number option that refuses nan and inf: click's float accepts both, and nan passes any range
    check (every comparison with it is false), so `--interval inf` would wait forever."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:  # no "[x<=None]" in --help for a number without bounds
        return "" if self.min is None and self.max is None else super()._describe_range()


FINITE = FiniteFloat()

# (flag, scenario field, type, help): each overrides the scenario key named in its help.
# Scenario.with_overrides validates the values as it does a TOML file's (ranges, nan and inf too).
OVERRIDES: list[tuple[str, str, Any, str]] = [
    ("--jobs", "jobs", int, "Jobs to enqueue (workload.jobs)."),
    ("--job-ms", "job_ms", FINITE, "Handler duration in ms, the median for longtail (workload.job_ms)."),
    ("--workers", "workers", int, "Concurrent worker processes (workload.workers)."),
    ("--job-dist", "job_dist", click.Choice(DISTRIBUTIONS), "Handler durations: fixed, uniform 0.5-1.5x, or a Pareto long tail (workload.job_dist)."),
    ("--job-ms-max", "job_ms_max", FINITE, "Cap of the longtail durations in ms; 0 = 100 x job-ms (workload.job_ms_max)."),
    ("--poison-rate", "poison_rate", FINITE, "Share of jobs whose handler always raises, 0..1 (workload.poison_rate)."),
    ("--transient-rate", "transient_rate", FINITE, "Share of jobs that raise on their first attempts, 0..1 (workload.transient_rate)."),
    ("--transient-failures", "transient_failures", int, "How many first attempts of a transient job raise (workload.transient_failures)."),
    ("--crash-rate", "crash_rate", FINITE, "Share of jobs whose handler kills its own worker on every attempt, 0..1 (workload.crash_rate)."),
    ("--job-work", "job_work", click.Choice(JOB_WORK), "How a handler spends its duration: sleep, or gil (one call that holds the GIL throughout, a CPU-bound job) (workload.job_work)."),
    ("--crash-how", "crash_how", click.Choice(CRASH_HOW), "How a crash job dies: sigkill, exit (os._exit), memory (past a memory limit) (workload.crash_how)."),
    ("--produce", "produce", click.Choice(PRODUCE), "before: enqueue every job before the workers start; during: over --produce-s seconds while they run (workload.produce)."),
    ("--delay-s", "delay_s", FINITE, "Delay each job this many seconds through the library's own delay API; 0 = none (workload.delay_s)."),
    ("--delay-share", "delay_share", FINITE, "Share of jobs delayed when --delay-s > 0, 0..1 (workload.delay_share)."),
    ("--kills", "kills", int, "Faults to inject (faults.kills)."),
    ("--interval", "interval", FINITE, "Seconds between faults (faults.interval)."),
    ("--signal", "signal", str, f"Fault signal: {', '.join(FAULT_SIGNALS)}; SIGSTOP pauses for --pause s (faults.signal)."),
    ("--kill-when", "kill_when", click.Choice(KILL_WHEN), "mid-job: wait until the victim is inside a handler; any: on the clock (faults.kill_when)."),
    ("--seed", "seed", int, "Seed for victims and failing jobs; same seed, same schedule (faults.seed)."),
    ("--kill-target", "kill_target", click.Choice(KILL_TARGETS), "For library workers: the whole process tree, only the worker process, or only the child running the job (faults.kill_target)."),
    ("--pause", "pause", FINITE, "Seconds a SIGSTOPped worker stays paused before SIGCONT (faults.pause)."),
    ("--stale-after", "stale_after", FINITE, "Seconds before recovery takes back a silent worker's jobs (queue.stale_after)."),
    ("--recover-every", "recover_every", FINITE, "Seconds between recovery passes (queue.recover_every)."),
    ("--max-attempts", "max_attempts", int, "Deliveries before a job is dead-lettered (queue.max_attempts)."),
    ("--retry-base", "retry_base", FINITE, "Seconds before the first retry of a failed job (queue.retry_base)."),
    ("--retry-factor", "retry_factor", FINITE, "Each further retry waits this many times longer (queue.retry_factor)."),
    ("--retry-jitter", "retry_jitter", FINITE, "Plus up to this fraction of the delay at random (queue.retry_jitter)."),
    ("--heartbeat-every", "heartbeat_every", FINITE, "Heartbeat inside handlers every N s; 0 = between jobs only (queue.heartbeat_every)."),
    ("--batch-size", "batch_size", int, "Jobs per round trip for the batching designs (queue.batch_size)."),
    ("--shards", "shards", int, "Queues the sharded design spreads its jobs over; 0 = one per cluster primary, 1 on one server (queue.shards)."),
    ("--stream-maxlen", "stream_maxlen", int, "The stream designs trim their stream to this many entries on every XADD (MAXLEN), acknowledged or not; 0 = never (queue.stream_maxlen)."),
    ("--stream-trim", "stream_trim", click.Choice(STREAM_TRIM), "exact: MAXLEN N; approximate: MAXLEN ~ N, whole nodes only (queue.stream_trim)."),
    ("--socket-timeout", "socket_timeout", FINITE, "Built-in workers' socket and connect timeout, s; 0 = none, to see a half-open connection hang (queue.socket_timeout)."),
    ("--concurrency", "concurrency", int, "Handlers one library worker runs at once; 0 = the library's shipped default (queue.concurrency)."),
    ("--broker-fault", "fault", click.Choice([*BROKER_FAULTS, *OLD_NAMES]), "Fault the server itself: kill it and restart it (broker-kill; kill is its old name), or fail over to its replica (broker.fault)."),
    ("--fault-at", "fault_at", FINITE, "Seconds after the workers start when the broker fault strikes (broker.fault_at)."),
    ("--downtime", "downtime", FINITE, "Seconds a killed server stays down (broker.downtime)."),
    ("--persistence", "persistence", click.Choice(PERSISTENCE), "Persistence of the embedded server (broker.persistence)."),
    ("--produce-s", "produce_s", FINITE, "With a broker fault or --produce during, enqueue the jobs over this many seconds (broker.produce_s)."),
    ("--wait-replicas", "wait_replicas", int, "WAIT for this many replicas after each enqueue, reliable design (broker.wait_replicas)."),
    ("--wait-aof", "wait_aof", int, "WAITAOF for the server's own fsync of each enqueue (1; Redis 7.2+, valkey), reliable and stream designs (broker.wait_aof)."),
    ("--wait-ms", "wait_ms", int, "... at most this many ms; later is indeterminate (broker.wait_ms)."),
    ("--replica-lag", "replica_lag", FINITE, "Failover: the replica stops following the primary this many s before it dies (broker.replica_lag)."),
    ("--failover-address", "failover_address", click.Choice(FAILOVER_ADDRESS), "Failover: new (clients told the replica's address) or kept (the replica takes the primary's port, as a managed endpoint does: library workers follow) (broker.failover_address)."),
    ("--topology", "topology", click.Choice(TOPOLOGY), "The servers: single, or sentinel (a private primary, two replicas and three sentinels; the workers are told only the sentinels, as an application configured with Sentinel is; --sentinel says the same) (broker.topology)."),
    ("--power-cut", "power_cut", click.Choice(POWER_CUT), "power-loss: clean (every file back to what was fsynced) or torn (a random prefix of the next page kept too) (broker.power_cut)."),
    ("--writeback", "writeback", FINITE, "power-loss: the kernel's writeback, s: unsynced bytes durable that long after their write (0: only an fsync) (broker.writeback)."),
    ("--drain-timeout", "drain_timeout", FINITE, "Seconds to wait for the queue to drain after the last fault (run.drain_timeout)."),
    ("--app", "app", str, "Your own app under the library adapter --design names, as module:attr (a Celery app, arq WorkerSettings, a taskiq-redis broker, saq settings; for RQ a module): crashbench swaps in the run's server only (app.app)."),
    ("--task", "task", str, "The task of --app to enqueue: its registered name (Celery, taskiq), a function of the module (RQ) or of the settings (arq, saq) (app.task)."),
    ("--payloads", "payloads", str, "One payload per job: a JSONL file (line n is job n's) or module:function(n); an object is keyword arguments, a list positional ones; default: the job number (app.payloads)."),
    ("--check", "check", str, "Your own evidence: module:function(payload) -> how many times the job's effect exists in your system of record (app.check)."),
]  # fmt: skip
