"""The order service on saq: async functions taking keyword arguments, the order's blocking SQLite
work in a thread. The Redis URL is the deployment's (crashbench swaps in its own server and queue for
a run). saq pins an older redis-py, so crashbench's workers run under the interpreter that has it;
saq:reliable enqueues with a timeout above the longest job and retries, and sweeps every second:

    crashbench run --design saq:reliable --worker-python ENV/bin/python \\
        --app examples.orders.saq_app:settings --task place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from saq import Queue

from examples.orders import db


async def place(ctx: dict[str, Any], *, order_id: str, amount: int) -> None:
    await asyncio.to_thread(db.place, order_id, amount)


async def place_once(ctx: dict[str, Any], *, order_id: str, amount: int) -> None:
    await asyncio.to_thread(db.place_once, order_id, amount)


settings = {
    "queue": Queue.from_url(os.environ.get("ORDERS_BROKER", "redis://localhost:6379/0")),
    "functions": [place, place_once],
    "concurrency": 4,
}
