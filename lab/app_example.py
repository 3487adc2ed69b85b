"""The worked example's table (docs/tutorial-your-app.md): the order service of examples/orders, its naive
and its idempotent task, under each library, crash-tested by the installed `crashbench` command with
the user's own check; one result file per run in the output directory, then the table from them.

    python lab/app_example.py run results/readme/app-example [--worker-python PATH] [--only celery,rq]
    python lab/app_example.py table results/readme/app-example

Each run gets a fresh SQLite file (ORDERS_DB), so that the check counts only its own rows. arq and saq
run under --worker-python (their own environment); without it they are left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# library -> (--design, --app, the naive task, the idempotent task, needs --worker-python)
APPS: dict[str, tuple[str, str, str, str, bool]] = {
    "celery": ("celery", "examples.orders.celery_app:app", "orders.place", "orders.place_once", False),
    "rq": ("rq:reliable", "", "examples.orders.rq_tasks.place", "examples.orders.rq_tasks.place_once", False),
    "dramatiq": ("dramatiq", "examples.orders.dramatiq_app:broker", "place", "place_once", False),
    "huey": ("huey", "examples.orders.huey_app:huey", "place", "place_once", False),
    "arq": ("arq", "examples.orders.arq_app:WorkerSettings", "place", "place_once", True),
    "taskiq": ("taskiq:stream", "examples.orders.taskiq_app:broker", "orders.place", "orders.place_once", False),
    "saq": ("saq:reliable", "examples.orders.saq_app:settings", "place", "place_once", True),
}
RUN = ["--jobs", "200", "--workers", "2", "--kills", "3", "--interval", "0.5", "--job-ms", "50", "--plain"]
EVIDENCE = ["--payloads", "examples.orders.payloads:order", "--check", "examples.orders.check:rows"]
COLUMNS = ("lost", "stranded", "duplicated", "effect_missing", "effect_duplicated", "effect_disagrees")


def run(out: Path, worker_python: str | None, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for library, (design, app, naive, once, wp) in APPS.items():
        if (only and library not in only) or (wp and not worker_python):
            continue
        for version, task in (("naive", naive), ("idempotent", once)):
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "ORDERS_DB": str(Path(tmp) / "orders.db"), "ORDERS_CHARGE_S": "0.05"}
                cmd = ["crashbench", "run", "--design", design, "--task", task, *RUN, *EVIDENCE]
                cmd += ["--app", app] if app else []
                cmd += ["--worker-python", worker_python] if wp and worker_python else []
                cmd += ["--out", str(out / f"{library}-{version}.json")]
                print(f"{library} {version}: {' '.join(cmd[1:])}", flush=True)
                subprocess.run(cmd, env=env, check=True)


def table(out: Path) -> str:
    lines = [
        "| library (design) | version | " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " | kills |",
        "|---|---|" + "---:|" * (len(COLUMNS) + 1),
    ]
    for library in APPS:
        for version in ("naive", "idempotent"):
            path = out / f"{library}-{version}.json"
            if not path.exists():
                continue
            result = json.loads(path.read_text())
            (r,) = result["runs"]
            c = r["counts"]
            cells = " | ".join(str(c[k]) for k in COLUMNS)
            lines.append(f"| {library} ({r['design']}) | {version} | {cells} | {c['kills']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("run", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    if argv[0] == "run":
        wp = argv[argv.index("--worker-python") + 1] if "--worker-python" in argv else None
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else []
        run(out, wp, only)
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
