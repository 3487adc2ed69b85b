"""The order service on huey with Redis storage. huey has no setting that survives a worker crash:
its consumer pops a task off the list and nothing in Redis remembers it while it runs, so a task whose
worker dies is gone (its retries are for a task that raises, not one whose worker dies). The storage
URL is the deployment's (crashbench swaps in its own server for a run).

    crashbench run --design huey --app examples.orders.huey_app:huey --task place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import os

from huey import RedisHuey

from examples.orders import db

huey = RedisHuey("orders", url=os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0"), results=False)


@huey.task(retries=3, retry_delay=1)
def place(order_id: str, amount: int) -> None:
    db.place(order_id, amount)


@huey.task(retries=3, retry_delay=1)
def place_once(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
