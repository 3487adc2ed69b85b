"""The evidence: ledgers, the harness's reading of Redis, the timeline, the counts computed from them."""
