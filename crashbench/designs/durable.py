"""WAITAOF after an enqueue (`[broker] wait_aof`, Redis 7.2 and valkey): the enqueue is acknowledged only
once the server has fsynced it to its own AOF, so that `appendfsync everysec` loses no acknowledged
enqueue to a power cut (crashbench.faults.power). Sent last in the enqueue's pipeline, on its connection:
WAITAOF waits for that connection's own writes. Not fsynced within wait_ms: the enqueue is indeterminate.
"""

from __future__ import annotations

from typing import Any

from crashbench.model.queue import DesignSettings, EnqueueUnconfirmed


def ask(pipe: Any, settings: DesignSettings) -> None:
    """Add WAITAOF to an enqueue's pipeline, when the scenario asks for it."""
    if settings.wait_aof:
        pipe.execute_command("WAITAOF", settings.wait_aof, 0, settings.wait_ms)


def check(replies: list[Any], settings: DesignSettings) -> None:
    """Raise EnqueueUnconfirmed when the pipeline's WAITAOF (its last reply) says the server did not fsync."""
    if settings.wait_aof and int(replies[-1][0]) < settings.wait_aof:
        raise EnqueueUnconfirmed(f"not fsynced to the AOF in {settings.wait_ms} ms")


def missing(url: str) -> str:
    """Why the server at `url` cannot confirm an enqueue with WAITAOF, or "" (it has the command)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        try:
            client.execute_command("WAITAOF", 0, 0, 0)  # asks for nothing: answers at once where it exists
            return ""
        except redis.ResponseError:
            info = client.info("server")
    finally:
        client.close()
    name = "valkey" if "valkey_version" in info else "redis"
    version = info.get("valkey_version") or info.get("redis_version")
    return f"the server ({name} {version}) has no WAITAOF (Redis 7.2 and later have it, and valkey)"
