"""The stream design as it was before its consumer cleanup: every consumer name a worker ever used stays
in the group. The control for the cleanup's tests and for the README's consumer-churn table."""

from __future__ import annotations

from crashbench.designs.stream import StreamQueue


class StreamKeepsConsumers(StreamQueue):
    name = "stream-keeps-consumers"
    PRUNE_CONSUMERS = False
