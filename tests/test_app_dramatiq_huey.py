"""Your own app under the Dramatiq and huey adapters (issue 28): examples/orders, a real server, real
worker processes and real SIGKILLs. The effect counts are held against the test's own reading of
the orders' SQLite file, and the kills against the ledger the libraries' own hooks wrote."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crashbench.designs import APP_LIBRARIES, load_design
from crashbench.model.results import DesignRun
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from tests.conftest import assert_recounts

ROOT = Path(__file__).resolve().parent.parent

# design -> (--app, the table its naive task writes); each library's example of the order service
APPS = {
    "dramatiq": "examples.orders.dramatiq_app:broker",
    "huey": "examples.orders.huey_app:huey",
}
TABLES = {"place": "orders", "place_once": "placed"}  # examples/orders/db.py: the naive and idempotent writes


def library(name: str, slow: bool = False) -> Any:
    marks = [pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"{name} is not installed")]
    return pytest.param(name, marks=[*marks, pytest.mark.slow] if slow else marks, id=name)


# Dramatiq gives a dead worker's messages back after the example's 3 s heartbeat_timeout: a 3 s run.
LIBRARIES = [library("dramatiq", slow=True), library("huey")]


def orders_run(design: str, task: str, db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DesignRun:
    """80 orders, 2 workers of 2 threads, 2 mid-job SIGKILLs; the workers inherit the orders' file."""
    monkeypatch.setenv("ORDERS_DB", str(db))
    monkeypatch.setenv("ORDERS_CHARGE_S", "0.05")  # the write, then 50 ms of "charging": where a kill lands
    sc = Scenario.of(
        name="orders", jobs=80, job_ms=50, workers=2, concurrency=2, kills=2, interval=0.2, drain_timeout=10,
        app=APPS[design], task=task, payloads="examples.orders.payloads:order", check="examples.orders.check:rows",
    )  # fmt: skip
    result = run_designs(sc, [design], Options())
    assert_recounts(result, tmp_path / "results")  # the effects and the ledger give every count again
    return result.runs[0]


def rows_by_job(run: DesignRun, db: Path, table: str) -> dict[str, int]:
    """The test's own reading of the orders' file: how many rows each job's order has."""
    with sqlite3.connect(db) as conn:
        counts = dict(conn.execute(f"SELECT order_id, COUNT(*) FROM {table} GROUP BY order_id").fetchall())
    assert run.timeline is not None
    return {job: counts.get(f"A{int(job):06d}", 0) for job in run.timeline.ids}  # examples.orders.payloads


def assert_effects_as_read(run: DesignRun, rows: dict[str, int]) -> None:
    c = run.counts
    assert c.effect_checked == c.enqueued == len(rows) == 80
    assert c.effect_missing == sum(n == 0 for n in rows.values())
    assert c.effect_duplicated == sum(n > 1 for n in rows.values())
    assert set(run.jobs["effect_duplicated"]) == {j for j, n in rows.items() if n > 1}


def killed_in_ledger(run: DesignRun) -> set[str]:
    """The jobs the kills interrupted, each with an execution in the ledger that never ended, by the
    killed worker (the library's hook wrote its start; nothing wrote an end)."""
    assert run.problems == []
    assert run.counts.kills_mid_job == 2, run.kills
    assert run.timeline is not None
    killed = {job for k in run.kills for job in k.jobs}
    open_ends = {(ex.job, ex.worker) for ex in run.timeline.executions if ex.end is None}
    assert {(job, k.worker) for k in run.kills for job in k.jobs} <= open_ends
    assert run.counts.interrupted == len(killed) >= 2
    return killed


