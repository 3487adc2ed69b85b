"""The order service on Celery, configured for tasks that must survive a worker crash (Celery's
documentation): late acks, rejected back to the queue when the worker is lost, one task prefetched,
a visibility timeout above the longest task. The broker URL is the deployment's (crashbench swaps in
its own server for a run).

    crashbench run --design celery --app examples.orders.celery_app:app --task orders.place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import os

from celery import Celery

from examples.orders import db

app = Celery("orders", broker=os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_concurrency=2,
    task_ignore_result=True,
    broker_transport_options={"visibility_timeout": 5, "unacked_restore_interval": 1, "unacked_restore_throttle": 1},
)


@app.task(name="orders.place")
def place(order_id: str, amount: int) -> None:
    db.place(order_id, amount)


@app.task(name="orders.place_once")
def place_once(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
