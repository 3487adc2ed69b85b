"""Exit codes and the errors that map onto them.

Every way crashbench can end is one member of `ExitCode`; the README's table lists the
same names. Core modules raise `CrashbenchError` subclasses; only the CLI turns them into an exit.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every threshold met
    THRESHOLD_VIOLATED = 1  # the runs finished and at least one threshold was violated
    USAGE = 2  # bad option, bad scenario file, unknown design
    SERVER_UNAVAILABLE = 3  # cannot reach --redis-url, or no server binary to start
    INCONCLUSIVE = 4  # no verdict: a threshold without a value, a run that did not drain, counts that do not add up
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


class Interrupted(CrashbenchError):
    exit_code = ExitCode.INTERRUPTED
