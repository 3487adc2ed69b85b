"""`crashbench clean` and the keys' safety expiry, on a server the tests start (real Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from crashbench import lease
from crashbench.cli import cli
from crashbench.errors import ExitCode


@pytest.fixture
def external(valkey_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The session's server, treated as one crashbench did not start (as with --redis-url)."""
    monkeypatch.setattr(lease, "PRIVATE", set())
    yield valkey_url
    for old in lease._leases.values():
        old.close()
    lease._leases.clear()


def test_clean_removes_a_dead_runs_keys_keeps_a_live_one_and_never_touches_others(
    client: redis.Redis, external: str
) -> None:
    foreign = {"app:queue": "1", "crashbench:config": "2", "crashbench:not-a-run:x": "3"}
    for key, value in foreign.items():
        client.set(key, value)
    dead = [f"crashbench:deadbeef:0-reliable:{n}" for n in ("pending", "processing", "dead")]
    live = [f"crashbench:0a1b2c3d:0-stream:{n}" for n in ("jobs", "delayed")]
    for key in dead + live:
        client.rpush(key, "x")
    lease.tick(external, "crashbench:0a1b2c3d:0-stream:", time.monotonic())  # what a living runner does
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
    assert runner.invoke(cli, ["clean"]).exit_code == ExitCode.USAGE


def test_the_lease_gives_a_runs_keys_an_expiry_and_leaves_a_designs_own_short_one(
    client: redis.Redis, external: str
) -> None:
    ns = "crashbench:c0ffee00:"
    keys = [f"{ns}0-reliable:k{i}" for i in range(1200)]  # more than one SCAN batch
    pipe = client.pipeline()
    for k in keys:
        pipe.set(k, "1")
    pipe.set(f"{ns}0-reliable:heartbeat", "1", ex=5)  # the design's own expiry
    pipe.execute()
    try:
        for step in range(50):  # one SCAN batch per tick: a pass takes several ticks
            lease.tick(external, ns + "0-reliable:", float(step))
        ttls = [client.ttl(k) for k in keys]
        assert min(ttls) > lease.KEY_TTL_S - 60 and max(ttls) <= lease.KEY_TTL_S
        assert client.ttl(f"{ns}0-reliable:heartbeat") <= 5
        assert 0 < client.ttl(lease.alive_key(ns)) <= lease.ALIVE_TTL_S
        # A run with --keep: its keys stay without an expiry; it is alive all the same.
        lease.tick(external, "crashbench:c0ffee01:0-naive:", 0.0, keep=True)
        client.set("crashbench:c0ffee01:0-naive:p", "1")
        lease.tick(external, "crashbench:c0ffee01:0-naive:", 100.0, keep=True)
        assert client.ttl("crashbench:c0ffee01:0-naive:p") == -1
        assert client.exists(lease.alive_key("crashbench:c0ffee01:"))
    finally:
        for pattern in (ns + "*", "crashbench:c0ffee01:*"):
            stale = list(client.scan_iter(match=pattern))
            if stale:
                client.delete(*stale)
