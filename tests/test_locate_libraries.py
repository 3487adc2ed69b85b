"""Each library adapter's `locate`: the harness's own reading of the library's key layout (real server).

Every test enqueues through the adapter, then plants in Redis the inconsistencies a crash can leave
(a body gone while its id is still listed, an id listed nowhere, a failure record) and checks that
`locate` reports exactly what the library could still deliver, and nothing of a neighbouring run.
"""

from __future__ import annotations

import json
import pickle
import secrets
import time
from collections.abc import Iterator

import pytest
import redis

from crashbench.designs import Design, load_design, safe_name
from crashbench.evidence import inspector
from crashbench.evidence.checks import Evidence, check
from crashbench.model.queue import DesignSettings, Job, Located
from tests.test_libraries import installed

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

JOBS = ["000001", "000002", "000003", "000004", "000005"]
NEIGHBOUR_JOBS = ["900001", "900002"]  # enqueued by another run on the same server: never located


@pytest.fixture
def run_id(valkey_url: str) -> Iterator[str]:
    """A run id of this test's own; every key naming it is deleted after the test, so that no later
    test on the session's server finds these hand-made runs (tests/test_sharded.py looks for any)."""
    rid = secrets.token_hex(4)
    yield rid
    r = redis.Redis.from_url(valkey_url)
    names = list(r.scan_iter(match=f"*{rid}*", count=1000))
    if names:
        r.delete(*names)
    r.close()


def _design(client: redis.Redis, spec: str, run_id: str, index: int) -> Design:
    prefix = f"crashbench:{run_id}:{index}-{safe_name(spec)}:"
    return load_design(spec)(client, prefix, DesignSettings())


@pytest.fixture
def raw(valkey_url: str) -> Iterator[redis.Redis]:
    r = inspector.raw_client(valkey_url)
    yield r
    r.close()


def _enqueued(client: redis.Redis, raw: redis.Redis, spec: str, run_id: str) -> tuple[Design, Design]:
    """The design under test (index 1) with JOBS enqueued, and a run of the same design at index 10
    (names one digit apart) holding NEIGHBOUR_JOBS: the two runs' patterns must reach disjoint keys."""
    neighbour = _design(client, spec, run_id, 10)
    neighbour.enqueue([Job(j) for j in NEIGHBOUR_JOBS])
    design = _design(client, spec, run_id, 1)
    design.enqueue([Job(j) for j in JOBS])
    ours = set(inspector.take(raw, design.key_patterns()).keys)
    theirs = set(inspector.take(raw, neighbour.key_patterns()).keys)
    assert ours and theirs and not ours & theirs
    return design, neighbour


def _locate(design: Design, raw: redis.Redis) -> Located:
    found = design.locate(inspector.take(raw, design.key_patterns()))
    assert not (set(found.held) | set(found.dead) | found.failed) & set(NEIGHBOUR_JOBS)
    return found


def _held(found: Located) -> dict[str, list[str]]:
    return {j: sorted(places) for j, places in found.held.items()}


