"""The stream-trimming figures (docs/findings/stream-trimming.md) (`make stream-trim`).

    python lab/stream_trim.py memory results/readme/stream-trim/memory.json   # measure, a private server
    python lab/stream_trim.py table results/readme/stream-trim                # docs/findings' tables

`memory`: what each design keeps on the server once every job was acknowledged, against what its
largest backlog cost (MEMORY USAGE of every key of the design's namespace): JOBS jobs, CHUNK at a time
enqueued, then fetched and acknowledged one by one in this process; at the end, the stream's entries
left (XLEN). The backlog never exceeds the bound, so every job is done.
`table`: the bounds table from the sweeps `exact.json` and `approximate.json` (stream_maxlen against a
backlog of every job enqueued before the workers start), the run table from `produced.json`
(scenarios/stream-trim.toml, repeated), and the memory table from `memory.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import redis

from crashbench.control.server import EmbeddedServer, describe, find_server_binary
from crashbench.designs import Design, load_design
from crashbench.model.queue import DesignSettings
from crashbench.model.results import DesignRun, Result
from crashbench.model.workload import job_ids, jobs_for

JOBS = 20_000
CHUNK = 500  # jobs enqueued, then every one fetched and acknowledged, at a time
BOUND = 1_000
# (design, stream_maxlen, approximate)
CASES = [("reliable", 0, False), ("stream", 0, False), ("stream", BOUND, False), ("stream", BOUND, True)]


def _bytes(client: redis.Redis, prefix: str) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in client.scan_iter(match=prefix + "*"))


def _drain(design: Design) -> int:
    design.start_worker("w1", 0.0)
    done = 0
    while (job := design.fetch("w1", 0.001, 0.0)) is not None:
        design.ack("w1", job, 0.0)
        done += 1
    return done


def memory(out: Path) -> int:
    server = EmbeddedServer(find_server_binary())
    server.start()
    rows = []
    try:
        info = describe(server.url, "embedded", None)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        for n, (spec, maxlen, approximate) in enumerate(CASES):
            prefix = f"trim:{n}:"
            design = load_design(spec)(
                client, prefix, DesignSettings(stream_maxlen=maxlen, stream_approximate=approximate)
            )
            design.setup()
            ids, done, backlog = job_ids(JOBS), 0, 0
            for start in range(0, JOBS, CHUNK):  # a backlog of CHUNK at most: below the bound, nothing is lost
                design.enqueue(jobs_for(ids[start : start + CHUNK]))
                backlog = max(backlog, _bytes(client, prefix))
                done += _drain(design)
            stream = prefix + "stream"
            rows.append({
                "design": spec, "stream_maxlen": maxlen, "approximate": approximate, "jobs": JOBS, "chunk": CHUNK,
                "done": done, "bytes_backlog": backlog, "bytes_after_ack": _bytes(client, prefix),
                "entries_after_ack": client.xlen(stream) if client.exists(stream) else 0,
            })  # fmt: skip
        client.close()
    finally:
        server.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"server": f"{info.name} {info.version}", "rows": rows}, indent=1) + "\n")
    return 0


def _runs(path: Path) -> list[DesignRun]:
    return Result.from_dict(json.loads(path.read_text())).runs


def _bound(run: DesignRun) -> int:
    return int(run.variant.partition("=")[2])


def bounds_table(directory: Path) -> list[str]:
    exact, approx = _runs(directory / "exact.json"), _runs(directory / "approximate.json")
    backlog = exact[0].counts.enqueued
    lines = [
        f"| stream_maxlen | vs backlog ({backlog:,}) | MAXLEN: done | lost | trimmed unread | MAXLEN ~: done | lost "
        "| trimmed unread | problems |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e, a in zip(exact, approx, strict=True):
        bound, problems = _bound(e), len(e.problems) + len(a.problems)
        rel = "never trims" if bound == 0 else f"{bound / backlog:g}x"
        ce, ca = e.counts, a.counts
        lines.append(
            f"| {bound:,} | {rel} | {ce.done:,} | {ce.lost:,} | {ce.trimmed_unread:,} | {ca.done:,} | {ca.lost:,} "
            f"| {ca.trimmed_unread:,} | {problems} |"
        )
    return lines


def produced_table(directory: Path) -> list[str]:
    lines = [
        "| design | seed | done | lost | trimmed unread | trimmed pending | kills mid-job | pending ids = killed jobs "
        "| duplicated | problems |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for run in _runs(directory / "produced.json"):
        c = run.counts
        killed = sorted(k.job for k in run.kills if k.mid_job and k.job)
        same = "yes" if run.jobs.get("trimmed_pending") == killed else "no"
        lines.append(
            f"| {run.design} | {run.seed} | {c.done:,} | {c.lost:,} | {c.trimmed_unread:,} | {c.trimmed_pending} "
            f"| {c.kills_mid_job} | {same} ({', '.join(killed)}) | {c.duplicated} | {len(run.problems)} |"
        )
    return lines


def memory_table(directory: Path) -> list[str]:
    data = json.loads((directory / "memory.json").read_text())
    lines = [
        "| design | stream_maxlen | jobs done | peak, while running | after every ack | entries kept |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in data["rows"]:
        bound = "-" if r["design"] != "stream" else str(r["stream_maxlen"] or "0 (never trims)")
        if r["approximate"]:
            bound = f"~ {bound}"
        lines.append(
            f"| {r['design']} | {bound} | {r['done']:,} | {r['bytes_backlog'] / 1024:,.1f} KB "
            f"| {r['bytes_after_ack'] / 1024:,.1f} KB | {r['entries_after_ack']:,} |"
        )
    return lines


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "memory":
        return memory(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "table":
        d = Path(argv[1])
        print("\n".join([*bounds_table(d), "", *produced_table(d), "", *memory_table(d)]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
