"""Exit codes and the errors that map onto them.

Every way crashbench can end is one member of `ExitCode`; the README's table lists the
same names. Core modules raise `CrashbenchError` subclasses; only the CLI turns them into an exit.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0  # every threshold met
    THRESHOLD_VIOLATED = 1  # the runs finished and at least one threshold was violated; nothing else exits 1
    # bad option, bad scenario file, unknown design, a threshold naming a design not in the run, a design
    # that cannot run on the server given (a queue library on a cluster)
    USAGE = 2
    SERVER_UNAVAILABLE = 3  # cannot reach --redis-url, or no server binary to start
    # no verdict: a threshold without a value, or the evidence contradicts the counts (crashbench or the
    # design's report is wrong); for `check`, also a design no threshold applied to
    INCONCLUSIVE = 4
    UNEXPECTED = 5  # an unexpected error in a design or in crashbench: the message says where; workdir kept
    INTERRUPTED = 130  # Ctrl-C / SIGTERM; everything started was stopped


class CrashbenchError(Exception):
    """An error with a one-screen message and a documented exit code."""

    exit_code: ExitCode = ExitCode.INCONCLUSIVE

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(CrashbenchError):
    exit_code = ExitCode.USAGE


class ScenarioError(UsageError):
    """A scenario that cannot run; `problems` lists every problem found, not just the first."""

    def __init__(self, source: str, problems: list[str]) -> None:
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")
        self.problems = problems


class Unsupported(UsageError):
    """A design asked to run where it cannot: a queue library on a Redis Cluster."""


def unsupported_on_cluster(spec: str, exc: BaseException) -> Unsupported:
    """`spec` cannot run on a cluster, in one line: the library's own error (a crashbench error's last
    line, which for workers that died is the last line their log shows)."""
    if isinstance(exc, CrashbenchError):
        lines = [line.strip() for line in exc.message.splitlines() if line.strip()]
        why = lines[-1] if lines else type(exc).__name__
    else:
        why = _one_line(exc)
        # A library that wraps the server's answer in its own error (taskiq's SendTaskError): that answer too.
        cause = exc
        while (inner := cause.__cause__ or cause.__context__) is not None and inner is not cause:
            cause = inner
        if cause is not exc:
            why += f" ({_one_line(cause)})"
    return Unsupported(
        f"{spec}: unsupported on a cluster: {why}",
        hint="run it on a single server: leave out --cluster, or give --redis-url a server that is not a cluster node",
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class ServerUnavailable(CrashbenchError):
    exit_code = ExitCode.SERVER_UNAVAILABLE


class RunAborted(CrashbenchError):
    exit_code = ExitCode.INCONCLUSIVE


class RecountMismatch(CrashbenchError):
    """A saved result that its own timeline does not reproduce (crashbench recount)."""

    exit_code = ExitCode.INCONCLUSIVE


class Interrupted(CrashbenchError):
    exit_code = ExitCode.INTERRUPTED


class UnexpectedError(CrashbenchError):
    """Something raised that nothing expected (a design's method, a library, crashbench itself)."""

    exit_code = ExitCode.UNEXPECTED

    @classmethod
    def from_exception(cls, exc: BaseException, during: str, workdir: object = None) -> UnexpectedError:
        """The error, where it came from (the innermost frame) and where its evidence was kept."""
        tb, ours = exc.__traceback__, None
        while tb is not None and tb.tb_next is not None:
            if "/crashbench/" in tb.tb_frame.f_code.co_filename:
                ours = tb  # the innermost frame of crashbench's own: what called the library that raised
            tb = tb.tb_next

        def at(t: Any) -> str:
            return f"{t.tb_frame.f_code.co_filename}:{t.tb_lineno} in {t.tb_frame.f_code.co_name}"

        where = at(tb) if tb else "?"
        if ours is not None and ours is not tb and "/crashbench/" not in where:
            where += f", called from {at(ours)}"
        kept = f"; ledgers and worker logs kept in {workdir}" if workdir else ""
        return cls(f"{during}: {type(exc).__name__}: {exc}\n  at {where}{kept}")
