"""Designs that hide jobs from the harness's reading, each in one of the ways a user's own design can:
every job whose number ends in 3 (n % 10 == 3) is put aside where no worker reads it, the rest go
through reliable's queue. Without the harness's own search those jobs counted lost; they are stranded,
at the place named, and a problem says how the design's reading missed them (exit 4).

    OmittedPattern   key P:stash, which key_patterns() leaves out                -> undeclared_key
    BookkeepingStash key P:stash, declared BOOKKEEPING                           -> bookkeeping_holds_jobs
    RelativeRewrite  key P:stash, which relative() renames to bookkeeping's      -> bookkeeping_holds_jobs
    OutsideNamespace key "elsewhere:<run>:stash", outside the run's namespace     -> outside_namespace
    HashFieldName    hash P:byid, the id as a field name, a number as its value  -> job_of_disagrees
    PrefixedMember   sorted set P:later, members "job:<id>"                      -> job_of_disagrees
    Base64Stash      list P:b64, each job's JSON base64-encoded                  -> job_of_disagrees
    MapsToDone       list P:stash, which job_of reads as job 000000 (done)       -> job_of_disagrees
    OtherDatabase    P:stash in database 3 (a server crashbench started)         -> outside_namespace
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import redis

from crashbench.designs import Entry, Job
from crashbench.designs.reliable import ReliableQueue

ASIDE = 3  # n % 10


def aside(job: Job) -> bool:
    return json.loads(job.payload)["n"] % 10 == ASIDE  # the id is opaque: the payload carries the number


def raw(job: Job) -> str:
    return json.dumps({"id": job.id, "payload": job.payload, "attempts": 0})


class _Hiding(ReliableQueue):
    def enqueue(self, jobs: Sequence[Job]) -> None:
        super().enqueue([j for j in jobs if not aside(j)])
        hidden = [j for j in jobs if aside(j)]
        if hidden:
            self.put_aside(hidden)

    def put_aside(self, jobs: Sequence[Job]) -> None:
        self.r.rpush(self.key("stash"), *map(raw, jobs))


class OmittedPattern(_Hiding):
    name = "omitted-pattern"

    def key_patterns(self) -> list[str]:
        return [self.prefix + p for p in ("pending", "processing:*", "dead", "delayed", "workers", "heartbeats")]


class BookkeepingStash(_Hiding):
    name = "bookkeeping-stash"
    BOOKKEEPING = (*ReliableQueue.BOOKKEEPING, "stash")


class RelativeRewrite(_Hiding):
    name = "relative-rewrite"

    def relative(self, name: str) -> str:
        rel = super().relative(name)
        return "heartbeats" if rel == "stash" else rel


class OutsideNamespace(_Hiding):
    name = "outside-namespace"

    def put_aside(self, jobs: Sequence[Job]) -> None:
        self.r.rpush("elsewhere:" + self.prefix.replace(":", "-") + "stash", *map(raw, jobs))


class HashFieldName(_Hiding):
    name = "hash-field-name"

    def put_aside(self, jobs: Sequence[Job]) -> None:
        self.r.hset(self.key("byid"), mapping={j.id: "1" for j in jobs})


class PrefixedMember(_Hiding):
    name = "prefixed-member"

    def put_aside(self, jobs: Sequence[Job]) -> None:
        self.r.zadd(self.key("later"), {f"job:{j.id}": 1.0 for j in jobs})


class Base64Stash(_Hiding):
    name = "base64-stash"

    def put_aside(self, jobs: Sequence[Job]) -> None:
        self.r.rpush(self.key("b64"), *(base64.b64encode(raw(j).encode()).decode() for j in jobs))


class MapsToDone(_Hiding):
    name = "maps-to-done"

    def job_of(self, key: str, entry: Entry) -> str | None:
        if key == "stash":
            return "000000"  # a job that completes: the stashed ones are read as it
        return super().job_of(key, entry)


class OtherDatabase(_Hiding):
    name = "other-database"

    def put_aside(self, jobs: Sequence[Job]) -> None:
        kw = self.r.connection_pool.connection_kwargs
        other = redis.Redis(host=kw["host"], port=kw["port"], password=kw.get("password"), db=3)
        try:
            other.rpush(self.key("stash"), *map(raw, jobs))
        finally:
            other.close()
