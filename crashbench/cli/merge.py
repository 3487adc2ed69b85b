"""The merge command: the results of `--shard K/N` runs put together (crashbench.report.merge)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from crashbench.cli import common
from crashbench.errors import UsageError
from crashbench.report import merge as merging
from crashbench.report import store


@common.cli.command()
@click.argument("shards", nargs=-1, required=True, metavar="SHARD...")
@click.option(
    "--baseline",
    metavar="FILE|ID",
    help="The baseline the shards were checked against, for their relative thresholds. "
    "[default: found by its id beside the shards, else in --dir]",
)
@click.option(
    "--allow-unchecked",
    is_flag=True,
    help="Shards of check: pass a design no threshold applied to (by default that is no verdict: exit 4).",
)
@common.OUT
@common.STORE_DIR
@common.output_options
@common.reports_errors
def merge(shards: tuple[str, ...], baseline: str | None, store_dir: Path, **opts: Any) -> None:
    """Put the results of `compare`, `sweep` or `check --shard K/N` runs (each a file, or a directory
    holding them, searched with its subdirectories) together into the result the unsharded run gives:
    every run in its order, with its timeline, every threshold evaluated again over all of them; saved
    to --out, shown, and exported as a run's. Refused (exit 2) unless it has every shard of one plan
    exactly once (a missing or repeated shard, shards of different plans, a file that is not a readable
    shard result); exit 4 when a shard's runs are not what its own timeline gives. Otherwise the exit
    code is its status's, as the run's would be (check's gate for shards of check)."""
    common.prepare(opts, None)
    base = store.load(baseline, store_dir) if baseline else None
    result = merging.merge(shards, store_dir, base)
    try:
        path = result.write(opts["out_path"])
    except OSError as exc:
        raise UsageError(f"cannot write the result to {opts['out_path']}: {exc.strerror}") from None
    common.report(result, opts, saved=path, gate=result.kind == "check")
