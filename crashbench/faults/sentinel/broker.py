"""A run's Sentinel topology as its broker (crashbench.control.sentinel): the workers are told the
sentinels (the `redis+sentinel://` URL in the broker's url file), the harness the primary they name.

In a split-brain run (sentinel-partition) the first `minority` worker slots are the primary's side of the
partition: their address file (`url_file_of`) names the primary's own port until the partition heals,
when it names the sentinels like everyone else's (crashbench.faults.sentinel.partition)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import redis

from crashbench.control import workdirs
from crashbench.control.sentinel import SentinelTopology, sentinel_topology

MINORITY_NAME = "crashbench-minority"  # the client name of the minority's workers


class SentinelBroker:
    """A run's topology as its broker: workers get the Sentinel URL (its file), the harness the primary's."""

    def __init__(self, topology: SentinelTopology, url_file: Path, minority: int = 0) -> None:
        self.topology = topology
        self.url_file = url_file
        self.sentinel_url = topology.url
        url_file.write_text(self.sentinel_url)
        self.primary = topology.primary_address()
        self.minority = minority  # worker slots on the primary's side of a partition (0, 1, ...)
        self.minority_file = url_file.with_name("minority.url")
        # Named, so that the harness tells their connections from others' on the old primary (CLIENT LIST).
        self.minority_file.write_text(f"{topology.primary.url}?client_name={MINORITY_NAME}")

    @property
    def url(self) -> str:
        """The primary the sentinels named when last asked (`promoted`), as a plain URL for the harness
        (its own port, not the proxy's in front of it: the harness stands outside any partition)."""
        host, port = self.topology.direct(self.primary)
        return f"redis://{host}:{port}/0"

    def url_file_of(self, slot: int) -> str | None:
        """The address file of a worker slot of the minority; None: the url file, everyone's."""
        return str(self.minority_file) if slot < self.minority else None

    def join_majority(self) -> None:
        """The minority's workers follow the sentinels from their next connection on."""
        self.minority_file.write_text(self.sentinel_url)

    def promoted(self) -> bool:
        """Whether the sentinels name another primary than before; if so, it is the harness's from now on."""
        try:
            now = self.topology.primary_address()
        except redis.RedisError:
            return False
        changed, self.primary = now != self.primary, now
        return changed


@contextlib.contextmanager
def sentinel_broker(
    binary: str | None, partitionable: bool = False, min_replicas: tuple[int, int] = (0, 10), minority: int = 0
) -> Iterator[SentinelBroker]:
    """A private topology for one crash run, stopped and removed on exit."""
    home = workdirs.make("broker")
    try:
        with sentinel_topology(binary, partitionable, min_replicas) as topology:
            yield SentinelBroker(topology, home / "server.url", minority)
    finally:
        shutil.rmtree(home, ignore_errors=True)
