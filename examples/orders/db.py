"""The system of record: one SQLite file (ORDERS_DB, default ./orders.db), shared by every worker."""

from __future__ import annotations

import os
import sqlite3
import time


def connect() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ.get("ORDERS_DB", "orders.db"), timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT NOT NULL, amount INTEGER NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS placed (order_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
    return conn


def place(order_id: str, amount: int) -> None:
    """The naive write: a new row each time it runs."""
    with connect() as conn:
        conn.execute("INSERT INTO orders (order_id, amount) VALUES (?, ?)", (order_id, amount))
    charge(amount)


def place_once(order_id: str, amount: int) -> None:
    """The idempotent write: the order's row is written once, whatever runs it again."""
    with connect() as conn:
        conn.execute("INSERT OR IGNORE INTO placed (order_id, amount) VALUES (?, ?)", (order_id, amount))
    charge(amount)


def charge(amount: int) -> None:
    """The slow part after the write (a payment provider's round trip): where a worker dies."""
    time.sleep(float(os.environ.get("ORDERS_CHARGE_S", "0.05")))


def rows(order_id: str) -> int:
    """How many rows the order has, in either table."""
    with connect() as conn:
        naive = conn.execute("SELECT COUNT(*) FROM orders WHERE order_id = ?", (order_id,)).fetchone()[0]
        once = conn.execute("SELECT COUNT(*) FROM placed WHERE order_id = ?", (order_id,)).fetchone()[0]
    return int(naive) + int(once)
