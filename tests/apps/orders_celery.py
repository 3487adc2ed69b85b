"""A test app on Celery (tests/test_app.py): examples.orders' writes, plus tasks that make the crash
themselves, so that where it falls is an event, not a race with the injector: `place_then_die` writes
order A000002's row, then SIGKILLs its own pool process on its first attempt; Celery's late ack and
reject-on-worker-lost give it back, and the second attempt writes (naive) or finds (idempotent) the row."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from celery import Celery

from examples.orders import db

app = Celery("tests-orders", broker="redis://127.0.0.1:1/0")  # never this: crashbench swaps its own in
app.conf.update(
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1, worker_concurrency=1,
    task_ignore_result=True,
    broker_transport_options={"visibility_timeout": 30, "unacked_restore_interval": 1, "unacked_restore_throttle": 1},
)  # fmt: skip
DIES = "A000002"


def _die_once(order_id: str) -> None:
    """After the write, on the first attempt only (a marker beside the database says it came)."""
    marker = Path(os.environ["ORDERS_DB"] + f".{order_id}.died")
    if order_id == DIES and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="orders.place_then_die")
def place_then_die(order_id: str, amount: int) -> None:
    db.place(order_id, amount)
    _die_once(order_id)


@app.task(name="orders.place_once_then_die")
def place_once_then_die(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
    _die_once(order_id)


rabbit = Celery("tests-rabbit", broker="amqp://guest@127.0.0.1:1//")  # a broker crashbench does not test
