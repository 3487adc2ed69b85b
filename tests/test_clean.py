"""`crashbench clean` and the keys' safety expiry, on a server the tests start (real Redis)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner

from crashbench.cli import cli
from crashbench.control import lease
from crashbench.errors import ExitCode
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs


@pytest.fixture
def external(valkey_url: str) -> str:
    """The session's server, treated as one crashbench did not start (as with --redis-url)."""
    return valkey_url


@pytest.fixture
def lease_of(external: str) -> Iterator[Callable[..., lease.Lease]]:
    """The lease a runner on `external` would own for a key prefix (as CrashRun does); closed after."""
    made: list[lease.Lease] = []

    def make(prefix: str, keep: bool = False) -> lease.Lease:
        made.append(lease.Lease(external, lease.namespace(prefix), expire=not keep))
        return made[-1]

    yield make
    for held in made:
        held.close()


def test_clean_removes_a_dead_runs_keys_keeps_a_live_one_and_never_touches_others(
    client: redis.Redis, external: str, lease_of: Callable[..., lease.Lease]
) -> None:
    foreign = {"app:queue": "1", "crashbench:config": "2", "crashbench:not-a-run:x": "3"}
    for key, value in foreign.items():
        client.set(key, value)
    dead = [f"crashbench:deadbeef:0-reliable:{n}" for n in ("pending", "processing", "dead")]
    live = [f"crashbench:0a1b2c3d:0-stream:{n}" for n in ("jobs", "delayed")]
    for key in dead + live:
        client.rpush(key, "x")
    lease_of("crashbench:0a1b2c3d:0-stream:").tick(time.monotonic())  # what a living runner does
    try:
        runner = CliRunner()
        listed = runner.invoke(cli, ["clean", "--redis-url", external, "--grace", "0"])
        assert listed.exit_code == ExitCode.OK, listed.output
        assert "crashbench:deadbeef:" in listed.output and "would remove" in listed.output
        assert all(client.exists(k) for k in dead + live)  # without --yes nothing is removed

        removed = runner.invoke(cli, ["clean", "--redis-url", external, "--grace", "0", "--yes"])
        assert removed.exit_code == ExitCode.OK, removed.output
        assert "removed 1 whose run is gone (3 keys)" in removed.output
        assert not any(client.exists(k) for k in dead)
        assert all(client.exists(k) for k in live)
        assert {k: client.get(k) for k in foreign} == foreign
    finally:
        client.delete(*live, *foreign, lease.alive_key("crashbench:0a1b2c3d:"))


def test_clean_keeps_a_namespace_touched_within_the_grace_even_without_an_alive_key(
    client: redis.Redis, external: str
) -> None:
    # A run between its start (enqueueing) and the runner's first tick has no alive key yet.
    key = "crashbench:feedf00d:0-naive:pending"
    client.rpush(key, "x")
    try:
        result = CliRunner().invoke(cli, ["clean", "--redis-url", external, "--yes"])
        assert result.exit_code == ExitCode.OK, result.output
        assert client.exists(key)
    finally:
        client.delete(key)


def test_clean_without_a_server_exits_3_and_without_a_url_2() -> None:
    runner = CliRunner()
    unreachable = runner.invoke(cli, ["clean", "--redis-url", "redis://127.0.0.1:1/0"])
    assert unreachable.exit_code == ExitCode.SERVER_UNAVAILABLE
    no_url = {"CRASHBENCH_REDIS_URL": None, "REDIS_URL": None}
    assert runner.invoke(cli, ["clean"], env=no_url).exit_code == ExitCode.USAGE


def test_clean_reads_the_url_from_the_environment_so_no_password_is_on_its_command_line(
    external: str, client: redis.Redis
) -> None:
    """As run does: CRASHBENCH_REDIS_URL, else REDIS_URL. Here a dead run's keys, found through it."""
    client.set("crashbench:deadbeef:0-naive:pending", "x")
    runner = CliRunner()
    for name in ("CRASHBENCH_REDIS_URL", "REDIS_URL"):
        env = {"CRASHBENCH_REDIS_URL": None, "REDIS_URL": None, name: external}
        got = runner.invoke(cli, ["clean", "--grace", "0"], env=env)
        assert got.exit_code == 0 and "crashbench:deadbeef:" in got.output, got.output
    got = runner.invoke(cli, ["clean", "--grace", "0", "--yes"], env={"CRASHBENCH_REDIS_URL": external})
    assert got.exit_code == 0 and client.exists("crashbench:deadbeef:0-naive:pending") == 0, got.output


