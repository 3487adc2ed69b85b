"""The workers' harness of one design under one key prefix, which a crash run (crashbench.run.runner)
and `crashbench bench` (crashbench.bench) both stand on: the design (the harness's own instance, on
its own client), the spec every worker gets (crashbench.run.worker.WorkerSpec), a work directory with
the ledger (crashbench.model.ledger) and the workers' logs, and the supervisor that forks the workers
(crashbench.control.supervisor). `stop` stops every worker; `close` releases the rest and removes the
directory, or marks it kept.

Layout of the directory: ledger/ (one file per worker), logs/ (one per worker, and the zygote's),
worker.json (the spec, for workers under --worker-python) and, for bench's bare loop, NAME.bare.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from crashbench.control import connect, memlimit, pidns, sshworker, workdirs
from crashbench.control.interpreter import WORKER_MODULE, WorkerPython
from crashbench.control.server import cleanup_keys
from crashbench.control.sshworker import RemoteSlot
from crashbench.control.supervisor import Supervisor
from crashbench.designs import Design, LibraryDesign, check_app, load_design
from crashbench.model.ledger import Ledger
from crashbench.model.queue import DesignSettings
from crashbench.model.workload import Workload
from crashbench.run.worker import WorkerSpec, run_bare, run_worker


def _no_url(slot: int) -> str | None:
    return None


def _stay(slot: int) -> None:
    return None


def _no_env(slot: int) -> dict[str, str]:
    return {}


def _no_ns(slot: int) -> int | None:
    return None


def _here(slot: int) -> RemoteSlot | None:
    return None


@dataclass(frozen=True, slots=True)
class Workers:
    """How the harness starts its workers, beyond the design, its settings and the workload."""

    url: Callable[[int], str | None] = _no_url  # a slot's own URL (through a proxy, from a namespace), or None
    enter: Callable[[int], None] = _stay  # in the forked worker, before it connects (a slot's namespace)
    # exec this interpreter instead of running the loop (--worker-python); a design with a worker_module
    # execs crashbench's own without it
    python: WorkerPython | None = None
    url_file: str | None = None  # with a broker fault: where the current server's URL is (failover)
    url_file_of: Callable[[int], str | None] = _no_url  # a slot's own url file (a split brain's minority), or None
    tree: bool = True  # a library's worker: signals reach the processes below it (Supervisor's `tree`)
    # A slot's own environment (a preloaded library: crashbench.faults.clock), "{dir}" in a value standing
    # for the work directory; a slot that has one is exec'd into a fresh interpreter, where LD_PRELOAD
    # takes effect. `fresh`: some slot has one (the interpreter's link directory is made up front).
    env: Callable[[int], dict[str, str]] = _no_env
    fresh: bool = False
    # A slot's PID namespace (a host's, crashbench.faults.hosts), or None: the runner's own. Read at each
    # start: a host's replacement starts on it, in the namespace it has then (a rebooted host's new one).
    pidns: Callable[[int], int | None] = _no_ns
    # A slot on a host over SSH (crashbench.faults.hosts.ssh): its worker runs there, and here runs its stub
    # (crashbench.control.sshworker), which mirrors it; None: the slot's worker runs here.
    remote: Callable[[int], RemoteSlot | None] = _here


class Harness:
    """One design's workers, their ledger and their directory. `bare` and `gate` say what the next
    workers forked from this process run (bench's bare loop; a pipe they wait on after READY); a worker
    from the zygote (`sup.start_zygote`) takes them as they were when the zygote started."""

    def __init__(
        self,
        kind: str,  # the work directory's kind (crashbench.control.workdirs): "run", "bench"
        spec: str,  # the design's spec, as load_design takes it
        url: str,
        prefix: str,
        settings: DesignSettings,
        workload: Workload,
        clock: Callable[[], float] = time.monotonic,
        workers: Workers = Workers(),
    ) -> None:
        self.cls: type[Design] = load_design(spec)
        check_app(self.cls, spec, settings)
        self.url, self.prefix, self.settings = url, prefix, settings
        self.client = connect.connect(url, decode_responses=True)
        self.design: Design = self.cls(self.client, prefix, settings)
        self.workers = workers
        self._load_app()
        self.wspec = WorkerSpec(url, self.cls, prefix, settings, workload, url_file=workers.url_file)
        self.bare = False
        self.gate: int | None = None
        self.dir = workdirs.make(kind, memory=True)
        (self.dir / "logs").mkdir()
        (self.dir / "ledger").mkdir()
        self.python = workers.python or self._own_python()
        self.fresh = self.python or (self._fresh_python() if workers.fresh else None)
        self.module = self.cls.worker_module or WORKER_MODULE
        self.ledger = Ledger(self.dir / "ledger")
        self.spec_file = self.dir / "worker.json"
        self.spec_file.write_text(self.wspec.to_json(spec))
        self.spec = spec
        self.parent = os.getpid()
        if workload.crash_rate and workload.crash_how == "memory":
            memlimit.choice()  # which memory limit the workers use (a cgroup v1's probe): once, before any fork
        tree = workers.tree and self.cls.own_worker
        self.sup = Supervisor(
            self._prepare, self.dir / "logs", clock, tree=tree, register=self._register, place=workers.pidns,
            control=self._control,
        )  # fmt: skip

    def _control(self, name: str, slot: int) -> Path | None:
        """The socket the stub of a worker over SSH takes its signals on; None for a worker here."""
        return self.dir / "logs" / f"{name}.sock" if self.workers.remote(slot) is not None else None

    def _own_python(self) -> WorkerPython | None:
        """For a design whose worker starts in a fresh interpreter (Design.worker_module, gevent's):
        crashbench's own, when no --worker-python gives another."""
        return self._fresh_python() if self.cls.worker_module else None

    def _fresh_python(self) -> WorkerPython:
        """crashbench's own interpreter, for the slots exec'd only for an environment of their own."""
        (path_dir := self.dir / "python").mkdir()
        python = WorkerPython(sys.executable, path_dir)
        python.redis_url = self.url
        return python

    def _register(self, name: str, slot: int) -> None:
        """In this process, before each fork: the new worker's ledger file is read from now on."""
        if not self.bare:
            self.ledger.path_for(name)

    def _prepare(self, name: str, slot: int) -> Callable[[], int]:
        """The worker's body, made where the worker is forked: it registers nothing (see Supervisor)."""
        url, parent, gate, workers, module = self.workers.url(slot), self.parent, self.gate, self.workers, self.module
        if workers.pidns(slot) is not None:  # its parent, this process, is outside its namespace
            parent = pidns.OUTSIDE
        wspec = dataclasses.replace(self.wspec, redis_url=url) if url else self.wspec
        if (own := workers.url_file_of(slot)) is not None:
            wspec = dataclasses.replace(wspec, url_file=own)
        if self.bare:
            out = self.dir / f"{name}.bare"
            return lambda: run_bare(wspec, name, out, parent, gate)
        path, spec_file, python = self.ledger.path_of(name), self.spec_file, self.python
        if (remote := workers.remote(slot)) is not None:
            spec, real, control = wspec.to_json(self.spec), wspec.redis_url, self._control(name, slot)
            return lambda: sshworker.run(remote, name, spec, real, path, control)  # type: ignore[arg-type]
        extra = {k: v.replace("{dir}", str(self.dir)) for k, v in workers.env(slot).items()}
        if extra:
            python = self.fresh

        def worker() -> int:  # in the forked child
            workers.enter(slot)
            if (wp := python) is not None:
                argv = wp.argv(str(spec_file), name, str(path), str(parent), module=module)
                os.execve(wp.python, argv, {**wp.env(url), **extra})
            return run_worker(wspec, name, path, parent, gate)

        return worker

    def reconnect(self, url: str) -> None:
        """The harness's client and design on another server (a failover's promoted replica)."""
        self.client.close()
        self.url = url
        self.client = connect.connect(url, decode_responses=True)
        self.design = self.cls(self.client, self.prefix, self.settings)
        self._load_app()

    def _load_app(self) -> None:
        """The user's app, where the workers can import it (LibraryDesign.load_app)."""
        if self.settings.task and isinstance(self.design, LibraryDesign):
            self.design.load_app(self.workers.python)

    def stop(self, grace: float) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after `grace` s), and the zygote."""
        self.sup.stop_all(grace=grace)

    def close(self, keep: bool = False, clean_keys: bool = False) -> None:
        """After `stop`: close the ledger and the client, delete the prefix's keys (`clean_keys`), and
        remove the directory, or, with `keep`, mark it kept (the next orphan sweep leaves it alone)."""
        try:
            self.ledger.close()
            if clean_keys:
                with contextlib.suppress(redis.RedisError):
                    cleanup_keys(self.url, self.prefix)
            self.client.close()
        finally:
            memlimit.remove_cgroups()  # a memory crash's cgroups (crashbench.control.memlimit), if any
            if not keep:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:
                workdirs.keep(self.dir)
