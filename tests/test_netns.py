"""Network partitions with namespaces and iptables (crashbench.faults.netns): a real server, real namespaces
and rules, real forked workers. Skipped, with the reason, where this machine cannot make them (not root,
no iptables, an unprivileged container); the last test needs none of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.faults import netns

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow

TEXT: dict = {"capture_output": True, "text": True, "check": True, "timeout": 10}
Say = Callable[..., None]
Body = Callable[[Say, Callable[[], None]], None]


class Child:
    """A forked process that moves into a slot's namespace and runs `body(say, wait)`: `say(**fields)`
    sends the test one JSON line, `wait()` blocks until the test calls `go()`."""

    def __init__(self, parts: netns.Partitions, slot: int, body: Body) -> None:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: reports whatever happens, and never returns into pytest

            def say(**fields: object) -> None:
                os.write(up_w, (json.dumps(fields) + "\n").encode())

            try:
                os.close(up_r)
                os.close(down_w)
                parts.enter(slot)
                body(say, lambda: os.read(down_r, 1) and None)  # wait: until the test's go()
            except BaseException as exc:
                say(error=type(exc).__name__, message=str(exc))
            finally:
                os._exit(0)
        os.close(up_w)
        os.close(down_r)
        self.up, self.down, self.buffer = up_r, down_w, b""

    def read(self, timeout: float) -> dict | None:
        """The child's next line, or None if it said nothing within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            os.set_blocking(self.up, False)
            try:
                chunk = os.read(self.up, 4096)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.01)
                continue
            if not chunk:
                return None  # it exited
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def go(self) -> None:
        os.write(self.down, b"g")

    def alive(self) -> bool:
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass  # reaped already
        for fd in (self.up, self.down):
            os.close(fd)


def available() -> None:
    if (reason := netns.unavailable()) is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    available()
    s = EmbeddedServer(find_server_binary())
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def shared(server: EmbeddedServer) -> Iterator[netns.Partitions]:
    """Two slots, the server listening on their host addresses, for the whole module."""
    parts = netns.Partitions.create(2)
    try:
        before = netns.bind_server(server.url, parts.host_addresses)
        try:
            yield parts
        finally:
            netns.restore_server(server.url, before)
    finally:
        parts.close()


@pytest.fixture
def parts(shared: netns.Partitions) -> Iterator[netns.Partitions]:
    """The shared slots, every rule healed after the test, whatever it did."""
    yield shared
    for slot in range(shared.slots):
        shared.heal(slot)


@pytest.fixture
def fork(parts: netns.Partitions) -> Iterator[Callable[[int, Body], Child]]:
    """Start children in a slot; each is killed and reaped after the test."""
    children: list[Child] = []

    def start(slot: int, body: Body) -> Child:
        children.append(Child(parts, slot, body))
        return children[-1]

    yield start
    for child in children:
        child.kill()


@pytest.fixture
def harness(server: EmbeddedServer) -> Iterator[redis.Redis]:
    """The test's own connection, over loopback: no rule touches it."""
    client = redis.Redis(port=server.port, decode_responses=True)
    client.delete("netns:q", "netns:idle")
    yield client
    client.close()


def client(parts: netns.Partitions, server: EmbeddedServer, slot: int, timeout: float | None) -> redis.Redis:
    """A worker's connection from its namespace, `timeout` for connecting too (redis-py 8's own connect
    timeout is 5 s whatever the socket timeout), no retry, so that the test sees the first error."""
    return redis.Redis(
        host=parts.host_address(slot),
        port=server.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def test_a_worker_in_a_slot_reaches_the_server_at_its_host_address_only(parts, server, fork) -> None:
    def body(say: Say, wait: Callable[[], None]) -> None:
        c = client(parts, server, 0, 2)
        say(pong=c.ping(), peer=c.client_info()["addr"].rsplit(":", 1)[0])
        try:  # the server's loopback is the host's, not this namespace's
            redis.Redis(port=server.port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)).ping()
            say(loopback="reached")
        except redis.ConnectionError:
            say(loopback="refused")

    child = fork(0, body)
    assert child.read(5) == {"pong": True, "peer": parts.worker_address(0)}
    assert child.read(5) == {"loopback": "refused"}


def test_drop_is_a_silent_partition_of_one_slot(parts, server, fork, harness) -> None:
    def blocked(say: Say, wait: Callable[[], None]) -> None:
        c = client(parts, server, 0, None)  # no socket timeout, as redis-py before 6 shipped
        c.ping()
        say(ready=True)
        say(popped=c.blpop(["netns:q"], 0)[1].decode(), at=time.monotonic())

    def polling(say: Say, wait: Callable[[], None]) -> None:
        c = client(parts, server, 0, 0.5)  # crashbench's workers: a short pop inside a socket timeout
        c.ping()
        say(ready=True)
        while True:
            try:
                c.blpop(["netns:idle"], 0.1)
            except redis.RedisError as exc:
                return say(error=type(exc).__name__, at=time.monotonic())

    a, b = fork(0, blocked), fork(0, polling)
    assert a.read(5) == b.read(5) == {"ready": True}
    dropped = time.monotonic()
    parts.apply(0, "drop")
    harness.rpush("netns:q", "job-1")
    said = b.read(5)
    assert said is not None and said["error"] == "TimeoutError" and said["at"] - dropped < 2, said
    # The blocked pop got its job, whose reply the partition swallowed: gone from the server, never seen.
    assert a.read(1.5) is None and a.alive()
    assert harness.llen("netns:q") == 0
    # The other slot, new connection and all, is not partitioned.
    other = fork(1, lambda say, wait: say(pong=client(parts, server, 1, 2).ping()))
    assert other.read(5) == {"pong": True}
    # Healed, the server's TCP retransmits the reply it never had acknowledged: the job was late, not lost.
    parts.heal(0)
    healed = time.monotonic()
    said = a.read(12)
    assert said is not None and said["popped"] == "job-1" and said["at"] > healed, said


