"""Your own app under arq, taskiq and saq (issue 28): the example order service (examples/orders) run
by each library's own worker, real server, real SIGKILLs, with the user's check of the SQLite file.
The effect counts must be the test's own reading of that file; the naive task may write an order
twice, the idempotent one never. Bad input is one line, exit 2, before any job runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from taskiq import InMemoryBroker

from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from examples.orders.payloads import order
from tests.test_cli import crashbench
from tests.test_saq import saq_python
from tests.test_worker_python import arq_python

pytestmark = pytest.mark.slow  # real libraries, each run waits on its library's redelivery

memory_broker = InMemoryBroker()  # a taskiq broker that is not Redis: refused

JOBS = 60
# library -> (design, --app, the naive task, the idempotent task, whether its workers need arq's venv)
LIBRARIES = {
    "arq": ("arq", "examples.orders.arq_app:WorkerSettings", "place", "place_once", True),
    "taskiq": ("taskiq:stream", "examples.orders.taskiq_app:broker", "orders.place", "orders.place_once", False),
    "saq": ("saq:reliable", "examples.orders.saq_app:settings", "place", "place_once", True),
}


def _python(library: str) -> str | None:
    if not LIBRARIES[library][4]:
        return None
    return saq_python() if library == "saq" else arq_python()


def _rows(db: Path) -> dict[str, int]:
    """The test's own reading of the system of record: each order's rows, in either table."""
    with sqlite3.connect(db) as conn:
        found = {order(n)["order_id"]: 0 for n in range(JOBS)}
        for table in ("orders", "placed"):
            for order_id, count in conn.execute(f"SELECT order_id, COUNT(*) FROM {table} GROUP BY order_id"):
                found[order_id] += count
    return found


def _run(small: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str, naive: bool) -> tuple:
    design, app, place, place_once, _ = LIBRARIES[library]
    db = tmp_path / "orders.db"
    monkeypatch.setenv("ORDERS_DB", str(db))
    monkeypatch.setenv("ORDERS_CHARGE_S", "0.2")  # the slow part after the write: where most kills land
    # One order at a time per worker, so each kill interrupts one; the libraries' settings (the example
    # apps', saq:reliable's) give a killed job back within seconds.
    sc = small.replace(
        jobs=JOBS, workers=2, kills=2, interval=0.3, concurrency=1, drain_timeout=30,
        app=app, task=place if naive else place_once, payloads="examples.orders.payloads:order",
        check="examples.orders.check:rows",
    )  # fmt: skip
    run = run_designs(sc, [design], Options(worker_python=_python(library))).runs[0]
    rows = _rows(db)
    c = run.counts
    assert run.problems == []
    assert c.kills_mid_job == 2 and c.interrupted == 2, run.kills  # the ledger, from the library's hooks
    # saq's sweep can lose the worker it waits on to a kill and leave a job in no list (tests/test_saq.py).
    assert c.lost == 0 and c.stranded <= (1 if library == "saq" else 0), run.jobs["stranded"]
    assert c.done + c.stranded == c.enqueued == JOBS
    assert c.effect_checked == JOBS
    assert c.effect_duplicated == sum(1 for n in rows.values() if n > 1), rows
    assert c.effect_missing == sum(1 for n in rows.values() if n == 0) <= c.stranded, rows
    return run, rows


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_naive_task_effects_are_the_system_of_record_s(
    small: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    # A killed order that had written its row runs again and writes another: counted by the user's
    # check as the test counts it, whichever way the kills fell.
    run, rows = _run(small, tmp_path, monkeypatch, library, naive=True)
    assert run.counts.effect_duplicated <= run.counts.redelivered + run.counts.extra_executions, rows


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_idempotent_task_writes_each_order_once(
    small: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    run, rows = _run(small, tmp_path, monkeypatch, library, naive=False)
    assert run.counts.effect_duplicated == 0 and set(rows.values()) <= {0, 1}


BAD = [
    ("arq", "examples.orders.no_such_module:WorkerSettings", "place", "cannot import app module"),
    ("arq", "examples.orders.arq_app:WorkerSettings", "nope", "has no function 'nope'"),
    ("taskiq", "examples.orders.no_such_module:broker", "orders.place", "cannot import app module"),
    ("taskiq", "examples.orders.taskiq_app:broker", "nope", "has no task 'nope'"),
    ("taskiq", "tests.test_app_async_libs:memory_broker", "nope", "InMemoryBroker: crashbench tests taskiq on Redis"),
    ("saq", "examples.orders.no_such_module:settings", "place", "cannot import app module"),
    ("saq", "examples.orders.saq_app:settings", "nope", "has no function 'nope'"),
    # saq passes keyword arguments only: the default payload, the job number, is not an object
    ("saq", "examples.orders.saq_app:settings", "place", "keyword arguments only"),
]


@pytest.mark.parametrize(("library", "app", "task", "says"), BAD)
def test_bad_app_input_is_one_line_and_exit_2(tmp_path: Path, library: str, app: str, task: str, says: str) -> None:
    design = LIBRARIES[library][0]
    python = ["--worker-python", p] if (p := _python(library)) else []
    cp = crashbench("run", "--design", design, *python, "--app", app, "--task", task, "--jobs", "5", "--kills", "0",
                    tmp_path=tmp_path)  # fmt: skip
    assert cp.returncode == 2, cp.stderr + cp.stdout
    assert "Traceback" not in cp.stderr
    [error] = [line for line in cp.stderr.splitlines() if "error:" in line]
    assert says in error
