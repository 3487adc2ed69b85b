"""docs/reference.md, generated from the code: every command and option (click's own help records),
every scenario key with its default and what it accepts (crashbench.scenario), every fault family's
kinds and keys (crashbench.faults.registry), every count with its
definition (the comments of crashbench.model.counts.Counts) and every exit code (crashbench.errors).

`make reference` writes it (python -m crashbench.cli.reference docs/reference.md); tests/test_docs.py
fails when the committed file is not what this makes from today's code."""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import click

from crashbench.cli import cli
from crashbench.cli.overrides import OVERRIDES
from crashbench.designs import Design
from crashbench.errors import ExitCode
from crashbench.evidence import tally
from crashbench.evidence.checker import Checker
from crashbench.faults import registry
from crashbench.model.counts import Counts
from crashbench.model.sections import FIELDS, SECTION_RECORDS
from crashbench.scenario.settings import CHOICES, NUMBERS, SECTIONS

HEADER = """\
# Reference

Generated from the code by `make reference` (`crashbench/cli/reference.py`); `tests/test_docs.py` fails
when this file is stale. Do not edit it by hand: change the help text or the comment in the code.
"""
# Options every crash command takes (run, compare, sweep, check): listed once.
CRASH_COMMANDS = ("run", "compare", "sweep", "check")


def field_comments(cls: type) -> list[tuple[str, str]]:
    """The fields of dataclass `cls` in order, each as ("`name`", its line's comment), with each block of
    comments above a field as a row of its own ("", the block): the source's words ("..." continues the
    field above)."""
    lines, _ = inspect.getsourcelines(cls)
    source = "".join(lines)
    comment_at = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    names = {f.name for f in dataclasses.fields(cls)}
    rows: list[tuple[str, str]] = []
    block: list[str] = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0]
        if stripped.startswith("#"):
            if not comment_at.get(number, "").startswith("fmt:"):
                block.append(comment_at.get(number, ""))
            continue
        if block and (not stripped or name in names):
            rows.append(("", " ".join(block)))
        block = []
        if name in names and line.startswith("    ") and not line.startswith("     "):
            rows.append((f"`{name}`", comment_at.get(number, "")))
    return rows


def member_comments(cls: type) -> dict[str, str]:
    """Each member of enum `cls` and its comment, on its line or just above it."""
    lines, _ = inspect.getsourcelines(cls)
    found: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        code, _, comment = line.partition("#")
        name = code.split("=", 1)[0].strip()
        if not code.strip():
            above.append(comment.strip())
        elif name in cls.__members__:
            found[name] = " ".join([*above, comment.strip()]).strip()
            above = []
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _options(command: click.Command, skip: set[str]) -> Iterator[str]:
    ctx = click.Context(command, info_name=command.name)
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or param.name in skip or "--help" in param.opts:
            continue
        flags, text = record
        yield f"| `{_cell(flags)}` | {_cell(text)} |"


def commands() -> Iterator[str]:
    yield "## Commands\n"
    yield _cell(cli.help or "") + "\n"
    by_name = {name: cli.commands[name] for name in sorted(cli.commands)}
    shared = set.intersection(*({p.name for p in by_name[c].params} for c in CRASH_COMMANDS))
    for name, command in by_name.items():
        ctx = click.Context(command, info_name=f"crashbench {name}")
        yield f"### `crashbench {name}`\n"
        yield f"`{_cell(command.get_usage(ctx).removeprefix('Usage: '))}`\n"
        yield inspect.cleandoc(command.help or "").replace("\b\n", "") + "\n"
        if name in CRASH_COMMANDS:
            yield "Takes [the options of every crash command](#options-of-every-crash-command), and:\n"
        rows = list(_options(command, shared if name in CRASH_COMMANDS else set()))
        if rows:
            yield "| Option | What it does |\n|---|---|"
            yield from rows
            yield ""
    yield "### Options of every crash command\n"
    yield f"`{'`, `'.join(CRASH_COMMANDS)}` all take these (each scenario override names the key it sets).\n"
    yield "| Option | What it does |\n|---|---|"
    yield from _options(by_name["run"], {p.name for p in by_name["run"].params} - shared)
    yield ""


def scenario_keys() -> Iterator[str]:
    yield "## Scenario keys\n"
    yield "A scenario is a TOML file; each key sits in its section. Defaults are `crashbench.model.spec.Scenario`'s.\n"
    described = {field: re.sub(r"\s*\([a-z]+\.[a-z_]+\)\.?$", "", text) for _, field, _, text in OVERRIDES}
    records = SECTION_RECORDS.values()
    comments = {name.strip("`"): text for record in records for name, text in field_comments(record) if name}
    defaults = {name: f.default for name, f in FIELDS.items()}
    for section, names in SECTIONS.items():
        yield f"### `[{section}]`\n"
        yield "| Key | Default | Accepts | What it sets |\n|---|---|---|---|"
        for name in names:
            default = defaults.get(name)
            accepts = NUMBERS[name].wanted() if name in NUMBERS else ""
            if name in CHOICES:
                accepts = "one of " + ", ".join(f"`{c}`" for c in CHOICES[name])
            text = described.get(name) or comments.get(name, "")
            shown = "(the design's own)" if default is None else f"`{default!r}`" if default != () else "all built-in"
            yield f"| `{name}` | {shown} | {_cell(accepts)} | {_cell(text)} |"
        yield ""


