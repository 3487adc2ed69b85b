"""A run's Sentinel topology as its broker (crashbench.control.sentinel): the workers are told the
sentinels (the `redis+sentinel://` URL in the broker's url file), the harness the primary they name."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import redis

from crashbench.control import workdirs
from crashbench.control.sentinel import SentinelTopology, sentinel_topology


class SentinelBroker:
    """A run's topology as its broker: workers get the Sentinel URL (its file), the harness the primary's."""

    def __init__(self, topology: SentinelTopology, url_file: Path) -> None:
        self.topology = topology
        self.url_file = url_file
        self.sentinel_url = topology.url
        url_file.write_text(self.sentinel_url)
        self.primary = topology.primary_address()

    @property
    def url(self) -> str:
        """The primary the sentinels named when last asked (`promoted`), as a plain URL for the harness."""
        host, port = self.primary
        return f"redis://{host}:{port}/0"

    def promoted(self) -> bool:
        """Whether the sentinels name another primary than before; if so, it is the harness's from now on."""
        try:
            now = self.topology.primary_address()
        except redis.RedisError:
            return False
        changed, self.primary = now != self.primary, now
        return changed


@contextlib.contextmanager
def sentinel_broker(binary: str | None) -> Iterator[SentinelBroker]:
    """A private topology for one crash run, stopped and removed on exit."""
    home = workdirs.make("broker")
    try:
        with sentinel_topology(binary) as topology:
            yield SentinelBroker(topology, home / "server.url")
    finally:
        shutil.rmtree(home, ignore_errors=True)
