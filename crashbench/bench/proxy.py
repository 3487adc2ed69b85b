"""`crashbench bench --proxy`: what the network fault proxy (crashbench.control.proxy) costs with no toxic
on. The reliable design's jobs/s with its workers connected to the server directly and through the
proxy, one slot each, as a run with network faults connects them: with 0 ms jobs, where the queue's
round trips are all there is (the worst case), and with 10 ms jobs. Each figure is bench's throughput
phase alone (N queued jobs, the workers let go at once, go -> last completion); direct and through
alternate, so that neither always gets the warmer server; the ratio is of the medians. Each
measurement through the proxy has a proxy of its own, as each crash run has."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import statistics
from collections.abc import Callable, Iterator, Sequence

from crashbench.control import workdirs
from crashbench.control.proxyctl import ProxyProcess, proxy_for
from crashbench.control.server import ServerInfo
from crashbench.model.bench import BenchSettings, ProxyCost, stats

DESIGN = "reliable"
WORKERS = 4  # a crash run's default
JOB_MS = (0.0, 10.0)

# crashbench.bench.jobs_per_s, passed in: that module runs this one, so this one does not import it.
JobsPerS = Callable[[ServerInfo, str, BenchSettings, str, Sequence[str]], float]


@contextlib.contextmanager
def started(server: ServerInfo) -> Iterator[ProxyProcess]:
    """A proxy in front of `server`, one slot per worker (a server it cannot front: UsageError)."""
    directory = workdirs.make("proxy")
    px = proxy_for(server.url, WORKERS, directory / "proxy.log")  # if it fails, its log stays for the error
    try:
        yield px
    finally:
        px.close()
        shutil.rmtree(directory, ignore_errors=True)


def jobs_at(job_ms: float, settings: BenchSettings) -> int:
    """--jobs, or a tenth as many of 10 ms jobs: 4 workers run ~360 of those a second here against ~7,000
    no-op ones, so even then a 10 ms phase is the longer one."""
    return settings.jobs if job_ms == 0 else max(WORKERS, settings.jobs // 10)


def costs(
    server: ServerInfo,
    settings: BenchSettings,
    jobs_per_s: JobsPerS,
    tag: str,
    progress: Callable[[str], None] = lambda _: None,
) -> list[ProxyCost]:
    out = []
    for job_ms in JOB_MS:
        run = dataclasses.replace(settings, job_ms=job_ms, jobs=jobs_at(job_ms, settings))
        direct: list[float] = []
        through: list[float] = []
        for repeat in range(settings.repeat):
            progress(f"network fault proxy: {job_ms:g} ms jobs, repeat {repeat + 1}/{settings.repeat}")
            for proxied in (False, True) if repeat % 2 == 0 else (True, False):
                with started(server) if proxied else contextlib.nullcontext() as px:
                    urls = [px.url(server.url, i) for i in range(WORKERS)] if px else [server.url] * WORKERS
                    figure = jobs_per_s(server, DESIGN, run, f"{tag}:px{job_ms:g}-{len(direct) + len(through)}", urls)
                (through if proxied else direct).append(round(figure, 1))
        ratio = round(statistics.median(through) / statistics.median(direct), 3)
        out.append(ProxyCost(DESIGN, WORKERS, job_ms, run.jobs, stats(direct), stats(through), ratio, direct, through))
    return out
