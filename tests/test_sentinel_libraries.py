"""The library adapters on a Sentinel topology (crashbench.designs.sentinels): each worker is configured through
its library's own Sentinel support (or, for a library without one, handed redis-py's Sentinel client), and
under sentinel-kill the workers take jobs from the replica the sentinels promote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from redis.sentinel import SentinelConnectionPool

from crashbench.control.connect import sentinel_client
from crashbench.designs import load_design
from crashbench.model.spec import Scenario
from tests.test_worker_python import arq_python

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# Nothing listens there: every client here is lazy, and what is checked is how each library was configured.
URL = "redis+sentinel://:s3cret@127.0.0.1:26001,127.0.0.1:26002/mymaster/3"
SENTINELS = [("127.0.0.1", 26001), ("127.0.0.1", 26002)]


def _design(name: str, sc: Scenario, url: str = URL) -> Any:
    client = sentinel_client(url, decode_responses=True) if url == URL else __import__("redis").Redis.from_url(url)
    return load_design(name)(client, "crashbench:{t}:", sc.settings(name))


def _sentinel_pool(pool: Any) -> tuple[str, int, str | None]:
    assert isinstance(pool, SentinelConnectionPool), f"not a Sentinel pool: {type(pool).__name__}"
    addresses = [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
                 for s in pool.sentinel_manager.sentinels]  # fmt: skip
    assert addresses == SENTINELS
    return pool.service_name, pool.connection_kwargs["db"], pool.connection_kwargs.get("password")


def test_celery_workers_get_kombu_s_sentinel_broker_and_its_master_name(small: Scenario) -> None:
    for name in ("celery", "celery:acks-late"):
        conf = _design(name, small).app.conf
        assert conf.broker_url == "sentinel://:s3cret@127.0.0.1:26001/3;sentinel://:s3cret@127.0.0.1:26002/3"
        options = conf.broker_transport_options
        assert options["master_name"] == "mymaster" and options["global_keyprefix"] == "crashbench:{t}:"
        transport = _design(name, small).app.connection_for_write().transport
        assert type(transport).__name__ == "SentinelTransport"
    plain = _design("celery", small, "redis://127.0.0.1:1/0").app.conf  # the harness's: the plain URL
    assert plain.broker_url == "redis://127.0.0.1:1/0" and "master_name" not in plain.broker_transport_options


def test_rq_workers_get_the_connection_rq_builds_from_its_sentinel_settings(small: Scenario) -> None:
    raw = _design("rq:reliable", small).raw
    assert _sentinel_pool(raw.connection_pool) == ("mymaster", 3, "s3cret")
    assert not raw.connection_pool.connection_kwargs.get("decode_responses")  # RQ's pickles: bytes


def test_dramatiq_and_huey_without_sentinel_support_get_redis_py_s_sentinel_client(small: Scenario) -> None:
    assert _sentinel_pool(_design("dramatiq", small).broker.client.connection_pool) == ("mymaster", 3, "s3cret")
    assert _sentinel_pool(_design("huey", small).huey.storage.conn.connection_pool) == ("mymaster", 3, "s3cret")


def test_taskiq_workers_get_taskiq_redis_s_sentinel_brokers_and_taskiq_reliable_is_refused(small: Scenario) -> None:
    from taskiq_redis import ListQueueSentinelBroker, RedisStreamSentinelBroker

    from crashbench.errors import UsageError
    from crashbench.run.session import Options, run_designs

    for name, cls in (("taskiq", ListQueueSentinelBroker), ("taskiq:stream", RedisStreamSentinelBroker)):
        broker = _design(name, small).make_broker()
        assert type(broker) is cls and broker.master_name == "mymaster"
        assert [tuple(s.connection_pool.connection_kwargs[k] for k in ("host", "port"))
                for s in broker.sentinel.sentinels] == SENTINELS  # fmt: skip
        assert broker.sentinel.connection_kwargs["db"] == 3
    with pytest.raises(UsageError, match=r"cannot run behind Sentinel.*no claim"):
        run_designs(small.replace(kills=0, fault="sentinel-kill"), ["taskiq:reliable"], Options())


CHECK_ASYNC = """
import json, sys
from crashbench.control.connect import sentinel_client
from crashbench.designs import load_design
from crashbench.model.queue import DesignSettings
client = sentinel_client(sys.argv[1], decode_responses=True)
s = load_design("arq")(client, "crashbench:{t}:", DesignSettings()).redis_settings()
queue = load_design("saq")(client, "crashbench:{t}:", DesignSettings()).saq_queue()
pool = queue.redis.connection_pool
print(json.dumps({"arq": [s.sentinel, [list(h) for h in s.host], s.sentinel_master, s.database, s.password],
                  "saq": [type(queue).__name__, type(pool).__name__, pool.service_name,
                          pool.connection_kwargs.get("db"), pool.connection_kwargs.get("password")]}))
