"""The command line: parse options, call the core (crashbench.run.session), render. Nothing else.

`common` holds what every command shares; each other module registers its commands on `common.cli`
when imported here."""

from __future__ import annotations

import sys

from crashbench.cli import bench, clean, crash, gate, merge, store  # noqa: F401 - each registers its commands
from crashbench.cli.common import cli as cli
from crashbench.cli.common import fail


def main() -> None:
    sys.exit(int(gate.run_cli(cli, fail)))
