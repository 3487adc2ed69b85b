"""The run's server on a lazy file system (crashbench.control.lazyfs): its kill is a power cut, and the
cut leaves evidence the server does not control.

At the cut, before the server starts again, the broker keeps:
- the AOF as it was before the cut and as the cut left it (crashbench.evidence.aof.Aof): the harness
  reads, by id, which commands reached the disk;
- the file system's own account of the cut (each file's length before and after, its last fsync's time);
- the harness's reading of the durable state: a scratch server (same binary, its own port) started on a
  copy of what the cut left, read with the design's reading and the run's token (`reader`), then
  stopped. What it holds is what the restarted server will start from, read before any worker
  touches it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from crashbench.control import workdirs
from crashbench.control.lazyfs import CONTROL, LazyFS
from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.evidence.aof import Aof
from crashbench.evidence.search import Needle
from crashbench.faults.broker import Broker


class PowerBroker(Broker):
    """One embedded server whose data directory is a lazy file system's mount: `kill` SIGKILLs it, cuts
    the power (every file back to what was fsynced) and reads what is left; `restart` starts it on that."""

    def __init__(
        self, primary: EmbeddedServer, disk: LazyFS, url_file: Path, tear: bool = False, writeback: float | None = None
    ) -> None:
        super().__init__(primary, None, url_file)
        self.disk, self.tear, self.writeback = disk, tear, writeback
        self.cut: dict[str, dict[str, Any]] = {}  # the file system's account of the cut, per file
        self.cut_at: float | None = None  # CLOCK_MONOTONIC: the server dead, the cut about to be made
        self.aof_before = self.aof_after = Aof()
        self.reader: Callable[[redis.Redis], set[str]] | None = None  # the design's reading of held ids
        self.held_after_cut: set[str] | None = None  # the durable state's jobs (None: not read)
        self.needle: Needle | None = None  # the run's token, which the AOF's commands are searched for

    def kill(self) -> None:
        self.primary.kill()
        self.cut_at = time.monotonic()
        self.aof_before = Aof.read(self.disk.backing)
        self.cut = self.disk.power_cut(self.tear)
        self.aof_after = Aof.read(self.disk.backing)
        if self.reader is not None:
            self.held_after_cut = self._read_durable(self.reader)

    @property
    def shortened(self) -> dict[str, tuple[int, int]]:
        """The files the cut shortened: their length before and after."""
        return {name: (c["before"], c["after"]) for name, c in self.cut.items() if c["after"] < c["before"]}

    def aof_synced_at(self) -> tuple[float, float] | None:
        """The last fsync before the cut of the AOF's last incremental file (the one being appended to), or
        with no AOF, of the RDB snapshot (its temporary file's, renamed into place)."""
        names = [n for n in self.aof_after.files if n.endswith(".incr.aof") or n == "appendonly.aof"] or ["dump.rdb"]
        for path, c in self.cut.items():
            if path.rsplit("/", 1)[-1] == names[-1] and c["synced_at"] is not None:
                return float(c["synced_at"][0]), float(c["synced_at"][1])
        return None

    def _read_durable(self, reader: Callable[[redis.Redis], set[str]]) -> set[str]:
        """The jobs a server started on a copy of what the cut left holds, by the harness's reading."""
        scratch = EmbeddedServer(self.primary.binary, self.primary.persistence)
        try:
            shutil.copytree(self.disk.backing, scratch.dir, dirs_exist_ok=True, ignore=_not_data)
            scratch.start()
            client = redis.Redis.from_url(scratch.url, socket_timeout=30)
            try:
                return reader(client)
            finally:
                client.close()
        finally:
            scratch.stop()

    @property
    def data(self) -> Path:
        """The server's files as the cut left them (the backing directory, read past the mount)."""
        return self.disk.backing


def _not_data(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("server.log", CONTROL)]


@contextlib.contextmanager
def power_servers(
    persistence: str, binary: str | None, tear: bool = False, writeback: float | None = None
) -> Iterator[PowerBroker]:
    """A private server with the scenario's persistence on a fresh lazy file system, for one crash run;
    the server stopped, the file system unmounted and everything removed on exit (an error included).
    `writeback`: the kernel's writeback, unsynced bytes durable that many seconds after their write (LazyFS;
    None: only an fsync makes bytes durable, and the cut takes all a server that never fsyncs wrote)."""
    path = find_server_binary(binary)
    home = workdirs.make("broker")
    backing = home / "disk"
    backing.mkdir()
    primary = EmbeddedServer(path, persistence)
    disk = LazyFS(backing, primary.dir, writeback)
    try:
        disk.start()
        primary.start()
        yield PowerBroker(primary, disk, home / "server.url", tear, writeback)
    finally:
        primary.stop_process()
        disk.stop()
        primary.stop()
        shutil.rmtree(home, ignore_errors=True)
