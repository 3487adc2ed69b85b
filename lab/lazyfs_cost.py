"""What the lazy file system costs (issue 31: "AOF-always throughput through it against the bare directory;
aim >= 0.5x"): a private redis-server with `appendonly yes, appendfsync always` (persistence aof-always),
once with its data directory a bare directory (the embedded server's own, on the machine's disk) and once
on the lazy file system's mount (crashbench.faults.power.power_servers, as a power-loss run has it), each
taking the same write load: CLIENTS client processes, each LPUSHing its share of OPS small payloads one at
a time (every enqueue acknowledged before the next, as a queue's producer; the server fsyncs the AOF before
it replies). The two alternate, REPEATS times each; ops/s per configuration is the median, and the ratio
lazy/bare is of the medians. The figures and every repetition go to DIR/<timestamp>.json.

    python lab/lazyfs_cost.py [--repeat N] [--ops N] [--clients N] [--out DIR]   (make lazyfs-cost)
    python lab/lazyfs_cost.py --table DIR     the table of docs/findings/power.md from DIR's files

It needs what a power-loss run needs (root, /dev/fuse, fusermount3, mfusepy: lazyfs.unavailable()).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from crashbench.control import lazyfs, workdirs
from crashbench.control.server import EmbeddedServer, find_server_binary
from crashbench.faults.power import power_servers

REPEATS = 7
OPS = 20_000
CLIENTS = 4
PAYLOAD = b"j" * 64  # a small job: an id and a few arguments
PERSISTENCE = "aof-always"
KEY = "lazyfs-cost:queue"
# bare: the embedded server's own directory (the machine's disk: a real fsync per write); lazy: on the
# mount (its fsync is the model's, no real one); memory: a bare directory in RAM (/dev/shm, when roomy),
# whose fsync costs nothing either: lazy/memory is the pass-through's own cost.
CONFIGS = ("bare", "lazy", "memory")


def _client(port: int, n: int, go: mp.synchronize.Event) -> None:
    r = redis.Redis(host="127.0.0.1", port=port)
    r.ping()
    go.wait()
    for _ in range(n):
        r.lpush(KEY, PAYLOAD)
    r.close()


def load(port: int, ops: int, clients: int) -> float:
    """ops/s of `ops` LPUSHes from `clients` processes, from the start signal to the last acknowledgement."""
    go = mp.get_context("fork").Event()
    share = [ops // clients + (i < ops % clients) for i in range(clients)]
    procs = [mp.get_context("fork").Process(target=_client, args=(port, n, go)) for n in share]
    for p in procs:
        p.start()
    time.sleep(0.3)  # every client connected and waiting
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    if any(p.exitcode for p in procs):
        raise RuntimeError("a client failed")
    return ops / elapsed


@contextlib.contextmanager
def server(config: str, binary: Path) -> Iterator[EmbeddedServer]:
    if config == "lazy":
        with power_servers(PERSISTENCE, str(binary)) as broker:
            yield broker.primary
        return
    primary = EmbeddedServer(binary, PERSISTENCE)
    if config == "memory":
        shutil.rmtree(primary.dir)
        primary.dir = workdirs.make("server", memory=True)
    try:
        primary.start()
        yield primary
    finally:
        primary.stop()


def measure(config: str, binary: Path, ops: int, clients: int) -> float:
    with server(config, binary) as primary:
        rate = load(primary.port, ops, clients)
        r = redis.Redis(host="127.0.0.1", port=primary.port)
        assert r.llen(KEY) == ops, "the server did not take every write"
        info = r.info("persistence")
        assert info["aof_enabled"] == 1 and info["aof_last_write_status"] == "ok", info
        r.close()
    return rate


def table(directory: Path) -> str:
    """One row per result file of `directory` (its "label", else its name), in the order they were written."""
    rows = [
        "| lazy file system | bare | lazy | memory | lazy / bare | lazy / memory | result file |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for path in sorted(directory.glob("*.json")):
        d = json.loads(path.read_text())
        cells = [
            f"{d['median'][c]:,.0f} ({min(d['ops_per_s'][c]):,.0f}-{max(d['ops_per_s'][c]):,.0f})"
            if c in d["median"]
            else "-"
            for c in CONFIGS
        ]
        memory = f"{d['ratio_memory']:.2f}×" if d.get("ratio_memory") else "-"
        label = d.get("label", path.stem)
        rows.append(f"| {label} | {' | '.join(cells)} | **{d['ratio']:.2f}×** | {memory} | `{path.name}` |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"] and len(argv) == 2:
        print(table(Path(argv[1])))
        return 0
    opts = {"--repeat": REPEATS, "--ops": OPS, "--clients": CLIENTS, "--out": "results/readme/lazyfs-cost"}
    while argv:
        if argv[0] not in opts or len(argv) < 2:
            print(__doc__, file=sys.stderr)
            return 2
        opts[argv[0]] = argv[1] if argv[0] == "--out" else int(argv[1])
        argv = argv[2:]
    if why := lazyfs.unavailable():
        print(why, file=sys.stderr)
        return 2
    repeat, ops, clients = int(opts["--repeat"]), int(opts["--ops"]), int(opts["--clients"])
    binary = find_server_binary(None)
    load_before = os.getloadavg()
    configs = CONFIGS if workdirs._memory_dir() is not None else CONFIGS[:2]
    rates: dict[str, list[float]] = {c: [] for c in configs}
    for i in range(repeat):
        for config in configs if i % 2 == 0 else configs[::-1]:
            rates[config].append(measure(config, binary, ops, clients))
            print(f"  {i + 1}/{repeat} {config}: {rates[config][-1]:.0f} ops/s", flush=True)
    med = {c: statistics.median(v) for c, v in rates.items()}
    ratio = med["lazy"] / med["bare"]
    for c, v in rates.items():
        print(f"{c}: {med[c]:.0f} ops/s median ({min(v):.0f}-{max(v):.0f}) of {repeat}")
    print(f"lazy/bare: x{ratio:.2f}")
    print(f"load average before, after: {load_before[0]:.2f}, {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    if "memory" in med:
        print(f"lazy/memory: x{med['lazy'] / med['memory']:.2f}")
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    saved = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": "python lab/lazyfs_cost.py " + " ".join(f"{k} {v}" for k, v in opts.items()),
        "persistence": PERSISTENCE, "ops": ops, "clients": clients, "payload_bytes": len(PAYLOAD),
        "repeat": repeat, "server": version, "kernel": platform.release(), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),  # another process's load skews it
        "ops_per_s": rates, "median": med, "ratio": ratio,
        "ratio_memory": med["lazy"] / med["memory"] if "memory" in med else None,
    }  # fmt: skip
    out = Path(str(opts["--out"]))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(saved, indent=1) + "\n")
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
