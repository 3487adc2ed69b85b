"""Your own app under a library adapter ([app]; crashbench.designs.app): the user's task run by the
library's own worker, the ledger from the library's hooks, and the user's own evidence (--check)
counted against the test's own reading of the user's database (tests/apps, examples/orders)."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashbench.designs import APP_LIBRARIES, BUILTIN, load_design
from crashbench.errors import ScenarioError
from crashbench.model import timeline
from crashbench.model.spec import Scenario
from crashbench.run.session import Options, run_designs
from crashbench.scenario import parse
from tests.conftest import assert_recounts

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def orders_db(tmp_path: Path) -> Iterator[Path]:
    """The user's system of record for one test: the workers and the check find it by ORDERS_DB."""
    db = tmp_path / "orders.db"
    before = {k: os.environ.get(k) for k in ("ORDERS_DB", "ORDERS_CHARGE_S")}
    os.environ.update(ORDERS_DB=str(db), ORDERS_CHARGE_S="0.005")
    yield db
    for k, v in before.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def rows_by_order(db: Path, orders: int) -> dict[str, int]:
    """The test's own reading of the database: each order's rows, in both tables."""
    conn = sqlite3.connect(db)
    counts = {f"A{n:06d}": 0 for n in range(orders)}
    for table in ("orders", "placed"):
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            for order, n in conn.execute(f"SELECT order_id, COUNT(*) FROM {table} GROUP BY order_id"):
                counts[order] += n
    conn.close()
    return counts


def app_run(design: str, tmp_path: Path, **settings: object) -> tuple[object, Scenario]:
    given = {"payloads": "examples.orders.payloads:order", "check": "examples.orders.check:rows", **settings}
    sc = Scenario.of(name="app", jobs=8, workers=1, kills=0, job_ms=5, drain_timeout=20, **given)
    result = run_designs(sc, [design], Options())
    assert_recounts(result, tmp_path)  # the effects come back from the timeline alone
    return result.runs[0], sc


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "written"), [("orders.place_then_die", 2), ("orders.place_once_then_die", 1)], ids=["naive", "idempotent"]
)
def test_celery_app_an_effect_written_by_an_attempt_that_died(
    orders_db: Path, tmp_path: Path, task: str, written: int
) -> None:
    # Order A000002's first attempt writes its row, then its pool process dies (SIGKILL): Celery gives the
    # message back (late ack, reject on worker lost) and the second attempt completes. The ledger sees one
    # completion; the naive task wrote twice, which only the user's own evidence shows.
    run, _ = app_run("celery", tmp_path, app="tests.apps.orders_celery:app", task=task)
    c = run.counts
    assert run.problems == []
    db = rows_by_order(orders_db, 8)
    assert db["A000002"] == written and all(n == 1 for order, n in db.items() if order != "A000002")
    assert (c.done, c.lost, c.duplicated, c.interrupted, c.executions) == (8, 0, 0, 1, 9)
    assert c.effect_checked == 8 and c.effect_missing == sum(n == 0 for n in db.values()) == 0
    assert c.effect_duplicated == sum(n > 1 for n in db.values()) == (written - 1)
    assert c.effect_disagrees == written - 1 and run.jobs["effect_disagrees"] == ["000002"] * (written - 1)
    assert run.configuration["acks_late"] is True  # the user's configuration, not crashbench's


@pytest.mark.slow
def test_rq_app_a_task_that_raises_is_a_failed_attempt_and_its_effect_missing(orders_db: Path, tmp_path: Path) -> None:
    # Job 3's payload has a negative amount: the user's task raises before it writes. The ledger (RQ's
    # worker class) records a failed attempt; the check finds no row.
    run, _ = app_run("rq", tmp_path, app="tests.apps.orders_rq", task="place", payloads="tests.apps.orders_rq:payload")
    c = run.counts
    assert run.problems == []
    db = rows_by_order(orders_db, 8)
    assert [o for o, n in db.items() if n == 0] == ["A000003"] and all(n <= 1 for n in db.values())
    assert (c.done, c.failed, c.failed_attempts, c.executions, c.lost) == (7, 1, 1, 8, 0)
    assert (c.effect_checked, c.effect_missing, c.effect_duplicated, c.effect_disagrees) == (8, 1, 0, 0)
    assert run.jobs["effect_missing"] == ["000003"]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "crashbench", "run", "--plain", "--jobs", "4", "--kills", "0", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


