"""crashbench: crash-test job-queue designs on Redis.

Kept import-free on purpose: every forked worker and every `python -m crashbench` pays for what
this module imports.
"""

__version__ = "0.1.0"
