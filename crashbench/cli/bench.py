"""The bench command: throughput and cost without faults (crashbench.bench)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from crashbench.bench import BenchSettings, run_bench
from crashbench.cli import common as base
from crashbench.cli.overrides import FiniteFloat
from crashbench.errors import UsageError
from crashbench.report import store
from crashbench.report.render import bench_tables


def int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{option} {text!r}: write whole numbers separated by commas, like 1,2,4,8") from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} {text!r}: at least one value, each >= 1")
    return values


@base.cli.command()
@click.option(
    "--designs", default="naive,reliable,stream", show_default=True, metavar="A,B,...", help="Designs to measure."
)
@click.option(
    "--workers", "workers_text", default="1,2,4,8", show_default=True, metavar="N,N,...", help="Worker counts."
)
@click.option(
    "--jobs", type=click.IntRange(min=1), default=BenchSettings().jobs, show_default=True, help="Jobs per measurement."
)
@click.option(
    "--job-ms", type=FiniteFloat(min=0), default=0.0, show_default=True, help="Handler duration; 0 = no-op jobs."
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Measurements per design and worker count.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Jobs per round trip for the batching designs.",
)
@click.option(
    "--shards",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Shards of the sharded design; 0 = one per primary of a cluster, 1 on one server.",
)
@click.option(
    "--memory-jobs",
    type=click.IntRange(min=0),
    default=100_000,
    show_default=True,
    help="Backlog size the memory per 1M queued jobs is measured on; 0 = skip.",
)
@click.option(
    "--proxy",
    is_flag=True,
    help="Also measure the network fault proxy's cost with no toxic on: reliable's jobs/s, 4 workers, direct and through it, 0 and 10 ms jobs.",
)
@base.REDIS_URL
@base.SERVER
@base.CLUSTER
@base.CLUSTER_REPLICAS
@base.OUT
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the tables.")
@click.option("--plain", is_flag=True, help="ASCII tables, no colours.")
@base.reports_errors
def bench(
    designs: str,
    workers_text: str,
    jobs: int,
    job_ms: float,
    repeat: int,
    batch_size: int,
    shards: int,
    memory_jobs: int,
    proxy: bool,
    redis_url: str | None,
    server_binary: str | None,
    cluster: int | None,
    cluster_replicas: int | None,
    out_path: Path,
    as_json: bool,
    plain: bool,
) -> None:
    """Throughput and cost of each design without faults: jobs/s against a bare loop of the design's own
    commands, enqueue rate, latency, Redis commands per job, CPU, server memory, worker restart time;
    with --proxy, what the network fault proxy costs the workers with no toxic on. On a cluster (--cluster
    N, or its URL) the commands are summed over its primaries, and the server's CPU and memory left out."""
    base.configure_output({"plain": plain})
    names = tuple(d.strip() for d in designs.split(",") if d.strip())
    if not names:
        raise UsageError("--designs is empty")
    store.check_out(out_path)  # before the run, not after minutes of measuring
    settings = BenchSettings(
        names, int_list(workers_text, "--workers"), jobs, job_ms, repeat, batch_size=batch_size,
        memory_jobs=memory_jobs, proxy=proxy, shards=shards,
    )  # fmt: skip
    on_cluster = base.cluster_option({"cluster": cluster, "cluster_replicas": cluster_replicas})
    show = (
        (lambda line: base.err.print(f"[dim]{line}[/]", highlight=False))
        if base.err.is_terminal and not as_json
        else (lambda _: None)
    )
    # Its own stop flag: Ctrl-C, SIGTERM -> 130.
    result = run_bench(settings, redis_url, server_binary, show, on_cluster)
    try:
        path = result.write(out_path)
    except OSError as exc:
        raise UsageError(f"cannot write the result to {out_path}: {exc.strerror}") from None
    if as_json:
        click.echo(result.to_json())
    else:
        base.out.print(bench_tables(result, plain=plain))
        base.out.print(f"[dim]result: {escape(str(path))}[/]", highlight=False, soft_wrap=True)  # never cut or split
