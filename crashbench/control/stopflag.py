"""The stop flag: SIGINT / SIGTERM only set it; the runner's main loop reads it and stops in order."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class StopFlag:
    """SIGINT/SIGTERM set a flag for the main loop; a second one interrupts at once, and further ones
    are ignored until the flag is uninstalled, so that they cannot cut short the cleanup it starts."""

    def __init__(self) -> None:
        self.raised = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raised:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)
            raise KeyboardInterrupt
        self.raised = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
