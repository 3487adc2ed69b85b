"""The order service on RQ: plain functions, enqueued by their dotted path.

    crashbench run --design rq:reliable --task examples.orders.rq_tasks.place \\
        --payloads examples.orders.payloads:order --check examples.orders.check:rows
"""

from __future__ import annotations

from examples.orders import db


def place(order_id: str, amount: int) -> None:
    db.place(order_id, amount)


def place_once(order_id: str, amount: int) -> None:
    db.place_once(order_id, amount)
