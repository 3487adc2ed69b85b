"""The evidence: the harness's own reading of Redis, and the counts, checks and checkers that turn a
run's history (crashbench.model.timeline) into its results."""
