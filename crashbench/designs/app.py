"""The user's own app under a library adapter ([app]; `--app`, `--task`, `--payloads`, `--check`).

A library adapter runs crashbench's handler (crashbench.designs.handler) unless the scenario names an
app: then it loads the user's app (`module:attr`, imported from the current directory as the
library's own CLI would), points it at the run's server and nothing else, enqueues the user's task
through the library's own API with one payload per job, and writes the ledger from the library's own
hooks (Celery's signals, an RQ worker class, ...: `started`, `ended`, `failed` below), never from the
user's code. A job's identity is the library's own id, which the adapter sets from crashbench's at
enqueue (the run's token then the job number: crashbench.jobids), so a hook tells crashbench's jobs
from any other task the app runs.

Payloads: `--payloads FILE.jsonl` (line n is job n's payload) or `--payloads module:function` (called
with the job number). A payload that is a JSON object is the task's keyword arguments, a list its
positional arguments, anything else its one argument; without `--payloads`, the job number is.

`--check module:function` is the user's own evidence: called with each job's payload after the run, it
answers how many times the job's effect exists in the user's system of record (an int; True counts
as 1, False as 0). crashbench.run.effects records the answers; crashbench.evidence.effects counts them.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crashbench.designs.handler import context
from crashbench.errors import UsageError
from crashbench.jobids import TOKEN_LEN, is_token
from crashbench.model import hostclock
from crashbench.model.queue import Job

if TYPE_CHECKING:
    from crashbench.control.interpreter import WorkerPython

MAX_PAYLOAD_BYTES = 1_000_000  # one payload; a queue message of more is a workload nobody runs by mistake


def importable(spec: str, what: str) -> Any:
    """The object `module:attr` names, imported from the current directory first as a library's CLI
    does; one clear line (UsageError) for anything wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{what} {spec!r} is not module:attribute", hint="e.g. --app orders.tasks:app")
    module = import_module(module_name, what)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def import_module(name: str, what: str) -> Any:
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except Exception as exc:  # any failure of user code at import is a usage problem, said in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"cannot import {what} module {name!r}: {type(exc).__name__}: {first}") from None


def ours(task_id: str) -> bool:
    """Whether a library's task id is one of crashbench's jobs (its run token, then the job)."""
    return len(task_id) > TOKEN_LEN and is_token(task_id[:TOKEN_LEN])


def arguments(job: Job) -> tuple[list[Any], dict[str, Any]]:
    """A job's payload (JSON: crashbench.run.effects puts the user's there) as the task's (args, kwargs):
    an object is keywords, a list positions, anything else the one argument."""
    payload = json.loads(job.payload)
    if isinstance(payload, dict):
        return [], dict(payload)
    if isinstance(payload, list):
        return list(payload), {}
    return [payload], {}


class Payloads:
    """Each job's payload, by job number: from a JSONL file, a user function, or the number itself."""

    def __init__(self, source: str, jobs: int) -> None:
        self.source = source
        self.fn: Callable[[int], Any] | None = None
        self.lines: list[Any] | None = None
        self.texts: list[str] | None = None  # the lines' payloads as JSON, encoded once as they were read
        if not source:
            return
        if source.endswith((".jsonl", ".json", ".ndjson")) or os.sep in source or ":" not in source:
            self.lines, self.texts = _read_jsonl(Path(source), jobs)
        else:
            fn = importable(source, "payloads")
            if not callable(fn):
                raise UsageError(f"payloads {source!r} is not a function (give module:function, or a .jsonl file)")
            self.fn = fn

    def payload(self, n: int) -> Any:
        if self.lines is not None:
            return self.lines[n]
        if self.fn is None:
            return n
        try:
            return self.fn(n)
        except Exception as exc:
            raise UsageError(f"payloads {self.source}({n}) raised {type(exc).__name__}: {exc}") from None

    def text(self, n: int) -> str:
        """Job n's payload as the JSON the job carries; one line when it does not serialize."""
        if self.texts is not None:
            return self.texts[n]
        return encoded(self.payload(n), f"payloads {self.source or '(the job numbers)'}({n})")


def encoded(value: Any, where: str) -> str:
    """A payload as JSON, the form every library here can carry; one line when it is not serializable."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: the payload does not serialize to JSON: {exc}") from None
    if len(text) > MAX_PAYLOAD_BYTES:
        raise UsageError(f"{where}: the payload is {len(text):,} bytes (at most {MAX_PAYLOAD_BYTES:,})")
    return text


def _read_jsonl(path: Path, jobs: int) -> tuple[list[Any], list[str]]:
    """The first `jobs` payloads of a JSONL file, as values and as JSON (each checked to serialize)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read payloads {path}: {exc}") from None
    out: list[Any] = []
    texts: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise UsageError(f"payloads {path}, line {number}: not JSON ({exc})") from None
        texts.append(encoded(out[-1], f"payloads {path}, line {number}"))
        if len(out) == jobs:
            break
    if len(out) < jobs:
        raise UsageError(
            f"payloads {path} has {len(out)} payload(s) for {jobs} jobs", hint=f"give --jobs {len(out)} or more lines"
        )
    return out, texts


