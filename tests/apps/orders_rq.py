"""A test app on RQ (tests/test_app.py): examples.orders' naive write, refusing a negative amount
before it writes (a task that raises: a failed attempt, and no effect)."""

from __future__ import annotations

from examples.orders import db


def place(order_id: str, amount: int) -> None:
    if amount < 0:
        raise ValueError(f"order {order_id}: negative amount {amount}")
    db.place(order_id, amount)


def payload(n: int) -> dict[str, object]:
    return {"order_id": f"A{n:06d}", "amount": -1 if n == 3 else 100 + n}


def unserializable(n: int) -> object:
    return {n}  # a set: no JSON for it


not_a_function = 42


def check_raises(payload: dict[str, object]) -> int:
    raise RuntimeError("the orders database is down")


def check_says_yes(payload: dict[str, object]) -> object:
    return "yes"
