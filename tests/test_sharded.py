"""The sharded design: exact counts under mid-job SIGKILLs on one server and on a 3-primary cluster, its
shards' slots and primaries, the home shard and stealing, and its namespace found (lease, clean) and
removed on every primary."""

from __future__ import annotations

import json
import shutil
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis.crc import key_slot

from crashbench.bench import BenchSettings, run_bench
from crashbench.cli import cli
from crashbench.control import connect, lease
from crashbench.control.cluster import EmbeddedCluster
from crashbench.control.server import cleanup_keys
from crashbench.designs.sharded import ShardedQueue
from crashbench.evidence import inspector
from crashbench.model.queue import DesignSettings, Job
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from crashbench.scenario import with_overrides
from tests.conftest import started_cluster
from tests.test_cluster import crashbench_keys, few_jobs


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    yield from started_cluster(3, 0)


@pytest.fixture
def few() -> Scenario:
    """Three mid-job SIGKILLs among 1,200 jobs (1.5 s of work: some left for the third kill however
    late a loaded machine runs it); 3 shards even where the default would be 1."""
    return with_overrides(few_jobs(shards=3), jobs=1200)


def _exact(result_runs: list, poison: int = 0) -> None:
    (run,) = result_runs
    c = run.counts
    assert run.problems == []
    assert (c.enqueued, c.done, c.lost, c.stranded, c.unexpected) == (1200, 1200 - poison, 0, 0, 0)
    assert (c.poison_jobs, c.dead_lettered, c.dead_lettered_poison) == (poison, poison, poison)
    # Every kill lands inside a handler, and its shard's reaper gives that one job back exactly once.
    assert (c.kills, c.kills_mid_job, c.requeue_events, c.duplicated) == (3, 3, 3, 0)


def _slot(client: object, key: str) -> int:
    return int(client.cluster("keyslot", key))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_sharded_survives_mid_job_sigkills_on_one_server(valkey_url: str, few: Scenario) -> None:
    # Poison jobs too: their retries wait in each shard's delayed set, then go to its dead letters.
    client = connect.connect(valkey_url)
    before = set(client.scan_iter(match="crashbench:*"))  # a shared server: other tests' keys are theirs
    result = run_designs(with_overrides(few, poison_rate=0.02), ["sharded"], Options(redis_url=valkey_url))
    _exact(result.runs, poison=12)
    assert set(client.scan_iter(match="crashbench:*")) - before == set()  # shards' keys too: the session removed them
    client.close()


@pytest.mark.slow
def test_sharded_on_a_cluster_spreads_over_primaries_with_exact_counts_and_clean_finds_it(
    cluster: EmbeddedCluster, few: Scenario
) -> None:
    url = cluster.url
    result = run_designs(with_overrides(few, shards=0), ["sharded"], Options(redis_url=url, keep=True))
    try:
        _exact(result.runs)
        run_id = result.id.rsplit("-", 1)[1]
        ns = f"crashbench:{{{run_id}}}:"
        keys = crashbench_keys(url)
        by_node = {}
        for node in connect.primaries(url, decode_responses=True):
            port = node.connection_pool.connection_kwargs["port"]
            by_node[port] = set(node.scan_iter(match="crashbench:*"))
            for key in by_node[port]:
                assert node.exists(key)  # a plain client of the node: no MOVED, it is that node's key
            node.close()
        assert all(by_node.values())  # the default, one shard per primary: keys on each of the 3
        probe = connect.node_for(url, ns, decode_responses=True)
        tags = {k.partition("}")[0] + "}" for k in keys}
        assert tags == {f"crashbench:{{{run_id}}}"} | {f"crashbench:{{{run_id}.{k}-{n}}}" for k, n in _tags(tags, 3)}
        for tag in tags:  # each shard's keys in one slot, the shards in three
            assert len({_slot(probe, k) for k in keys if k.startswith(tag)}) == 1
        assert len({_slot(probe, k) for k in keys if "." in k.partition("}")[0]}) == 3
        # A lease of the run's namespace gives every shard key on every primary its safety expiry (spread).
        held = lease.Lease(url, ns, expire=True, spread=True)
        for _ in range(10):
            held.tick(0.0)
        held.close()
        for node in connect.primaries(url, decode_responses=True):
            for key in node.scan_iter(match="crashbench:*"):
                assert 0 < node.ttl(key) <= max(lease.KEY_TTL_S, lease.ALIVE_TTL_S), key
            node.close()
        # clean: one namespace whose keys are on three primaries, alive by its lease key on one of them.
        listed = CliRunner().invoke(cli, ["clean", "--redis-url", url])
        assert listed.exit_code == 0 and listed.output.count("crashbench:{") == 1, listed.output
        assert "1 namespaces; 0 whose run is gone" in listed.output and "alive" in listed.output, listed.output
        row = next(line for line in listed.output.splitlines() if ns in line)
        assert str(len(keys) - 1) in row.split(), row  # every key but the alive key, shards' included
        probe.delete(ns + "alive")  # the run is gone now
        removed = CliRunner().invoke(cli, ["clean", "--redis-url", url, "--yes", "--grace", "0"])
        assert f"removed 1 whose run is gone ({len(keys) - 1} keys)" in removed.output, removed.output
        assert crashbench_keys(url) == []
        probe.close()
    finally:
        for run in result.runs:
            if run.workdir:
                shutil.rmtree(run.workdir, ignore_errors=True)
        cleanup_keys(url, "crashbench:")


def _tags(tags: set[str], count: int) -> list[tuple[int, int]]:
    """(shard, n) of the shard tags among `tags`, which must be shards 0..count-1."""
    found = sorted(
        (int(k), int(n)) for t in tags if "." in t for k, _, n in [t.rstrip("}").rpartition(".")[2].partition("-")]
    )
    assert [k for k, _ in found] == list(range(count))
    return found


