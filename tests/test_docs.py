"""The docs a reader walks: a short README, every link between the pages leading somewhere, and a
reference that is what the code says today (crashbench.cli.reference)."""

from __future__ import annotations

import re
from pathlib import Path

from crashbench.cli import reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings in code blocks
    return {slug(m[1]) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    return broken


def test_every_link_of_the_docs_leads_to_a_page_and_a_heading_that_exist() -> None:
    found = {str(p.relative_to(ROOT)): broken for p in PAGES if (broken := broken_links(p))}
    assert found == {}


def test_the_link_check_fires_on_a_missing_page_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](page.md#title) [b](gone.md) [c](#no-such-heading) [d](https://x.org/)\n")
    assert broken_links(page) == ["gone.md", "#no-such-heading"]


def test_the_readme_is_short_and_links_every_page_of_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - linked == set(), "pages the README does not link"


def test_the_committed_reference_is_what_the_code_makes_today() -> None:
    committed = (ROOT / "docs" / "reference.md").read_text()
    assert committed == reference.render(), "docs/reference.md is stale: run `make reference`"


def test_the_reference_defines_every_count_and_lists_every_option_and_exit_code() -> None:
    from click import Context

    from crashbench.cli import cli
    from crashbench.errors import ExitCode
    from crashbench.model.counts import Counts

    text = reference.render()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", text.split("## Counts", 1)[1], flags=re.M))
    rows_above = reference.field_comments(Counts)
    for i, (name, definition) in enumerate(rows_above):
        if name:  # a count's own comment, or the block just above it
            assert definition or (i and not rows_above[i - 1][0]), f"count {name} has no definition"
    assert set(rows) >= {"lost", "duplicated", "stranded"}
    for command in cli.commands.values():
        for param in command.get_params(Context(command)):
            assert "--help" in param.opts or all(opt in text for opt in param.opts), param.opts
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}` |" in text
    from crashbench.designs import Design

    for name, member in Design.__dict__.items():
        if callable(member) and (not name.startswith("_") or name == "__init__"):
            assert f"| `{name}(" in text, f"Design.{name} is not in the reference"


def test_the_smallest_design_of_the_guide_runs_and_loses_one_job_per_mid_job_kill() -> None:
    """docs/how-to/your-own-design.md's example, as printed, crash-tested."""
    import sys
    import types

    from crashbench.model.spec import Scenario
    from crashbench.run.session import Options, run_designs

    guide = (ROOT / "docs" / "how-to" / "your-own-design.md").read_text()
    code = guide.split("```python\n", 1)[1].split("```", 1)[0]
    module = types.ModuleType("guide_design")
    exec(compile(code, "your-own-design.md", "exec"), module.__dict__)
    sys.modules["guide_design"] = module
    try:
        sc = Scenario().replace(jobs=800, job_ms=10, kills=2, interval=0.2)  # 2 s of work
        run = run_designs(sc, ["guide_design:ListQueue"], Options()).runs[0]
    finally:
        del sys.modules["guide_design"]
    assert run.problems == [] and run.counts.kills_mid_job == 2
    assert run.counts.lost == 2 and run.counts.done == 798