"""


def test_arq_gets_its_sentinel_settings_and_saq_redis_asyncio_s_sentinel_client() -> None:
    python = arq_python()
    done = subprocess.run(
        [python, "-c", CHECK_ASYNC, URL], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["arq"] == [True, [list(s) for s in SENTINELS], "mymaster", 3, "s3cret"]
    assert got["saq"] == ["RedisQueue", "SentinelConnectionPool", "mymaster", 3, "s3cret"]


# A library's own Sentinel support (kombu's URL, RQ's settings) and a client handed to it (saq's, an asyncio
# one, under its own interpreter, .venv/arq; Dramatiq's and huey's are redis-py's synchronous client, which
# tests/test_sentinel.py follows through a failover). taskiq's and arq's own Sentinel support are in the
# committed runs (every library resumed: the test below) and the configuration tests above: the suite's time.
RUN = ("celery:acks-late", "rq", "saq")


@pytest.mark.parametrize("design", RUN)
def test_each_library_s_workers_resume_on_the_replica_sentinel_promotes(design: str, small: Scenario) -> None:
    """The primary SIGKILLed once every worker is up; the producer goes on past the promotion. The library's
    workers, told only the sentinels, take jobs from the promoted replica; nothing acknowledged to the new
    primary is lost, and of what the dead one held only what it alone held can be."""
    from crashbench.run.session import Options, run_designs

    pythons = tuple((lib, arq_python()) for lib in ("arq", "saq") if design.startswith(lib))
    # kombu retries the connection 2 s, then 4 s after it lost it: Celery's workers come back last (about 3.6 s).
    window = 6.0 if design.startswith("celery") else 2.0
    sc = small.replace(jobs=300, job_ms=10, workers=2, kills=0, fault="sentinel-kill", fault_at=1.5, produce_s=4.5,
                       drain_timeout=window)  # fmt: skip
    run = run_designs(sc, [design], Options(library_pythons=pythons)).runs[0]
    bf, tl, c = run.broker_fault, run.timeline, run.counts
    assert run.problems == [] and bf is not None and bf.back_at is not None
    assert tl is not None and any(ex.start > bf.back_at and ex.completed for ex in tl.executions)
    assert c.lost <= c.held_at_fault and c.unexpected == 0


def test_the_library_expectations_hold_on_the_committed_runs() -> None:
    """scenarios/sentinel-kill-libraries.toml's expectations, on its committed runs (make sentinel-libraries):
    every design it lists ran twice, each resumed on the promoted replica, and every rule holds."""
    from crashbench import scenario
    from crashbench.report import recount
    from tests.expectations import assert_each_can_fail, failing

    sc = scenario.load("sentinel-kill-libraries")
    runs = []
    for path in sorted((ROOT / "results" / "readme" / "sentinel-libraries").glob("*.json")):
        result, timelines = recount.load(str(path))
        runs += list(zip(result.runs, timelines, strict=True))
    assert sorted(run.design for run, _ in runs) == sorted(sc.run.designs * 2) and set(sc.run.designs) <= set(sc.expect)
    for run, tl in runs:
        bf = run.broker_fault
        assert bf is not None and bf.back_at is not None
        assert any(ex.start > bf.back_at and ex.completed for ex in tl.executions), run.design
    assert failing(sc, [run for run, _ in runs]) == []
    assert_each_can_fail(sc, [run for run, _ in runs])
