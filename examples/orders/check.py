"""crashbench --check examples.orders.check:rows: how many rows the job's order has (1 is right)."""

from __future__ import annotations

from examples.orders import db


def rows(payload: dict[str, object]) -> int:
    return db.rows(str(payload["order_id"]))
