"""crashbench bench's bookkeeping against designs whose commands are known exactly (real server, real
workers). The figures themselves are benchmarks, not tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from crashbench.bench import BenchSettings, measure, memory, restarts
from crashbench.control import workdirs
from crashbench.control.server import ServerInfo


@pytest.fixture
def server(server_url: str) -> ServerInfo:
    return ServerInfo(server_url, "external", None, "redis", "?")


HANDSHAKE = {"hello", "client|setinfo"}  # what redis-py sends on each new connection, by server version


@pytest.mark.parametrize("workers", [1, 3])
def test_commands_per_job_are_exactly_what_the_design_sends(
    server: ServerInfo, workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASHBENCH_TEST_COUNTS", str(tmp_path))
    n = 500
    settings = BenchSettings(jobs=n, latency_jobs=50)
    m = measure(server, "designs_counting:CountingNaive", settings, workers, 0, f"t{workers}n")
    # The throughput phase's workers are the first ones started (w0..): what they counted sending.
    sent: Counter[str] = Counter()
    for i in range(workers):
        sent.update(json.loads((tmp_path / f"w{i}.json").read_text()))
    assert {k: v for k, v in m.commands.items() if k not in HANDSHAKE} == dict(sent)
    assert sent["brpop"] >= n  # one per job, and the empty ones at the end
    assert all(v % workers == 0 for k, v in m.commands.items() if k in HANDSHAKE)
    assert m.commands_per_job == pytest.approx(sum(m.commands.values()) / n, abs=1e-4)
    assert m.enqueue_commands_per_job == 1.0  # one LPUSH per job (pipelined)
    assert m.jobs == n and m.jobs_per_s > 0 and m.bare_jobs_per_s > 0
    assert m.latency["all"].n == 50 and m.latency["high"].n == 5  # every 10th job is marked high
    assert m.server_cpu is None  # not a server this bench started


def test_reliable_sends_one_move_one_heartbeat_and_one_remove_per_job(server: ServerInfo) -> None:
    n, workers = 400, 2
    m = measure(server, "reliable", BenchSettings(jobs=n, latency_jobs=20), workers, 0, "t-rel")
    c = m.commands
    # Per fetch a BLMOVE pipelined with a heartbeat HSET (+1 heartbeat and 1 SADD when a worker starts),
    # per job an LREM; empty fetches at the end add BLMOVE + HSET pairs only.
    assert c["lrem"] == n and c["sadd"] == workers
    assert c["hset"] == c["blmove"] + workers and c["blmove"] >= n


def test_restart_and_memory_figures_are_measured(server: ServerInfo) -> None:
    r = restarts(server, "reliable", BenchSettings(restarts=3), "t-restart")
    assert len(r.samples_ms) == 3 and all(v > 0 for v in r.samples_ms)
    mem = {m.structure: m for m in memory(server, 2000, "t-mem")}
    # A stream entry carries an id and field names besides the payload: it costs more than a list item.
    assert 0 < mem["list"].bytes_per_job < mem["stream"].bytes_per_job


def test_a_design_whose_setup_fails_leaves_no_work_directory(server: ServerInfo) -> None:
    def ours() -> set[Path]:
        bases = {Path(tempfile.gettempdir()), workdirs.SHM}
        return {p for base in bases for p in base.glob(f"crashbench-bench-{os.getpid()}-*")}

    before = ours()
    with pytest.raises(RuntimeError, match="on purpose"):
        measure(server, "designs_broken:SetupRaises", BenchSettings(jobs=10, latency_jobs=5), 1, 0, "t-setup")
    assert ours() == before


@pytest.mark.slow
def test_bench_command_prints_its_tables_and_saves_typed_json(tmp_path: Path) -> None:
    from tests.test_cli import assert_clean_error, crashbench, crashbench_here

    args = ["--designs", "naive", "--workers", "1,2", "--jobs", "300", "--repeat", "1", "--memory-jobs", "1000"]
    cp = crashbench("bench", *args, "--out", str(tmp_path), "--plain", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "harness/bare" in cp.stdout and "SIGKILL -> replacement READY" in cp.stdout and "per 1M jobs" in cp.stdout
    (saved,) = tmp_path.glob("*-bench.json")
    data = json.loads(saved.read_text())
    assert (data["schema"], data["schema_version"]) == ("crashbench.bench", 1)
    assert [(p["design"], p["workers"]) for p in data["points"]] == [("naive", 1), ("naive", 2)]
    assert {m["structure"] for m in data["memory"]} == {"list", "stream"}
    assert data["environment"]["server_mode"] == "embedded"
    assert all(p["server_cpu"] is not None for p in data["points"])  # its own server: CPU is measured
    assert_clean_error(crashbench_here("bench", "--workers", "0,x", tmp_path=tmp_path), 2, "--workers")
    assert_clean_error(crashbench_here("bench", "--designs", "nope", tmp_path=tmp_path), 2, "unknown design")


def test_the_readme_scale_table_is_what_its_figures_give() -> None:
    """The scale table of docs/findings/benchmarks.md is lab/scale.py's rendering of results/readme/scale/scale.json
    (make bench-scale), every row of it."""
    root = Path(__file__).resolve().parent.parent
    table = subprocess.run(
        [sys.executable, str(root / "lab" / "scale.py"), "--table", str(root / "results" / "readme" / "scale")],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    readme = (root / "docs" / "findings" / "benchmarks.md").read_text()
    assert len(table) == 6 and all(line in readme for line in table)
