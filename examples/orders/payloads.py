"""crashbench --payloads examples.orders.payloads:order: job n places order A<n>."""

from __future__ import annotations


def order(n: int) -> dict[str, object]:
    return {"order_id": f"A{n:06d}", "amount": 100 + n % 900}
