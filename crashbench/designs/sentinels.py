"""A library adapter on a Sentinel topology (the sentinel fault family): what its workers are told.

Under sentinel-kill a worker's client (crashbench.run.worker) is redis-py's Sentinel client of the run's
`redis+sentinel://` URL (crashbench.control.connect.sentinel_client); the harness's own design instance
has a plain client of the current primary. An adapter asks `topology(self.r)`: the sentinels, the
master name, the database and the password that client follows, or None for a plain server. Where it
gets them, it configures its library's own Sentinel support, as the library's users do:

    celery     kombu's `sentinel://` broker URL, one per sentinel joined by ";", and the transport
               option master_name (a Redis result backend likewise, result_backend_transport_options)
    rq         RQ's SENTINEL settings (INSTANCES, MASTER_NAME, DB, PASSWORD), through the connection
               its `rq worker -c settings` builds from them (rq.cli.helpers.get_redis_from_config)
    arq        RedisSettings(host=[sentinels], sentinel=True, sentinel_master=...)
    taskiq     taskiq-redis's ListQueueSentinelBroker / RedisStreamSentinelBroker
    dramatiq, huey, saq   none of their own: a redis-py Sentinel client handed to them (`master`,
               `async_master`): RedisBroker(client=), RedisHuey(connection_pool=), saq's RedisQueue(redis)

The password goes to the library only, never to a message (crashbench.redact).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crashbench.control.connect import SentinelURL

if TYPE_CHECKING:
    import redis
    import redis.asyncio


def topology(client: Any) -> SentinelURL | None:
    """The topology a Sentinel client (redis-py's master_for) follows; None for any other client."""
    from redis.sentinel import SentinelConnectionPool

    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        return None
    sentinels = tuple(
        (str(kw["host"]), int(kw["port"]))
        for s in pool.sentinel_manager.sentinels
        for kw in [s.connection_pool.connection_kwargs]
    )
    kw = pool.connection_kwargs
    return SentinelURL(sentinels, pool.service_name, int(kw.get("db") or 0), kw.get("password"))


def master(parts: SentinelURL, **kwargs: Any) -> redis.Redis:
    """redis-py's own Sentinel client of the primary (bytes, as a library reads them), for a library
    without Sentinel support of its own that takes a client or a connection pool."""
    from redis.sentinel import Sentinel

    return Sentinel(list(parts.sentinels)).master_for(parts.master, db=parts.db, password=parts.password, **kwargs)


def async_master(parts: SentinelURL) -> redis.asyncio.Redis:
    """The same for an asyncio library (saq): redis.asyncio's Sentinel client."""
    from redis.asyncio.sentinel import Sentinel

    return Sentinel(list(parts.sentinels)).master_for(parts.master, db=parts.db, password=parts.password)


def kombu_url(parts: SentinelURL) -> str:
    """kombu's Sentinel broker URL: `sentinel://[:password@]host:port/db`, one per sentinel, joined by ";"
    (Celery tries them in turn); the master's name goes in the transport options (master_name)."""
    from urllib.parse import quote

    auth = f":{quote(parts.password, safe='')}@" if parts.password else ""
    return ";".join(f"sentinel://{auth}{host}:{port}/{parts.db}" for host, port in parts.sentinels)


def rq_settings(parts: SentinelURL) -> dict[str, Any]:
    """RQ's SENTINEL settings (what `rq worker -c module` reads from the module)."""
    return {
        "SENTINEL": {
            "INSTANCES": list(parts.sentinels), "MASTER_NAME": parts.master, "DB": parts.db,
            "PASSWORD": parts.password,
        }
    }  # fmt: skip
