"""The library table's cluster column (docs/findings/libraries.md, `make libraries-cluster`): each adapter
on the default
scenario, 2 seeds, on an embedded cluster of 3 primaries without replicas, at its shipped concurrency
and default window, as `make libraries` runs it on one server.

A design that runs leaves its result file in the directory. One that cannot ends as crashbench ends
it, with exit 2 and one line, `<design>: unsupported on a cluster: <the library's own error>`: that
line is kept as `<design>.txt` beside the result files, and lab/library_table.py reads both. Any
other ending stops the script with the run's own error and exit code.

    python lab/libraries_cluster.py results/readme/libraries-cluster .venv/arq/bin/python
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from crashbench.designs import safe_name

LIBRARIES = (
    "rq", "rq:reliable", "celery", "celery:acks-late", "dramatiq", "dramatiq:reliable", "huey",
    "taskiq", "taskiq:stream", "taskiq:reliable",
)  # fmt: skip
WORKER_PYTHON = ("arq", "arq:reliable", "saq", "saq:reliable")  # arq and saq pin redis-py < 6 and < 8
CLUSTER = ["--cluster", "3", "--cluster-replicas", "0"]
ERROR = "crashbench: error: "


def record(directory: Path, design: str, code: int, stderr: str) -> str:
    """Keep what the run of `design` ended with: its result file (exit 0: written by the run), or its
    one-line unsupported error as <design>.txt (exit 2). The other kind, from an earlier run, goes."""
    kept = directory / f"{safe_name(design)}.txt"
    lines = [line.removeprefix(ERROR) for line in stderr.splitlines() if line.startswith(ERROR)]
    if code == 0:
        kept.unlink(missing_ok=True)
        return f"{design}: ran, result file in {directory}"
    if code != 2 or len(lines) != 1 or not lines[0].startswith(f"{design}: unsupported on a cluster: "):
        # Not an answer for the table (no server binary, a library not installed, ...): the run's own
        # error, and its exit code, are the script's.
        print(f"{design}: not run:\n{stderr.strip()}", file=sys.stderr)
        raise SystemExit(code)
    for path in directory.glob("*.json"):
        if json.loads(path.read_text())["runs"][0]["design"] == design:
            path.unlink()
    kept.write_text(lines[0] + "\n")
    return lines[0]


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "results/readme/libraries-cluster")
    worker_python = sys.argv[2] if len(sys.argv) > 2 else ".venv/arq/bin/python"
    directory.mkdir(parents=True, exist_ok=True)
    # Wide, so that rich never wraps the one-line error the file keeps.
    env = {**os.environ, "COLUMNS": "100000"}
    for design in LIBRARIES + WORKER_PYTHON:
        args = [sys.executable, "-m", "crashbench", "run", "--design", design, "--repeat", "2", "--plain"]
        args += [*CLUSTER, "--out", str(directory)]
        if design in WORKER_PYTHON:
            args += ["--worker-python", worker_python]
        done = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        print(record(directory, design, done.returncode, done.stderr), flush=True)


if __name__ == "__main__":
    main()