CELERY, RQ_PLACE = ["-d", "celery", "--app"], ["-d", "rq", "--task", "tests.apps.orders_rq.place"]
BAD = {
    "app not importable": ([*CELERY, "tests.apps.nowhere:app", "--task", "t"], "cannot import app module"),
    "no such attribute": ([*CELERY, "tests.apps.orders_celery:nope", "--task", "t"], "has no attribute 'nope'"),
    "not a Celery app": ([*CELERY, "tests.apps.orders_rq:payload", "--task", "t"], "not a Celery app"),
    "task missing": ([*CELERY, "tests.apps.orders_celery:app", "--task", "orders.nope"], "has no task 'orders.nope'"),
    "another broker": ([*CELERY, "tests.apps.orders_celery:rabbit", "--task", "t"], "on Redis only"),
    "rq function missing": (["-d", "rq", "--task", "tests.apps.orders_rq.nope"], "has no function 'nope'"),
    "payloads do not serialize": ([*RQ_PLACE, "--payloads", "tests.apps.orders_rq:unserializable"], "serialize"),
    "payloads not a function": ([*RQ_PLACE, "--payloads", "tests.apps.orders_rq:not_a_function"], "not a function"),
    "check missing": ([*RQ_PLACE, "--check", "tests.apps.orders_rq:nope"], "has no attribute 'nope'"),
    "a built-in design": (["-d", "reliable", "--task", "tests.apps.orders_rq.place"], "reliable cannot run your app"),
    "payloads without a task": (["-d", "rq", "--payloads", "x.jsonl"], "app.task is missing"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_app_input_is_one_line_and_exit_2(case: str) -> None:
    args, message = BAD[case]
    cp = cli(*args)
    assert cp.returncode == 2, cp.stderr
    assert message in cp.stderr and "Traceback" not in cp.stderr
    lines = [line for line in cp.stderr.splitlines() if line.startswith("crashbench: error:")]
    assert len(lines) == 1, cp.stderr


def test_payloads_from_a_jsonl_file_must_cover_every_job(tmp_path: Path) -> None:
    short = tmp_path / "p.jsonl"
    short.write_text('{"order_id": "A1", "amount": 1}\n{"order_id": "A2", "amount": 2}\n')
    cp = cli("-d", "rq", "--task", "tests.apps.orders_rq.place", "--payloads", str(short))
    assert cp.returncode == 2 and "has 2 payload(s) for 4 jobs" in cp.stderr
    short.write_text('{"order_id": "A1"\n')
    cp = cli("-d", "rq", "--task", "tests.apps.orders_rq.place", "--payloads", str(short))
    assert cp.returncode == 2 and "line 1: not JSON" in cp.stderr


def test_an_app_section_is_validated_like_every_other() -> None:
    sc = parse({"app": {"app": "orders:app", "task": "orders.place", "check": "orders.check:rows"}}, "t.toml")
    assert (sc.app.app, sc.app.task, sc.app.check) == ("orders:app", "orders.place", "orders.check:rows")
    assert sc.settings("celery").task == "orders.place"
    assert Scenario.from_dict(sc.to_dict()).app == sc.app
    with pytest.raises(ScenarioError) as e:
        parse({"app": {"app": 3, "payloads": "p.jsonl", "nope": 1}}, "t.toml")
    assert e.value.problems == [
        "unknown key app.nope (known: app, task, payloads, check)",
        "app.app must be a string, not 3",
    ]
    with pytest.raises(ScenarioError, match=r"app\.task is missing"):
        parse({"app": {"check": "orders.check:rows"}}, "t.toml")
    # An app changes what is measured (a scenario without one keeps its old fingerprint: tests/test_spec.py).
    assert Scenario.of(app="orders:app", task="t").fingerprint() != Scenario.of(task="t").fingerprint()


def test_the_adapters_that_run_an_app_are_the_ones_listed() -> None:
    # arq and saq are installed in their own environment (--worker-python): their modules import here.
    libraries = {name: path for name, path in BUILTIN.items() if "lib:" in path}
    runs = set()
    for name, path in libraries.items():
        module, _, _ = path.partition(":")
        if importlib.util.find_spec(name.split(":")[0]) is not None:
            runs |= {name.split(":")[0]} if getattr(load_design(name), "runs_apps", False) else set()
        else:  # not importable here: read its class attribute from the source
            source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
            runs |= {name.split(":")[0]} if "runs_apps = True" in source else set()
    assert runs == set(APP_LIBRARIES)


def test_the_tutorial_s_scenario_section_is_one_crashbench_reads() -> None:
    text = (ROOT / "docs" / "tutorial-your-app.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    sc = parse(tomllib.loads(block), "tutorial")
    assert sc.app.task == "orders.place_once" and sc.app.check == "examples.orders.check:rows"
    assert [t.rule() for t in sc.expect["celery"]] == ["lost == 0", "effect_duplicated == 0"]


@pytest.mark.parametrize("counts", [{"000001": "two"}, {"000001": -1}, {"000001": True}])
def test_a_timeline_s_effects_are_read_back_only_as_counts(counts: dict[str, object]) -> None:
    tl = timeline.Timeline(0, "celery", "", "p:", 0, {}, timeline.DesignFlags(True, True, False, False), 0.0, 0.0, 1.0)
    timeline._apply(tl, "effects", {"check": "m:f", "checked": 3, "counts": {"000002": 2}})
    assert tl.effects == {"check": "m:f", "checked": 3, "counts": {"000002": 2}}
    with pytest.raises(ValueError):
        timeline._apply(tl, "effects", {"check": "m:f", "checked": 3, "counts": counts})


@pytest.mark.parametrize(
    ("check", "message"),
    [("check_raises", "raised for job 0: RuntimeError: the orders database is down"), ("check_says_yes", "'yes'")],
)
def test_a_check_that_raises_or_answers_no_count_ends_the_run_in_one_line(
    orders_db: Path, check: str, message: str
) -> None:
    cp = cli(*RQ_PLACE, "--payloads", "tests.apps.orders_rq:payload", "--check", f"tests.apps.orders_rq:{check}")
    assert cp.returncode == 2 and message in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert len([line for line in cp.stderr.splitlines() if line.startswith("crashbench: error:")]) == 1
