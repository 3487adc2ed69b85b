"""The run's server on a lazy file system (crashbench.control.lazyfs): its kill is a power cut."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from crashbench.control import workdirs
from crashbench.control.lazyfs import LazyFS
from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.faults.broker import Broker


class PowerBroker(Broker):
    """One embedded server whose data directory is a lazy file system's mount: `kill` SIGKILLs it and
    then cuts the power (every file back to what was fsynced); `restart` starts it on what is left."""

    def __init__(self, primary: EmbeddedServer, disk: LazyFS, url_file: Path, tear: bool = False) -> None:
        super().__init__(primary, None, url_file)
        self.disk, self.tear = disk, tear
        self.cut: dict[str, tuple[int, int]] = {}  # file -> (length before, after): what the cut took

    def kill(self) -> None:
        self.primary.kill()
        sizes = _sizes(self.disk.backing)
        self.disk.power_cut(self.tear)
        after = _sizes(self.disk.backing)
        self.cut = {name: (n, after.get(name, 0)) for name, n in sizes.items() if after.get(name, 0) < n}

    @property
    def data(self) -> Path:
        """The server's files as the cut left them (the backing directory, read past the mount)."""
        return self.disk.backing


def _sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


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
        yield PowerBroker(primary, disk, home / "server.url", tear)
    finally:
        primary.stop_process()
        disk.stop()
        primary.stop()
        shutil.rmtree(home, ignore_errors=True)