def class_attributes(cls: type) -> list[tuple[str, str]]:
    """The `NAME: ClassVar[...] = value` lines of `cls`'s own body and the comments just above each."""
    lines, _ = inspect.getsourcelines(cls)
    rows: list[tuple[str, str]] = []
    block: list[str] = []
    previous = False
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"^    (\w+): ClassVar\[.*?\]( = .*?)?(?:  # (.*))?$", line.rstrip())
        if m:
            text = " ".join([*block, m[3] or ""]).strip()
            follows = rows and not block and not m[3] and previous  # one comment over a run of attributes
            rows.append((f"`{m[1]}{m[2] or ''}`", "(as above)" if follows else text))
        previous, block = bool(m), []
    return rows


def _signature(fn: object) -> str:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    params = [p for p in sig.parameters.values() if p.name != "self"]
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    shown = ", ".join(
        star.get(p.kind, "") + (f"{p.name}: {p.annotation}" if p.annotation is not p.empty else p.name) for p in params
    )
    ret = sig.return_annotation
    return f"({shown})" + (f" -> {ret}" if ret is not sig.empty else "")


def design_interface() -> Iterator[str]:
    yield "## The Design interface\n"
    yield (
        "`crashbench.designs.Design`, what `--design package.module:Class` loads "
        "([your own design](how-to/your-own-design.md)). Required: the abstract methods; the rest have defaults.\n"
    )
    yield "| Method | Required | What it does |\n|---|---|---|"
    for name, member in Design.__dict__.items():
        if not inspect.isfunction(member) or (name.startswith("_") and name != "__init__"):
            continue
        doc = (inspect.getdoc(member) or "").split("\n\n", 1)[0]
        required = "yes" if getattr(member, "__isabstractmethod__", False) else ""
        yield f"| `{name}{_cell(_signature(member))}` | {required} | {_cell(doc)} |"
    yield ""
    yield "| Class attribute | What it declares |\n|---|---|"
    for name, text in class_attributes(Design):
        yield f"| {_cell(name)} | {_cell(text)} |"
    yield ""


def fault_families() -> Iterator[str]:
    yield "## Fault families\n"
    yield (
        "Each `[[faults]]` entry belongs to the family of its `kind` (`crashbench.faults.registry`). A family's "
        "checkers run after the core ones (" + ", ".join(f"`{c.name}`" for c in tally.CHECKERS) + ") and give "
        "its section of the result.\n"
    )
    yield "| Family | Kinds | Keys | What it does | Its checkers |\n|---|---|---|---|---|"
    for f in registry.FAMILIES:
        kinds = ", ".join(f"`{k}`" for k in f.kinds)
        checks = "; ".join(f"`{c.name}`: {_first_sentence(c)}" for c in f.checkers) or "-"
        yield f"| `{f.name}` | {kinds} | {', '.join(f'`{k}`' for k in f.keys)} | {_cell(f.summary)} | {_cell(checks)} |"
    yield ""


def _first_sentence(c: Checker) -> str:
    """A checker's docstring's first sentence (a function checker's is its function's)."""
    doc = " ".join((getattr(c, "fn", c).__doc__ or "").split())
    return doc.split(". ")[0].rstrip(".")


def counts() -> Iterator[str]:
    yield "## Counts\n"
    yield "Every count of a run (`crashbench.model.counts.Counts`), as a result file and a threshold name it.\n"
    yield "| Count | Definition |\n|---|---|"
    for name, text in field_comments(Counts):
        yield f"| {name} | {_cell(text)} |" if name else f"| | *{_cell(text)}* |"
    yield ""


def exit_codes() -> Iterator[str]:
    yield "## Exit codes\n"
    yield "| Code | Name | When |\n|---|---|---|"
    comments = member_comments(ExitCode)
    for code in ExitCode:
        yield f"| {int(code)} | `{code.name}` | {_cell(comments.get(code.name, ''))} |"
    yield ""


def render() -> str:
    parts = [HEADER, *commands(), *scenario_keys(), *fault_families(), *design_interface(), *counts(), *exit_codes()]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str]) -> None:
    """Write the reference to the file named in argv[1], else to stdout."""
    text = render()
    if len(argv) > 1:
        Path(argv[1]).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
