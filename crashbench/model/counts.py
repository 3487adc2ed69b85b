"""The counts of a run as records: every count (`Counts`, the outcome classes and the events around
them, each defined by its comment: docs/reference.md lists them), an evidence check that failed
(`Problem`), and Jepsen's total-queue vocabulary (`TotalQueue`). Computed by crashbench.evidence.counts
from the timeline; plain data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Counts:
    enqueued: int = 0  # jobs the producer enqueued (acknowledged or not): the outcome classes add up to it
    # outcome classes, one per enqueued job
    done: int = 0  # its handler ran to completion at least once
    dead_lettered: int = 0  # never completed; the queue dead-lettered it
    stranded: int = 0  # never completed, not dead; the queue still holds it after the final recovery
    failed: int = 0  # never completed, its handler raised or the queue recorded it failed, not dead-lettered
    lost: int = 0  # never completed, and the queue has no trace of it (its enqueue was acknowledged)
    unconfirmed: int = 0  # never completed, no trace, and its enqueue errored: it may never have been stored
    # events and anomalies
    duplicated: int = 0  # jobs completed more than once
    duplicated_overlapping: int = 0  # ... two of whose completions ran at the same time (a stolen live job)
    duplicated_sequential: int = 0  # ... run again only after a completion (e.g. killed before the ack)
    extra_executions: int = 0  # completions beyond the first, over all jobs
    failed_attempts: int = 0  # executions whose handler raised
    retried: int = 0  # jobs started again after a failed attempt
    early_retries: int = 0  # retries that started sooner after a failure than the backoff allows
    dead_lettered_poison: int = 0  # dead-lettered jobs whose last execution raised: for failing, not for crashing
    early_starts: int = 0  # starts of a delayed job (workload.delay_s) before it was due, by the harness clock
    # the ledger's: starts of a job after an earlier start of it that did not raise (a retry after a
    # failure is `retried`): what recovery (or a stolen delivery) gave back and a worker ran again
    redelivered: int = 0  # jobs started again so
    redeliveries: int = 0  # ... such starts, in all
    # the design's own word (state()), checked against the ledger (crashbench.evidence.checks.requeues)
    requeued: int = 0  # jobs recovery gave back at least once
    requeue_events: int = 0  # times recovery gave a job back
    empty_acks: int = 0  # acks that found nothing left to acknowledge (recovery, or a late ack, got there first)
    unexpected: int = 0  # ids executed that were never enqueued
    executions: int = 0  # handler starts, in all
    interrupted: int = 0  # handler starts that never finished (the worker died inside)
    kills: int = 0  # worker faults made (signals, pauses), as the injector recorded them
    kills_mid_job: int = 0  # ... of which the victim's ledger had a handler running at the signal
    poison_jobs: int = 0  # enqueued jobs the workload makes fail on every attempt
    transient_jobs: int = 0  # enqueued jobs the workload makes fail on their first attempts
    failing_jobs: int = 0  # poison_jobs + transient_jobs: the jobs whose first attempt raises
    # a crash loop (workload.crash_rate): jobs whose handler kills its own process on every attempt
    crash_jobs: int = 0  # enqueued jobs the workload makes crash
    crash_attempts: int = 0  # ... their executions, in all (each one a death of the process running it)
    # ... still held at the end (stranded or undrained) after more executions than queue.max_attempts:
    # retried without end, nothing in the queue stopped the loop
    crash_looping: int = 0
    # broker faults (a killed or failed-over server)
    indeterminate: int = 0  # enqueues that errored or timed out (or were not replicated in time)
    recovered: int = 0  # ... of which the job was done all the same
    acks_lost: int = 0  # jobs completed (and acked) before the broker fault that ran again after it
    stranded_at: dict[str, int] = field(default_factory=dict)  # where the stranded jobs sit
    # ... of the stranded and dead-lettered: held when Redis was read before the workers were stopped,
    # nowhere after (crashbench.run.reading): counted where they were, the stop's doing
    taken_by_stop: int = 0

    # a trimmed stream (crashbench.evidence.trim): lost jobs whose entry the stream no longer holds by
    # position (below its first entry at the end), from the entry ids XADD answered at enqueue
    trimmed: int = 0  # trimmed_unread + trimmed_pending
    trimmed_unread: int = 0  # ... trimmed before any worker started it
    trimmed_pending: int = 0  # ... trimmed while delivered and unacknowledged (a worker started it and never ended)

    # the CI gate's own counts: 0 unless something went wrong that nobody injected
    undrained: int = 0  # jobs still held when the drain gave up (at least 1 when it did); 0 drained
    # jobs the library and the ledger disagree on: it recorded a failure (or timeout) of a job whose
    # handler completed, or a success of a job whose handler never completed
    library_disagrees: int = 0
    worker_crashes: int = 0  # workers that exited although no fault was aimed at them
    # worker slots a network fault hit (behind Sentinel: any) that never started a handler again, after the heal (the
    # promotion), while jobs waited
    stuck_workers: int = 0
    unrecovered: int = 0  # jobs a fault interrupted (mid-job) that never started again
    # broker-fault evidence, so an expectation can be exact ("lost == held_at_fault")
    held_at_fault: int = 0  # jobs the server held (harness's reading) when the fault struck, never completed
    acked_during_lag: int = 0  # enqueues the primary acknowledged after its replica stopped following, never completed
    # a cluster fault: jobs the primary held as it was struck that the promoted replica did not hold (the
    # harness's reading of each), acknowledged, never completed: what the promotion lost (crashbench.faults.cluster)
    not_replicated: int = 0
    # a sentinel fault (crashbench.faults.sentinel), from the ledger:
    mid_job_at_fault: int = 0  # handlers running when the primary was killed
    mid_job_ran_again: int = 0  # ... whose job ran again after it (its ack or its completion went with the primary)
    promoted_without_quorum: int = 0  # sentinel-quorum: 1 if a replica was promoted while the sentinels had no quorum
    # a split brain (sentinel-partition, crashbench.faults.sentinel.partition): the primary cut off from the
    # sentinels while the producer (and [broker] minority_workers workers) go on writing to it, until it heals
    acked_on_old_primary: int = 0  # enqueues the old primary acknowledged between the cut and the heal (done or not)
    # ... that it did not acknowledge then: refused (NOREPLICAS: min-replicas-to-write) or unanswered
    refused_on_old_primary: int = 0
    # jobs the old primary held as the partition healed (its last word) that the promoted replica did not hold
    # as it was promoted (the harness's reading of each side), done or not: what the old primary alone took
    old_primary_only: int = 0
    workers_on_old_primary: int = 0  # the minority's worker connections the old primary still served as it healed
    # a power cut (power-loss, crashbench.faults.power.cut), by id from the AOF's bytes and the durable state:
    enqueues_cut: int = 0  # enqueues acknowledged before the cut that no command of the AOF it left names
    # jobs the durable state held that the server no longer held as it died: taken or acknowledged in memory,
    # not on the disk, so they come back
    acks_cut: int = 0
    acks_cut_reran: int = 0  # ... of them, the jobs that ran again after the cut
    # deploys, rolling restarts (crashbench.faults.deploy): SIGTERM to each worker in turn, SIGKILL at the grace's end
    rollouts: int = 0  # rolling restarts made
    deploy_stops: int = 0  # workers a rollout sent SIGTERM to
    deploy_graceful: int = 0  # ... that exited before their grace ended (whatever they did with their jobs)
    deploy_killed: int = 0  # ... still alive when their grace ended: their tree SIGKILLed
    deploy_interrupted: int = 0  # jobs started in a worker a rollout stopped that never ended there (its final ledger)
    deploy_lost: int = 0  # ... of which lost: what the rollouts cost (per rollout: deploy_lost / rollouts)
    # migrations from the list queue to the stream (crashbench.faults.migrate, design migrating)
    migrations: int = 0  # flips of the producer's flag from the list to the stream
    enqueued_list: int = 0  # jobs enqueued before the flip: onto the list
    enqueued_stream: int = 0  # ... after it: onto the stream
    # 1 when the harness read the list side empty (pending, delayed, every processing list) after the flip
    list_drained: int = 0
    list_drain_ms: int = 0  # ms from the flip to that reading (0: never read empty before the list workers stopped)
    list_workers_stopped: int = 0  # list workers the migration stopped (SIGTERM), drained or not
    lost_list: int = 0  # lost jobs enqueued onto the list
    lost_stream: int = 0  # ... onto the stream
    stranded_list: int = 0  # stranded jobs the harness found in the list side's keys
    stranded_stream: int = 0  # ... in the stream side's
    duplicated_list: int = 0  # duplicated jobs enqueued onto the list
    duplicated_stream: int = 0  # ... onto the stream
    # hosts (crashbench.faults.hosts): a network and PID namespace each, with its worker slots
    host_crashes: int = 0  # host crashes made: a host's init SIGKILLed, every process on it with it
    host_crash_workers: int = 0  # workers a host crash killed
    host_crash_interrupted: int = 0  # jobs started in a worker a crash killed, never ended there (final ledger)
    host_crash_rerun: int = 0  # ... of which a later execution started, anywhere (the ledger): they ran again
    host_crash_lost: int = 0  # ... of which lost: what the crashes cost
    host_pauses: int = 0  # host pauses made: every process on a host SIGSTOPped, then SIGCONTinued
    host_partitions: int = 0  # host partitions made: a host cut off from the server (iptables DROP), then healed
    # an eviction fault (crashbench.faults.eviction), from the server's own notifications of what it evicted
    evicted_keys: int = 0  # evictions of the run's keys while the memory limit held (a key evicted twice: 2)
    evicted_neighbour: int = 0  # evictions of the neighbour's keys (outside the run's namespace)
    # lost jobs (still in `lost`) held in an evicted key of the run's at the harness's last readings before it went
    lost_to_eviction: int = 0
    oom_refused: int = 0  # commands of the run's clients the server refused (OOM) while the limit held: INFO errorstats
    # consumers the streams' groups still held at the harness's final reading (XINFO CONSUMERS): a
    # name stays until deleted, so without a cleanup each killed consumer is left behind
    consumers: int = 0
    # the user's own evidence: their check of their system of record, called with each job's payload after
    # the run ([app] check; crashbench.evidence.effects); 0 without a check
    effect_checked: int = 0  # enqueued jobs the check was asked about (every one, when the run had a check)
    effect_missing: int = 0  # ... whose effect the check does not find
    effect_duplicated: int = 0  # ... finds more than once (the task's side effect ran twice)
    # ... whose effect count and the ledger's completions disagree (none, once, more than once): an effect
    # written by an attempt killed before it completed, or a duplicate run the app absorbed
    effect_disagrees: int = 0


@dataclass(frozen=True, slots=True)
class Problem:
    """A check of the evidence that failed: crashbench, or the design's report of itself, is wrong.
    `check` names the check (crashbench.evidence.checks), `ids` the jobs involved (the first 100)."""

    check: str
    message: str
    ids: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        shown = f": {', '.join(self.ids[:10])}{' ...' if len(self.ids) > 10 else ''}" if self.ids else ""
        return f"[{self.check}] {self.message}{shown}"


@dataclass(slots=True)
class TotalQueue:
    """Jepsen's total-queue checker vocabulary over the same evidence: of the enqueues `attempted`, the
    `acknowledged` ones that completed (`ok`) or were `lost`; `recovered`: unacknowledged ones that
    completed all the same; `unexpected`: completed ids never enqueued; `duplicated`: completed more
    than once. `valid`: nothing lost, nothing unexpected, and no duplicate where the design promises
    exactly once."""

    attempted: int
    acknowledged: int
    ok: int
    lost: int
    unexpected: int
    duplicated: int
    recovered: int
    valid: bool
