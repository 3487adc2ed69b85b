"""A design that counts, in its own worker, every command it sends, so a bench's server-side count can
be checked against it exactly."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from crashbench.designs.naive import NaiveQueue


class CountingNaive(NaiveQueue):
    """The naive queue; its worker counts each command once the server has answered it and writes the
    counts to $CRASHBENCH_TEST_COUNTS/<worker>.json on a graceful stop."""

    name = "counting-naive"

    def start_worker(self, worker: str, now: float) -> None:
        super().start_worker(worker, now)
        self.sent: Counter[str] = Counter()
        send = self.r.execute_command

        def counted(*args: Any, **options: Any) -> Any:
            try:
                return send(*args, **options)
            finally:
                self.sent[str(args[0]).lower()] += 1

        self.r.execute_command = counted  # type: ignore[method-assign]

    def stop_worker(self, worker: str, now: float) -> None:
        super().stop_worker(worker, now)
        Path(os.environ["CRASHBENCH_TEST_COUNTS"], f"{worker}.json").write_text(json.dumps(self.sent))
