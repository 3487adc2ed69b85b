"""The order service on taskiq, with taskiq-redis's stream broker: a message is acknowledged once its
task is done, and one left pending by a crashed worker is claimed by another after idle_timeout
(here 2 s, above the longest order; taskiq-redis ships 10 minutes). The URL is the deployment's
(crashbench swaps in its own server and keys for a run).

    crashbench run --design taskiq:stream --app examples.orders.taskiq_app:broker --task orders.place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import os

from taskiq_redis import RedisStreamBroker

from examples.orders import db

broker = RedisStreamBroker(
    os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0"), idle_timeout=2000, xread_count=1
)


@broker.task(task_name="orders.place")
def place(order_id: str, amount: int) -> None:
    db.place(order_id, amount)


@broker.task(task_name="orders.place_once")
def place_once(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
