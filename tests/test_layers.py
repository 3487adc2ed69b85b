"""The packages are layers: nothing imports upward, nothing imports in a circle (issue 27).

LAYERS names the order, bottom first; a package may import its own layer and any below. An import
that points up a layer fails here, and so does any circle of modules. Every import counts, type-only
ones too: they are dependencies all the same. docs/explanation/architecture.md draws this order.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "crashbench"

# Bottom first. "base": crashbench's own top-level modules that import nothing of it (errors, jobids, files).
LAYERS = [
    {"base"},
    {"model"},
    {"control"},
    {"designs"},
    {"evidence"},
    {"faults"},
    {"scenario"},
    {"run"},
    {"report"},
    {"bench"},
    {"cli", "pytest_plugin"},  # the two front ends, side by side: neither imports the other
    {"console", "__main__"},
]
BASE = {"__init__", "errors", "jobids", "files", "redact"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package at `root` and the modules of it that it imports (a name imported
    from a package counts as its submodule when there is one). A module's own enclosing packages are
    left out: importing a submodule runs them, which is no dependency of the module's choosing."""
    top = root.name
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t.split(".")[0] == top and t in paths}
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = found - ancestors - {name}
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    if (ROOT / parts[1]).is_dir() or len(parts) > 2:
        return parts[1]
    return "base" if parts[1] in BASE else parts[1]


def level(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def upward(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package pairs that point up, each with an example import."""
    found: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            pa, pb = package_of(a), package_of(b)
            if pa != pb and level(pb) > level(pa):
                found.setdefault((pa, pb), []).append(f"{a} imports {b}")
    return found


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Every set of modules that import each other in a circle (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_package_is_in_a_layer() -> None:
    packages = {package_of(m) for m in imports(ROOT)}
    assert packages <= set().union(*LAYERS), packages - set().union(*LAYERS)


def test_no_package_imports_upward() -> None:
    found = {k: v[:3] for k, v in upward(imports(ROOT)).items()}
    assert found == {}, f"imports pointing up a layer: {found}"


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert cycles(imports(ROOT)) == set()


HEAVY = {"redis", "psutil", "click", "rich"}


def heavy_imports(directory: Path) -> list[str]:
    """Imports of a server client, a process library or a terminal library under `directory`."""
    found = []
    for path in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            )  # fmt: skip
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in HEAVY]
    return found


def test_the_model_imports_nothing_heavy() -> None:
    """The records import no server client, process library or terminal library (nor anything of
    crashbench above them: the layer order says so)."""
    assert heavy_imports(ROOT / "model") == []


def test_the_checks_fire_on_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """A package made for the purpose: a module of a lower layer importing a higher one, and two
    modules importing each other (one through `from pkg import name`)."""
    pkg = tmp_path / "crashbench"
    for d in ("scenario", "run"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "scenario" / "a.py").write_text("from crashbench.run import b\n")
    (pkg / "run" / "b.py").write_text("import crashbench.run.c\n")
    (pkg / "run" / "c.py").write_text("from crashbench.run.b import x\n")
    (pkg / "scenario" / "d.py").write_text("import redis.client\n")
    graph = imports(pkg)
    assert heavy_imports(pkg / "scenario") == ["d.py imports redis.client"]
    assert set(upward(graph)) == {("scenario", "run")}
    assert cycles(graph) == {frozenset({"crashbench.run.b", "crashbench.run.c"})}


def test_the_architecture_page_draws_the_layers_in_this_order() -> None:
    page = (ROOT.parent / "docs" / "explanation" / "architecture.md").read_text()
    block = page.split("<!-- layers: top first -->\n```\n", 1)[1].split("```", 1)[0]
    drawn = [set(line.split("  ")[1].replace(" ", "").split(",")) for line in block.splitlines() if line.strip()]
    assert drawn == [set(layer) - {"__main__"} for layer in reversed(LAYERS)]
