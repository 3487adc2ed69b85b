"""The `crashbench` console script and `python -m crashbench`: SIGTERM is an interruption like
Ctrl-C from the first instruction on, so that either one, at any moment (while the command line
still imports, parses, or writes its result), ends in exit 130 and never in a traceback or a death by
signal. Imports nothing until the handler is in place."""

from __future__ import annotations

import signal
import sys
from types import FrameType

INTERRUPTED = 130  # crashbench.errors.ExitCode.INTERRUPTED, not imported: this module runs first


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        from crashbench.cli import main as cli_main
    except KeyboardInterrupt:
        print("crashbench: error: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    cli_main()
