"""The order service on arq: async functions that run the order's blocking SQLite work in a thread.
A short job_timeout, above the longest order, so that a crashed worker's job runs again soon (arq
starts it again job_timeout + 10 s after it began). The Redis URL is the deployment's (crashbench
swaps in its own server and queue for a run). arq pins an older redis-py, so crashbench's workers
run under the interpreter that has it:

    crashbench run --design arq --worker-python ENV/bin/python \\
        --app examples.orders.arq_app:WorkerSettings --task place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, ClassVar

from arq.connections import RedisSettings

from examples.orders import db


async def place(ctx: dict[str, Any], order_id: str, amount: int) -> None:
    await asyncio.to_thread(db.place, order_id, amount)


async def place_once(ctx: dict[str, Any], order_id: str, amount: int) -> None:
    await asyncio.to_thread(db.place_once, order_id, amount)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [place, place_once]
    redis_settings = RedisSettings.from_dsn(os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0"))
    job_timeout = 2
    max_tries = 5
    max_jobs = 4
