"""The gate's verdict on the command line: the exit code a result's status gives, and, on stderr, why a
result has no verdict (evidence problems, designs no threshold applied to).

Exit 1 means a threshold was violated and nothing else, so a CI job can tell "the design regressed"
from "crashbench could not tell".
"""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import Console
from rich.markup import escape

from crashbench.errors import CrashbenchError, ExitCode, Interrupted
from crashbench.model.results import Result
from crashbench.model.results import label as label_of
from crashbench.model.thresholds import unchecked
from crashbench.report.recount import NOT_REPRODUCED, VERDICT_NOT_REPRODUCED

EXIT_FOR_STATUS = {
    "pass": ExitCode.OK,
    "fail": ExitCode.THRESHOLD_VIOLATED,
    "inconclusive": ExitCode.INCONCLUSIVE,
    "broken": ExitCode.INCONCLUSIVE,
    # Exploring (run, compare, sweep) without thresholds is normal; `check` turns this into
    # INCONCLUSIVE unless --allow-unchecked, since a gate that checked nothing must not pass.
    "unchecked": ExitCode.OK,
}


def exit_code(result: Result, allow_unchecked: bool) -> ExitCode:
    if result.status == "unchecked" and not allow_unchecked:
        return ExitCode.INCONCLUSIVE
    return EXIT_FOR_STATUS[result.status]


def explain(result: Result, err: Console, allow_unchecked: bool) -> None:
    """On stderr: every evidence problem with all its ids (the table shows the first ten), and the
    designs a gate that does not allow it found unchecked."""
    if result.problems:
        # A saved result its own record does not reproduce (crashbench.report.recount): the file, not
        # the design or crashbench, is what is wrong.
        edited = {p.check for p in result.problems} <= {NOT_REPRODUCED, VERDICT_NOT_REPRODUCED}
        why = (
            "the saved result is not what its own record gives (edited, or not saved whole)"
            if edited
            else "the evidence contradicts the counts (crashbench or the design's report is wrong)"
        )
        err.print(f"[bold red]crashbench: no verdict:[/] {why}", highlight=False)
        for run in result.runs:
            for p in run.problems:
                ids = f"\n      ids: {', '.join(p.ids)}" if p.ids else ""
                err.print(
                    escape(f"  - {label_of(run)} (seed {run.seed}) [{p.check}] {p.message}{ids}"), highlight=False
                )
    if result.status == "unchecked" and not allow_unchecked:
        names = ", ".join(unchecked(result))
        err.print(f"[bold red]crashbench: no verdict:[/] no threshold applied to {escape(names)}", highlight=False)
        hint = "add [expect.DESIGN] to the scenario or -t 'DESIGN: METRIC OP VALUE', or give --allow-unchecked"
        err.print("[dim]hint:[/] " + escape(hint), highlight=False)


def run_cli(group: click.Group, fail: Callable[[CrashbenchError], None]) -> ExitCode:
    """Run the command line and return its exit code (commands exit themselves, through `fail` or
    the gate). click's standalone mode would turn Ctrl-C outside a command (while parsing, importing)
    into "Aborted!" and exit 1, which means a threshold was violated: every interruption is 130."""
    try:
        code = group.main(standalone_mode=False)  # --help and --version return 0 here
    except (KeyboardInterrupt, click.Abort):
        fail(Interrupted("interrupted"))
        return ExitCode.INTERRUPTED  # not reached: fail exits
    except click.ClickException as exc:
        exc.show()
        return ExitCode.USAGE
    # click's own exits (--help, --version) return 0; any other code it returns is a usage problem
    return ExitCode.USAGE if code else ExitCode.OK
