"""The folder tree is the architecture (docs/architecture.md): every import of every module, typing-only and lazy
ones included, points to its own layer or one below, and no modules import each other in a circle. Also: no module
is longer or wider than the house's limits, and nothing in the repository cites a document outside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("smile_llm", "java_bridge")

# low to high; a module may import its own layer and those below it. The package's exports (smile_llm/__init__)
# sit above everything they export; the Java bridge uses only them; the command line is on top.
LAYERS: list[tuple[str, ...]] = [
    ("smile_llm.collector", "smile_llm.env", "smile_llm.errors", "smile_llm.lazy"),
    ("smile_llm.cache",),
    ("smile_llm.attention",),
    ("smile_llm.distributed",),
    ("smile_llm.models",),
    ("smile_llm.sampling",),
    ("smile_llm.speculative",),
    ("smile_llm.serving",),
    ("smile_llm.language_model",),
    ("smile_llm.engine",),
    ("smile_llm.server",),
    ("smile_llm.lab", "smile_llm.demo"),
    ("smile_llm",),
    ("java_bridge",),
    ("smile_llm.cli", "smile_llm.__main__"),
]
MAX_LINES = 600  # a module longer than this holds more than one concept: compose it from parts
MAX_WIDTH = 100  # characters per line of the package's source
OUTSIDE_DOCUMENTS = ("API.md", "DESIGN.md", "serving_anchors.md", "smile_llm_behaviour.md", "jpype_bridge.md")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = modules()


def imports_of(name: str, path: Path) -> set[str]:
    """Every module of the project ``path`` imports, anywhere in the file (top level, functions, TYPE_CHECKING),
    resolved to the module itself (``from .. import env`` is ``smile_llm.env``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def layer_of(name: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{name} belongs to no layer: add it to LAYERS and docs/architecture.md"
    return rank


def test_every_module_belongs_to_a_layer() -> None:
    for name in MODULES:
        layer_of(name)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() for target in targets
                    if layer_of(target) > layer_of(name))
    assert upward == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (an import circle each)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_cycle_finder_finds_a_circle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    # a package's __init__ re-exports its modules: an edge from a module to its own package's __init__ would be the
    # circle, so those count too
    assert strongly_connected(GRAPH) == []


def test_no_module_is_longer_than_the_limit() -> None:
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_line_is_wider_than_the_limit() -> None:
    wide = [f"{name}:{i}" for name, path in MODULES.items()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_WIDTH]
    assert wide == []


@pytest.mark.parametrize("document", OUTSIDE_DOCUMENTS)
def test_nothing_cites_a_document_outside_the_repository(document: str) -> None:
    citing = []
    for folder in ("smile_llm", "java_bridge", "docs", "tests", "benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".java", ".sh", ".toml") and path != Path(__file__).resolve():
                if document in path.read_text(encoding="utf-8", errors="replace"):
                    citing.append(str(path.relative_to(ROOT)))
    for path in (ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"):
        if document in path.read_text(encoding="utf-8"):
            citing.append(path.name)
    assert citing == []