def check_function(spec: str) -> Callable[[Any], Any]:
    fn = importable(spec, "check")
    if not callable(fn):
        raise UsageError(f"check {spec!r} is not a function (give module:function)")
    return fn


def effect_count(value: Any, spec: str, n: int) -> int:
    """The check's answer as a count: an int of 0 or more, or a bool."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    raise UsageError(f"check {spec} answered {value!r:.60} for job {n}: it must return a count (an int >= 0) or a bool")


# -- the ledger, from a library's own hooks (in the worker's processes) -----------------------------------


def started(task_id: str, xid: int | None = None) -> None:
    """A library hook saw crashbench's job `task_id` start (its handler, the user's task, begins).
    `xid`: the ledger's execution context, where the hook's thread is not it (`Contexts`)."""
    if ours(task_id):
        _ledger().start(task_id, hostclock.now(), xid)


def ended(task_id: str, xid: int | None = None) -> None:
    """... the task returned."""
    if ours(task_id):
        _ledger().end(task_id, hostclock.now(), xid)


def failed(task_id: str, xid: int | None = None) -> None:
    """... the task raised (or the library gave up on it): a failed attempt, as the handler's."""
    if ours(task_id):
        _ledger().fail(task_id, hostclock.now(), xid)


class Contexts:
    """The ledger's execution contexts for a worker that runs many jobs on one thread (an asyncio
    library's hooks all run on its event loop): the ledger pairs a start with its end by process and
    context, so each running job holds a context number of its own, given back when it ends. Small
    numbers, reused: never a thread's id, and no more of them than jobs ever ran at once."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.held: dict[str, list[int]] = {}
        self.made = 0

    def started(self, task_id: str) -> None:
        if not ours(task_id):
            return
        if self.free:
            xid = self.free.pop()
        else:
            self.made += 1
            xid = self.made
        self.held.setdefault(task_id, []).append(xid)
        started(task_id, xid)

    def ended(self, task_id: str, ok: bool) -> None:
        """The job's run ended: `ok`, it returned; else it raised, was cancelled or given up on."""
        xids = self.held.get(task_id)
        if not xids:  # not ours, or its start was not seen
            return
        xid = xids.pop(0)
        if not xids:
            del self.held[task_id]
        (ended if ok else failed)(task_id, xid)
        self.free.append(xid)


# -- the user's app where the workers run (their interpreter: --worker-python) --------------------------


_probed: dict[tuple[str, ...], dict[str, Any]] = {}


def probe(python: WorkerPython | None, target: str, *args: str) -> dict[str, Any]:
    """`target(*args)` (module:function, a JSON object back) where the workers import the user's app:
    under `python` (--worker-python: the harness may not have the library, arq's or saq's, that the
    app's module imports), else in this process. Its UsageError is this one's, in one line; asked
    once per process for the same question."""
    key = (python.python if python else "", target, *args)
    if key in _probed:
        return _probed[key]
    if python is None:
        answer = importable(target, "probe")(*args)
    else:
        code = "from crashbench.designs.app import probe_main; probe_main()"
        try:
            done = subprocess.run(
                [python.python, "-c", code, target, *args], env=python.env(), capture_output=True, text=True,
                timeout=PROBE_TIMEOUT,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"--worker-python {python.python}: cannot load the app there ({exc})") from None
        last = (done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode == 2 and last.startswith(PROBE_REFUSED):
            refused = json.loads(last.removeprefix(PROBE_REFUSED))
            raise UsageError(refused["message"], hint=refused["hint"])
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UsageError(f"--worker-python {python.python} cannot load the app: {why}")
        answer = json.loads(last)
    _probed[key] = answer
    return answer


PROBE_TIMEOUT = 60.0
PROBE_REFUSED = "crashbench-usage: "


def probe_main() -> None:
    """`probe`'s other side, in the workers' interpreter: argv is the target and its arguments."""
    target, *args = sys.argv[1:]
    try:
        answer = importable(target, "probe")(*args)
    except UsageError as exc:
        print(PROBE_REFUSED + json.dumps({"message": exc.message, "hint": exc.hint}))
        sys.exit(2)
    print(json.dumps(answer))


def _ledger() -> Any:
    return context()[0]  # the handler's per-process ledger writer