@pytest.mark.parametrize("url", ["redis://:sekr3tpass@127.0.0.1:notaport/0", "redis://u:sekr3tpass@[::1/0"])
def test_a_url_the_parser_rejects_is_named_without_its_password(url: str) -> None:
    got = CliRunner().invoke(cli, ["clean"], env={"CRASHBENCH_REDIS_URL": url, "COLUMNS": "40"})
    assert got.exit_code == ExitCode.SERVER_UNAVAILABLE and "bad --redis-url" in got.output
    assert "sekr3tpass" not in got.output and len(got.output.strip().splitlines()) == 1, got.output


@pytest.mark.parametrize("command", [["clean"], ["run", "-d", "naive", "--jobs", "5"]])
def test_a_database_that_is_not_a_number_is_refused_not_taken_for_0(command: list[str]) -> None:
    got = CliRunner().invoke(cli, command, env={"CRASHBENCH_REDIS_URL": "redis://127.0.0.1:1/abc"})
    assert got.exit_code == ExitCode.SERVER_UNAVAILABLE and "the database must be a whole number" in got.output


def test_the_lease_gives_a_runs_keys_an_expiry_and_leaves_a_designs_own_short_one(
    client: redis.Redis, lease_of: Callable[..., lease.Lease]
) -> None:
    ns = "crashbench:c0ffee00:"
    keys = [f"{ns}0-reliable:k{i}" for i in range(1200)]  # more than one SCAN batch
    pipe = client.pipeline()
    for k in keys:
        pipe.set(k, "1")
    pipe.set(f"{ns}0-reliable:heartbeat", "1", ex=5)  # the design's own expiry
    pipe.execute()
    try:
        running = lease_of(ns + "0-reliable:")
        for step in range(50):  # one SCAN batch per tick: a pass takes several ticks
            running.tick(float(step))
        ttls = [client.ttl(k) for k in keys]
        assert min(ttls) > lease.KEY_TTL_S - 60 and max(ttls) <= lease.KEY_TTL_S
        assert client.ttl(f"{ns}0-reliable:heartbeat") <= 5
        assert 0 < client.ttl(lease.alive_key(ns)) <= lease.ALIVE_TTL_S
        # A run with --keep: its keys stay without an expiry; it is alive all the same.
        kept = lease_of("crashbench:c0ffee01:0-naive:", keep=True)
        kept.tick(0.0)
        client.set("crashbench:c0ffee01:0-naive:p", "1")
        kept.tick(100.0)
        assert client.ttl("crashbench:c0ffee01:0-naive:p") == -1
        assert client.exists(lease.alive_key("crashbench:c0ffee01:"))
    finally:
        for pattern in (ns + "*", "crashbench:c0ffee01:*"):
            stale = list(client.scan_iter(match=pattern))
            if stale:
                client.delete(*stale)


def test_a_run_on_a_server_crashbench_did_not_start_holds_a_lease(client: redis.Redis, external: str) -> None:
    """The session gives a run on --redis-url its lease: with --keep its keys stay, the alive key too."""
    sc = Scenario.of(name="lease", jobs=50, job_ms=1, workers=1, kills=0, drain_timeout=5)
    run = run_designs(sc, ["naive"], Options(redis_url=external, keep=True)).runs[0]
    ns = lease.namespace(run.prefix)
    try:
        assert 0 < client.ttl(lease.alive_key(ns)) <= lease.ALIVE_TTL_S
    finally:
        for key in client.scan_iter(match=ns + "*"):
            client.delete(key)
        if run.workdir:
            shutil.rmtree(run.workdir)
