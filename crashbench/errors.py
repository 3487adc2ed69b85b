"""Exit codes and the errors that map onto them.

Every way crashbench can end is one member of `ExitCode`; the README's table lists the
same names. Core modules raise `CrashbenchError` subclasses; only the CLI turns them into an exit.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every threshold met
    THRESHOLD_VIOLATED = 1  # the runs finished and at least one threshold was violated; nothing else exits 1
    USAGE = 2  # bad option, bad scenario file, unknown design, a threshold naming a design not in the run
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
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}" if tb else "?"
        kept = f"; ledgers and worker logs kept in {workdir}" if workdir else ""
        return cls(f"{during}: {type(exc).__name__}: {exc}\n  at {where}{kept}")
