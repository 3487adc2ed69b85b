"""The order service on Dramatiq's Redis broker, configured for tasks that must survive a worker crash
(Dramatiq's documentation): Dramatiq acks a message after the actor returns, and a dead worker's
messages go back to the queue once its heartbeat is heartbeat_timeout old, in a maintenance pass;
here the timeout is a few seconds (above the longest task) and maintenance runs on every broker
command, so a crash is recovered from in seconds rather than Dramatiq's default minute. The broker URL
is the deployment's (crashbench swaps in its own server for a run).

    crashbench run --design dramatiq --app examples.orders.dramatiq_app:broker --task place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from examples.orders import db

broker = RedisBroker(
    url=os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0"),
    heartbeat_timeout=3_000,  # ms: above the longest task
    maintenance_chance=1_000_000,  # out of 1,000,000: on every command
)
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=3, min_backoff=100)
def place(order_id: str, amount: int) -> None:
    db.place(order_id, amount)


@dramatiq.actor(max_retries=3, min_backoff=100)
def place_once(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