def test_a_cluster_session_removes_a_sharded_namespace_from_every_primary(
    cluster: EmbeddedCluster, few: Scenario
) -> None:
    result = run_designs(with_overrides(few, kills=1, jobs=100), ["sharded"], Options(redis_url=cluster.url))
    assert [(r.counts.lost, r.counts.done, r.problems) for r in result.runs] == [(0, 100, [])]
    assert crashbench_keys(cluster.url) == []


@pytest.mark.slow
@pytest.mark.parametrize("count", [3, 6])
def test_shards_go_round_the_primaries_each_in_a_slot_of_its_own(cluster: EmbeddedCluster, count: int) -> None:
    prefix = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:0-sharded:"
    design = ShardedQueue(connect.connect(cluster.url, decode_responses=True), prefix, DesignSettings(shards=count))
    design.setup()
    try:
        owners = [design.r.get_node_from_key(s.prefix).name for s in design.shards()]
        assert owners == [sorted(n.name for n in design.r.get_primaries())[k % 3] for k in range(count)]
        assert len(set(owners)) == 3 and len({key_slot(s.prefix.encode()) for s in design.shards()}) == count
        # The harness's reading (connect.reader) finds every shard's jobs, on whichever primary.
        design.enqueue([Job(str(i), "{}") for i in range(30)])
        raw = connect.reader(cluster.url, prefix, ShardedQueue.spread, decode_responses=False)
        located = design.locate(inspector.take(raw, design.key_patterns()))
        raw.close()
        assert sorted(located.held, key=int) == [str(i) for i in range(30)]
        assert {where for places in located.held.values() for where in places} == {"pending"}
    finally:
        design.r.close()
        cleanup_keys(cluster.url, prefix)


def test_a_worker_takes_from_its_home_shard_first_then_steals(valkey_url: str) -> None:
    prefix = f"crashbench:{{{uuid.uuid4().hex[:8]}}}:0-sharded:"
    client = connect.connect(valkey_url, decode_responses=True)
    worker = ShardedQueue(client, prefix, DesignSettings(shards=3))
    with pytest.raises(RuntimeError, match="setup\\(\\) has not run"):
        worker.enqueue([Job("1")])
    harness = ShardedQueue(client, prefix, DesignSettings(shards=3))
    harness.setup()
    harness.enqueue([Job(str(i), "{}") for i in range(30)])
    shard_of = {str(i): zlib.crc32(str(i).encode()) % 3 for i in range(30)}
    home = [j for j, k in shard_of.items() if k == 1]
    worker.start_worker("w4", 0.0)  # 4 mod 3: home is shard 1
    got = []
    while (job := worker.fetch("w4", 0.01, 0.0)) is not None:
        got.append(job)
        assert worker.ack("w4", job, 0.0) is True
    assert [j.id for j in got[: len(home)]] == home and len(got) == 30  # home first, oldest first
    order = [1] * len(home) + [2] * list(shard_of.values()).count(2) + [0] * list(shard_of.values()).count(0)
    assert [j.receipt[0] for j in got] == order  # then the next shards in turn, each until it is empty
    assert harness.backlog() == 0 and harness.state().held == {}
    cleanup_keys(valkey_url, prefix)
    client.close()


@pytest.mark.slow
def test_bench_measures_the_sharded_design_on_a_cluster_with_every_primary_counted(cluster: EmbeddedCluster) -> None:
    # reliable too: its scripts need every key of a measurement in one slot (the bench prefix's hash tag).
    settings = BenchSettings(("sharded", "reliable"), (2,), 300, repeat=1, latency_jobs=30, restarts=1, memory_jobs=500)
    result = run_bench(settings, redis_url=cluster.url)
    m, other = result.measurements
    assert other.design == "reliable" and other.jobs_per_s > 0 and other.commands["lrem"] == 300
    assert m.jobs == 300 and m.jobs_per_s > 0 and m.bare_jobs_per_s > 0 and m.latency["all"].n == 30
    # Each job is moved once (LMOVE, or BLMOVE once a worker waits) and acked once, on three primaries:
    # INFO of one primary alone would count about a third of them.
    assert m.commands.get("lmove", 0) + m.commands.get("blmove", 0) >= 300 and m.commands["lrem"] == 300
    assert m.server_cpu is None and [x.structure for x in result.memory] == ["list", "stream"]
    assert crashbench_keys(cluster.url) == []


def test_queue_shards_at_its_default_leaves_the_fingerprint_as_before_the_setting() -> None:
    # Scenario().fingerprint() before queue.shards existed (commit 7dc185b): stored results stay comparable.
    assert Scenario().fingerprint() == "8557c0e9c341"
    assert Scenario.of(shards=3).fingerprint() != "8557c0e9c341"


def test_the_readme_sharded_table_is_what_its_result_files_give() -> None:
    root = Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "findings" / "benchmarks.md").read_text()
    section = readme.split("\n## The sharded design on a cluster\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| reliable") or line.startswith("| sharded")]
    figures = []
    for path in sorted((root / "results" / "readme" / "sharded").glob("*.json")):
        data = json.loads(path.read_text())
        for point in data["points"]:
            j = point["jobs_per_s"]
            figures.append(f"{round(j['median']):,} ({round(j['min']):,}–{round(j['max']):,})")
            assert j["n"] == 3 and data["settings"]["workers"] == [8] and data["settings"]["jobs"] == 20000
    assert len(rows) == len(figures) == 5
    assert sorted(f for f in figures if any(f in row for row in rows)) == sorted(figures)