@pytest.mark.parametrize("design", LIBRARIES)
def test_the_naive_order_task_under_kills_counts_what_the_orders_file_holds(
    design: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "orders.db"
    run = orders_run(design, "place", db, monkeypatch, tmp_path)
    rows = rows_by_job(run, db, "orders")
    assert_effects_as_read(run, rows)
    killed = killed_in_ledger(run)
    c = run.counts
    if design == "dramatiq":
        # Acked after the actor returns: the killed workers' messages come back after the heartbeat
        # timeout and run again, so nothing is lost; an order whose first run wrote its row before the
        # kill has two rows. Only a killed job can have two.
        assert (c.lost, c.stranded) == (0, 0) and c.done == 80
        assert c.redelivered >= len(killed)
        assert {j for j, n in rows.items() if n > 1} <= killed
        assert c.effect_duplicated >= 1 and c.effect_missing == 0
    else:
        # huey pops the task: a killed worker's tasks are gone. Their rows were written before the kill
        # (the write, then the charge) or not at all: never twice.
        assert c.duplicated == 0 and c.effect_duplicated == 0
        assert killed <= set(run.jobs["lost"])
        assert {j for j, n in rows.items() if n == 0} <= set(run.jobs["lost"])
        # A killed task's row exists once though no run of it completed: the check and the ledger disagree.
        assert c.effect_disagrees == sum(rows[j] == 1 for j in run.jobs["lost"]) >= 1


@pytest.mark.parametrize("design", LIBRARIES)
def test_the_idempotent_order_task_under_kills_writes_each_order_once_or_not_at_all(
    design: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "orders.db"
    run = orders_run(design, "place_once", db, monkeypatch, tmp_path)
    rows = rows_by_job(run, db, "placed")
    assert_effects_as_read(run, rows)
    killed = killed_in_ledger(run)
    assert run.counts.effect_duplicated == 0 and max(rows.values()) == 1
    if design == "dramatiq":  # every killed job ran again; the re-run found its row and wrote none
        assert run.counts.lost == 0 and run.counts.effect_missing == 0
        assert run.counts.redelivered >= len(killed)


def test_dramatiq_and_huey_are_app_libraries() -> None:
    assert {"dramatiq", "huey"} <= set(APP_LIBRARIES)
    assert all(load_design(d).runs_apps for d in ("dramatiq", "dramatiq:reliable", "huey"))


STUB_APPS = {
    "stub_dramatiq.py": (
        "import dramatiq\nfrom dramatiq.brokers.stub import StubBroker\n\nbroker = StubBroker()\n"
        "dramatiq.set_broker(broker)\n\n\n@dramatiq.actor\ndef place(order_id, amount):\n    pass\n"
    ),
    "memory_huey.py": (
        "from huey import MemoryHuey\n\nhuey = MemoryHuey('orders')\n\n\n@huey.task()\n"
        "def place(order_id, amount):\n    pass\n"
    ),
}


@pytest.mark.parametrize(
    ("design", "app", "task", "says"),
    [
        ("dramatiq", "no_such_module:broker", "place", "cannot import app module 'no_such_module'"),
        ("dramatiq", APPS["dramatiq"], "nope", "has no actor 'nope'"),
        ("dramatiq", "stub_dramatiq:broker", "place", "hard-codes another broker (StubBroker)"),
        ("huey", "no_such_module:huey", "place", "cannot import app module 'no_such_module'"),
        ("huey", APPS["huey"], "nope", "has no task 'nope'"),
        ("huey", "memory_huey:huey", "place", "hard-codes another storage (MemoryStorage)"),
    ],
)
def test_an_app_that_cannot_run_is_one_line_and_exit_2(
    design: str, app: str, task: str, says: str, tmp_path: Path
) -> None:
    if importlib.util.find_spec(design) is None:
        pytest.skip(f"{design} is not installed")
    for name, text in STUB_APPS.items():
        (tmp_path / name).write_text(text)
    cp = subprocess.run(
        [sys.executable, "-m", "crashbench", "run", "--design", design, "--app", app, "--task", task, "--jobs", "10",
         "--out", str(tmp_path / "r.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert cp.returncode == 2, cp.stderr + cp.stdout
    first, *rest = cp.stderr.splitlines()
    assert first.startswith("crashbench: error: ") and says in first
    assert all(line.startswith("hint: ") for line in rest) and len(rest) <= 1  # the one line, and a hint
    assert "Traceback" not in cp.stderr and not (tmp_path / "r.json").exists()