@installed("rq")
def test_rq_holds_a_job_only_while_its_job_hash_exists(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    d, _ = _enqueued(client, raw, "rq", run_id)
    q = d.qname  # type: ignore[attr-defined]
    found = _locate(d, raw)
    assert _held(found) == {j: ["queue"] for j in JOBS}
    assert (found.dead, found.delayed, found.failed) == ({}, set(), set())

    def rq(job: str) -> str:
        return f"{q}-{job}"

    # 000001: still queued, its hash expired or deleted (and a started entry of it as well);
    # 000002: popped into the intermediate list, its horse not started; 000003: started;
    # 000004: a retry waiting in the scheduled registry; 000005: in the failed registry.
    raw.delete(f"rq:job:{rq('000001')}")
    raw.zadd(f"rq:wip:{q}", {f"{rq('000001')}:execution-2": time.time() + 60})
    raw.lrem(f"rq:queue:{q}", 0, rq("000002"))
    raw.rpush(f"rq:queue:{q}:intermediate", rq("000002"))
    for job, registry, member in (
        ("000003", "wip", f"{rq('000003')}:execution-1"),  # wip entries are "<job>:<execution>"
        ("000004", "scheduled", rq("000004")),
        ("000005", "failed", rq("000005")),
    ):
        raw.lrem(f"rq:queue:{q}", 0, rq(job))
        raw.zadd(f"rq:{registry}:{q}", {member: time.time() + 60})

    found = _locate(d, raw)
    assert _held(found) == {"000002": ["intermediate"], "000003": ["started"], "000004": ["scheduled"]}
    assert found.delayed == {"000004"}
    assert found.failed == {"000005"}
    assert d.backlog() == 5  # the queue's own count still includes 000001 (and its started entry)
    # 000001's entries name a job RQ can no longer run: void (lost unless done), which the harness's search,
    # finding the id in them, takes as accounted for; the design's own report reads it the same way.
    assert found.void == {"000001"}
    assert d.state().held == {"000002": "intermediate", "000003": "started", "000004": "scheduled"}

    # 000003's registry entry gone (an eviction of rq:wip), its hash kept: held by nothing but the hash.
    raw.zrem(f"rq:wip:{q}", f"{rq('000003')}:execution-1")
    found = _locate(d, raw)
    assert found.held["000003"] == ["hash-only"] and d.state().held["000003"] == "hash-only"
    # A hash that records its job finished is RQ's record of a success, held by nothing.
    raw.hset(f"rq:job:{rq('000003')}", "status", "finished")
    found = _locate(d, raw)
    assert "000003" not in found.held and "000003" in found.succeeded and "000003" not in d.state().held


@installed("rq")
def test_rq_failed_registry_counts_without_the_job_hash(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    d, _ = _enqueued(client, raw, "rq", run_id)
    q = d.qname  # type: ignore[attr-defined]
    raw.lrem(f"rq:queue:{q}", 0, f"{q}-000002")
    raw.delete(f"rq:job:{q}-000002")
    raw.zadd(f"rq:failed:{q}", {f"{q}-000002": time.time() + 60})
    found = _locate(d, raw)
    assert found.failed == {"000002"} and "000002" not in found.held


def _rq_worker_between_dequeue_and_horse(d: Design) -> tuple[object, object]:
    """RQ's own steps up to the fork, as its Worker takes them: BLMOVE from the queue into the
    intermediate list (Queue.dequeue_any -> Queue.lmove), then the worker's registration of the
    execution in rq:wip (Worker.prepare_execution). The work horse's step that takes the id off the
    intermediate list (Worker.prepare_job_execution) is left to the caller: a half-open connection
    at the fork leaves the job here. Returns RQ's worker and job."""
    from rq import Queue, Worker

    class Quiet(Worker):  # RQ's worker, minus renaming the test process (setproctitle)
        def procline(self, message: str) -> None:
            pass

    worker = Quiet([d.queue], connection=d.raw, name=f"{d.qname}-w0")  # type: ignore[attr-defined]
    taken = Queue.dequeue_any([d.queue], timeout=1, connection=d.raw)  # type: ignore[attr-defined]
    assert taken is not None
    job, _ = taken
    worker.prepare_execution(job)
    return worker, job


def _evidence(d: Design, found: Located) -> Evidence:
    return Evidence(enqueued=JOBS, executions=[], located=found, state=d.state(), drained=False, own_worker=True)


@installed("rq")
def test_rq_job_between_worker_and_horse_is_one_started_holding(
    client: redis.Redis, raw: redis.Redis, run_id: str
) -> None:
    d, _ = _enqueued(client, raw, "rq", run_id)
    q = d.qname  # type: ignore[attr-defined]
    worker, job = _rq_worker_between_dequeue_and_horse(d)
    first = job.id.removeprefix(f"{q}-")
    assert first == JOBS[0]
    # The state RQ leaves: the id both in the intermediate list and (as "<job>:<execution>") in rq:wip.
    assert raw.lrange(f"rq:queue:{q}:intermediate", 0, -1) == [job.id.encode()]
    assert [m.split(b":")[0] for m in raw.zrange(f"rq:wip:{q}", 0, -1)] == [job.id.encode()]
    # RQ's own cleanup of the intermediate list reads it as started: it leaves the id alone.
    d.queue.intermediate_queue.cleanup(worker, d.queue)  # type: ignore[attr-defined]
    assert raw.lrange(f"rq:queue:{q}:intermediate", 0, -1) == [job.id.encode()]
    assert not raw.exists(d.queue.intermediate_queue.get_first_seen_key(job.id))  # type: ignore[attr-defined]

    found = _locate(d, raw)
    assert _held(found) == {first: ["started:intermediate"]} | {j: ["queue"] for j in JOBS[1:]}
    assert d.state().held[first] == "started"
    assert d.backlog() == len(JOBS)  # one job, counted once
    assert check(_evidence(d, found)) == []

    # The horse's step: the id leaves the intermediate list; the job is started, in one place still.
    worker.prepare_job_execution(job, remove_from_intermediate_queue=True)  # type: ignore[attr-defined]
    found = _locate(d, raw)
    assert _held(found)[first] == ["started"]
    assert check(_evidence(d, found)) == []


@installed("rq")
def test_rq_a_job_really_in_two_places_still_fires_held_twice(
    client: redis.Redis, raw: redis.Redis, run_id: str
) -> None:
    d, _ = _enqueued(client, raw, "rq", run_id)
    q = d.qname  # type: ignore[attr-defined]
    _, job = _rq_worker_between_dequeue_and_horse(d)
    first, second = JOBS[0], JOBS[1]
    # 000001, started, pushed back onto the queue as well: a worker would run it a second time.
    raw.rpush(f"rq:queue:{q}", job.id)
    # 000002: still queued, and in the intermediate list too (not started: no transition of RQ's).
    raw.rpush(f"rq:queue:{q}:intermediate", f"{q}-{second}")

    found = _locate(d, raw)
    assert _held(found)[first] == ["queue", "started:intermediate"]
    assert _held(found)[second] == ["intermediate", "queue"]
    problems = [p for p in check(_evidence(d, found)) if p.check == "held_twice"]
    assert [p.ids for p in problems] == [[first, second]]


def _celery_message(raw: redis.Redis, list_key: str) -> tuple[str, bytes]:
    """Pop the message a worker would take next (kombu BRPOPs), as its task id and raw JSON."""
    message = raw.rpop(list_key)
    return json.loads(message)["headers"]["id"], message


@installed("celery")
def test_celery_places_queue_and_unacked_messages(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    d, neighbour = _enqueued(client, raw, "celery", run_id)
    try:
        found = _locate(d, raw)
        assert _held(found) == {j: ["queue"] for j in JOBS}

        p = d.prefix
        delivered, m1 = _celery_message(raw, p + "jobs")
        unindexed, m2 = _celery_message(raw, p + "jobs")
        dropped, _ = _celery_message(raw, p + "jobs")  # taken and acked: gone
        # A delivery as kombu records it: the unacked entry and its index entry, in one transaction.
        raw.hset(p + "unacked", "tag-1", json.dumps([json.loads(m1), "", "jobs"]))
        raw.zadd(p + "unacked_index", {"tag-1": time.time()})
        # An entry the visibility sweep cannot find, and an index entry with nothing behind it.
        raw.hset(p + "unacked", "tag-2", json.dumps([json.loads(m2), "", "jobs"]))
        raw.zadd(p + "unacked_index", {"tag-3": time.time()})

        found = _locate(d, raw)
        expected = {j: ["queue"] for j in JOBS if j not in (delivered, unindexed, dropped)}
        assert _held(found) == expected | {delivered: ["unacked"], unindexed: ["unacked:unindexed"]}
        assert set(d.state().held) == set(found.held)
    finally:
        for design in (d, neighbour):
            design.app.close()  # type: ignore[attr-defined]


@installed("dramatiq")
def test_dramatiq_holds_a_job_where_its_message_body_is(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    d, _ = _enqueued(client, raw, "dramatiq", run_id)
    p = d.prefix
    found = _locate(d, raw)
    assert _held(found) == {j: ["queue"] for j in JOBS}

    bodies = raw.hgetall(p + "jobs.msgs")
    mid = {json.loads(m)["args"][0]: k for k, m in bodies.items()}
    # 000001: fetched by worker w1 (in its ack set); 000002: its body gone, its id still queued;
    # 000003: its body kept, its id in no list and no ack set; 000004: a retry waiting in the delay
    # queue; 000005: dead-lettered.
    raw.lrem(p + "jobs", 0, mid["000001"])
    raw.sadd(p + "__acks__.w1.jobs", mid["000001"])
    raw.hdel(p + "jobs.msgs", mid["000002"])
    raw.lrem(p + "jobs", 0, mid["000003"])
    for job, queue in (("000004", "jobs.DQ"), ("000005", "jobs.XQ")):
        raw.lrem(p + "jobs", 0, mid[job])
        raw.hdel(p + "jobs.msgs", mid[job])
        raw.hset(p + queue + ".msgs", mid[job], bodies[mid[job]])
    raw.rpush(p + "jobs.DQ", mid["000004"])
    raw.zadd(p + "jobs.XQ", {mid["000005"]: time.time()})
    raw.sadd(p + "__acks__.w2.jobs", mid["000002"])  # an ack-set entry without a body either

    found = _locate(d, raw)
    assert _held(found) == {"000001": ["acks:w1"], "000003": ["msgs-only"], "000004": ["delayed:queue"]}
    assert found.delayed == {"000004"}
    assert found.dead == {"000005": ["XQ"]}
    assert found.failed == set()
    state = d.state()
    assert set(state.held) == set(found.held) and state.dead_lettered == set(found.dead)


@installed("huey")
def test_huey_places_queued_and_scheduled_messages(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    d, _ = _enqueued(client, raw, "huey", run_id)
    storage = d.huey.storage  # type: ignore[attr-defined]
    found = _locate(d, raw)
    assert _held(found) == {j: ["queue"] for j in JOBS}
    assert found.delayed == set()

    def take() -> tuple[str, bytes]:
        """Pop the next message as huey's consumer does (RPOP): its job id and its bytes."""
        message = raw.rpop(storage.queue_key)
        return d.huey.serializer.deserialize(message).args[0], message  # type: ignore[attr-defined]

    scheduled, message = take()
    raw.zadd(storage.schedule_key, {message: time.time() + 60})  # a retry waiting for its eta
    dropped, _ = take()  # popped by a worker that died: nothing in Redis remembers it
    raw.lpush(storage.queue_key, b"not a pickle")  # not a message of ours: no job

    found = _locate(d, raw)
    expected = {j: ["queue"] for j in JOBS if j not in (scheduled, dropped)}
    assert _held(found) == expected | {scheduled: ["schedule"]}
    assert found.delayed == {scheduled}
    assert set(d.state().held) == set(found.held)


def _arq_result(success: bool) -> bytes:
    """A result as arq pickles it; a failure carries an exception class the harness cannot import."""
    data = pickle.dumps({"t": 1, "f": "crashbench_handle", "s": success, "r": ValueError("job failed")}, protocol=0)
    foreign = data.replace(b"cexceptions\nValueError", b"carq.jobs\nJobExecutionFailed")
    assert foreign != data  # protocol 0 names the class in plain text
    return foreign


def test_arq_holds_a_job_only_while_its_job_key_exists(client: redis.Redis, raw: redis.Redis, run_id: str) -> None:
    # The harness side of arq is plain redis-py: no arq needed.
    d, _ = _enqueued(client, raw, "arq", run_id)
    p = d.prefix
    found = _locate(d, raw)
    assert _held(found) == {j: ["queue"] for j in JOBS}

    raw.delete(f"arq:job:{p}000001")  # still queued, its job key gone: a worker fails it as expired
    raw.set(f"arq:in-progress:{p}000002", b"1")  # started by a worker
    for job, success in (("000003", False), ("000004", True)):  # ended: arq removes the job, keeps the result
        raw.zrem(d.queue, p + job)  # type: ignore[attr-defined]
        raw.delete(f"arq:job:{p}{job}")
        raw.set(f"arq:result:{p}{job}", _arq_result(success))
    raw.set(f"arq:in-progress:{p}000001", b"1")  # an in-progress key alone holds nothing either

    found = _locate(d, raw)
    assert _held(found) == {"000002": ["in-progress"], "000005": ["queue"]}
    assert found.failed == {"000003"}
    state = d.state()
    assert "000001" in state.held and state.failed == found.failed  # the design's own report keeps 000001


# Where a delayed job (Job.delay_s: the library's own delay API) waits, as each adapter reads it.
DELAYED_PLACES = {
    "rq": (["scheduled"], True),  # rq:scheduled:<Q>, scored by its due time
    "dramatiq": (["delayed:queue"], True),  # the delay queue Q.DQ
    # huey enqueues it with its eta; a consumer's worker pops it and only then adds it to huey.schedule.N
    "huey": (["queue"], False),
    "saq": (["incomplete"], True),  # `incomplete` scored by its due time, in no list yet
    "arq": (["queue"], False),  # the queue's score is its due time: the snapshot keeps no scores
    "celery": (["queue"], False),  # the message, with its eta, until a worker takes it (below)
}


@pytest.mark.parametrize(
    "spec", [pytest.param(s, marks=installed(s)) if s not in ("arq", "saq") else s for s in DELAYED_PLACES]
)
def test_a_delayed_job_is_located_where_its_library_keeps_it(
    client: redis.Redis, raw: redis.Redis, run_id: str, spec: str
) -> None:
    d = _design(client, spec, run_id, 1)
    try:
        d.enqueue([Job(j, delay_s=60.0) for j in JOBS])
        found = _locate(d, raw)
        places, delayed = DELAYED_PLACES[spec]
        assert _held(found) == {j: places for j in JOBS}
        assert found.delayed == (set(JOBS) if delayed else set())
        assert set(d.state().held) == set(found.held)
        if spec == "celery":  # a worker took one: kombu holds it in memory, unacked in Redis, until its eta
            taken, message = _celery_message(raw, d.prefix + "jobs")
            raw.hset(d.prefix + "unacked", "tag-1", json.dumps([json.loads(message), "", "jobs"]))
            raw.zadd(d.prefix + "unacked_index", {"tag-1": time.time()})
            assert _held(_locate(d, raw))[taken] == ["unacked:eta"]
    finally:
        if spec == "celery":
            d.app.close()  # type: ignore[attr-defined]


@installed("rq")
def test_rq_a_started_job_of_a_run_with_a_token_is_held_once_not_also_hash_only(
    client: redis.Redis, raw: redis.Redis, run_id: str
) -> None:
    """Ids on the wire carry the run's token, Located's do not (crashbench.jobids.canonical): a job hash
    named by the started registry is that job's place, never also a "hash-only" one (held twice)."""
    from crashbench import jobids

    tok = jobids.token()
    jobids.register(tok)
    d = _design(client, "rq", run_id, 2)
    wired = [jobids.wire(j, tok) for j in JOBS]
    d.enqueue([Job(j) for j in wired])
    q = d.qname  # type: ignore[attr-defined]
    raw.lrem(f"rq:queue:{q}", 0, f"{q}-{wired[0]}")
    raw.zadd(f"rq:wip:{q}", {f"{q}-{wired[0]}:execution-1": time.time() + 60})
    found = _locate(d, raw)
    assert found.held["000001"] == ["started"] and found.void == set()
    assert {j for j, places in found.held.items() if len(places) > 1} == set()


@pytest.mark.parametrize("spec", ["rq", "celery", "dramatiq", "huey"])
def test_a_library_s_backlog_is_read_in_one_transaction(
    client: redis.Redis, raw: redis.Redis, run_id: str, valkey_url: str, spec: str
) -> None:
    """The drain ends on backlog() == 0: read one key at a time, a job moving between two of the library's
    places (RQ's scheduler retrying into the queue, kombu restoring an unacked message, dramatiq's delay
    queue, huey's schedule) could be in none of them as each was read (a CI run: "backlog() said 0, yet a
    job started 0.21 s after"). The server's own MONITOR shows every read of it inside one MULTI."""
    pytest.importorskip(spec)
    d, _ = _enqueued(client, raw, spec, run_id)
    watcher = redis.Redis.from_url(valkey_url)
    with watcher.monitor() as m:
        assert d.backlog() == len(JOBS)
        seen: list[str] = []
        while (command := m.next_command()["command"].split()[0].upper()) != "EXEC":
            seen.append(command)
    watcher.close()
    reads = [c for c in seen if c not in ("HELLO", "CLIENT", "SELECT", "AUTH", "PING")]  # a connection's setup
    assert reads[0] == "MULTI" and len(reads) >= 3, seen