def test_reject_resets_open_and_new_connections_at_once(parts, server, fork) -> None:
    def body(say: Say, wait: Callable[[], None]) -> None:
        c = client(parts, server, 0, 5)
        c.ping()
        say(ready=True)
        wait()
        for which, call in (("open", c.ping), ("new", lambda: client(parts, server, 0, 5).ping())):
            start = time.monotonic()
            try:
                call()
                say(which=which, error=None)
            except redis.RedisError as exc:
                say(which=which, error=type(exc).__name__, message=str(exc), seconds=time.monotonic() - start)

    child = fork(0, body)
    assert child.read(5) == {"ready": True}
    parts.apply(0, "reject")
    child.go()
    # ECONNRESET on the open connection (or, once redis-py has re-dialled it after the reset, the
    # refusal of that new connection: seen under load), then ECONNREFUSED; both at once.
    for which, errnos in (("open", ("104", "111")), ("new", ("111",))):
        said = child.read(5)
        assert said is not None and said["which"] == which and said["error"] == "ConnectionError", said
        assert any(e in said["message"] for e in errnos) and said["seconds"] < 1, said


def test_a_healed_slot_connects_again(parts, server, fork) -> None:
    ping = lambda say, wait: say(pong=client(parts, server, 0, 1).ping())  # noqa: E731
    for rule in ("drop", "reject"):
        parts.apply(0, rule)
        assert fork(0, ping).read(5)["error"] in ("TimeoutError", "ConnectionError")
        parts.heal(0)
        assert fork(0, ping).read(5) == {"pong": True}


def test_loss_puts_a_random_drop_on_both_sides_and_checks_its_probability(parts) -> None:
    parts.apply(1, "loss", 0.25)
    inside = subprocess.run(["ip", "netns", "exec", parts.namespace(1), "iptables", "-S", "INPUT"], **TEXT)
    host = subprocess.run(["iptables", "-S", parts.chain], **TEXT)
    for listing in (inside.stdout, host.stdout):
        assert "-m statistic --mode random --probability 0.25" in listing
    for rule, p in (("loss", 0.0), ("loss", 1.5), ("drop", 0.5), ("cut", 0.0)):
        with pytest.raises(netns.NetnsError):
            parts.apply(1, rule, p)
    parts.heal(1)
    assert "statistic" not in subprocess.run(["iptables", "-S", parts.chain], **TEXT).stdout


def leftovers(tag: str, prefix: str = netns.PREFIX) -> list[str]:
    """Lines of `ip netns list`, `ip link` and `iptables -S` that name the tag's namespaces, veths or chain."""
    listed = [subprocess.run(args, **TEXT).stdout for args in (["ip", "netns", "list"], ["ip", "-o", "link"])]
    listed.append(subprocess.run(["iptables", "-S"], **TEXT).stdout)
    name = f"{prefix}{tag}"
    return [line for text in listed for line in text.splitlines() if f"{name}-" in line or line.endswith(name)]


def test_close_leaves_nothing_behind_and_closes_once(server) -> None:
    parts = netns.Partitions.create(3)
    try:
        parts.apply(2, "drop")
        parts.apply(1, "reject")
        made = leftovers(parts.tag)
        assert len(made) > 6  # 3 namespaces, 3 veths, the chain, its jump and rules
        with pytest.raises(netns.NetnsError, match="exist already"):  # and a clash takes none of them
            netns.Partitions.create(1, parts.tag)
        assert leftovers(parts.tag) == made
    finally:
        parts.close()
    assert leftovers(parts.tag) == []
    parts.close()  # again: nothing to do, no error
    with pytest.raises(netns.NetnsError, match="closed"):
        parts.apply(0, "drop")


# The names a killed run leaves here start with this, not netns.PREFIX: every run the other test processes
# start sweeps netns.PREFIX's dead runs first, and one of them took this test's before its own sweep could.
DEAD = "cx-"


def left_by_a_killed_run(slots: int, drop: bool = False) -> str:
    """The tag of partitions a forked process made (slot 0 dropped, with `drop`) before it was SIGKILLed,
    under the prefix DEAD."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            netns.PREFIX = DEAD
            parts = netns.Partitions.create(slots)
            if drop:
                parts.apply(0, "drop")
            os.write(w, parts.tag.encode())
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(w)
    try:
        return os.read(r, 100).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_sweep_removes_what_a_sigkilled_run_left(server) -> None:
    """A process makes partitions and is SIGKILLed: its namespaces, veths and rules stay, until a sweep
    (which Partitions.create does first) finds their owner dead."""
    tag = left_by_a_killed_run(2, drop=True)
    assert tag and leftovers(tag, DEAD)
    assert tag in netns.sweep(DEAD)
    assert leftovers(tag, DEAD) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces are Linux's")
def test_unavailable_says_why_without_root(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = netns.unavailable()
    assert reason is not None and "root" in reason


def test_a_sweep_holds_the_lock_runs_take_their_network_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps at once (parallel runs, each creating its partitions) both removed the same dead run's
    names, and the later one failed on what the first had removed: a sweep runs under the lock."""
    import fcntl

    tag = left_by_a_killed_run(1)
    held = []
    real = netns._remove

    def remove(t: str, prefix: str) -> list[str]:
        with open(netns.LOCK_PATH, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return real(t, prefix)

    monkeypatch.setattr(netns, "_remove", remove)
    assert tag in netns.sweep(DEAD)
    assert held and all(held) and leftovers(tag, DEAD) == []
