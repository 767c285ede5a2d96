"""The folder tree is the architecture (docs/architecture.md): every import of every module, typing-only and lazy
ones included, points to its own layer or one below, and no modules import each other in a circle. Also: no module
is longer or wider than the house's limits, and every document the repository cites is in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("smile_llm", "java_bridge")

# low to high; a module may import its own layer and those below it. The package's exports (smile_llm/__init__)
# sit above everything they export; the Java bridge uses only them; the command line is on top.
LAYERS: list[tuple[str, ...]] = [
    ("smile_llm.collector", "smile_llm.env", "smile_llm.errors", "smile_llm.json_file", "smile_llm.lazy"),
    ("smile_llm.text",),
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


def folder_of(name: str) -> str:
    """The folder (package) a module's file lies in: a package's ``__init__`` belongs to its own folder. The top-level
    modules (``smile_llm/errors.py``, ``smile_llm/cli.py``) sit at different layers: each is a node of its own."""
    folder = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    return name if folder in PACKAGES else folder


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder A imports folder B when a module of A imports a module of B."""
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        edges = folders.setdefault(folder_of(name), set())
        edges.update(folder_of(t) for t in targets if folder_of(t) != folder_of(name))
    return folders


def test_no_folders_import_each_other_in_a_circle() -> None:
    """One-way dependencies between folders, too: a folder and its subfolder (``speculative/`` and
    ``speculative/drafters/``) may not import each other, even through modules that form no circle."""
    assert strongly_connected(folder_graph(GRAPH)) == []


def test_no_module_is_longer_than_the_limit() -> None:
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_line_is_wider_than_the_limit() -> None:
    wide = [f"{name}:{i}" for name, path in MODULES.items()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_WIDTH]
    assert wide == []


def cited_documents(text: str) -> set[str]:
    """The Markdown documents ``text`` names (``docs/server.md``, ``README.md``, ``../examples/README.md``)."""
    return {m.rsplit("/", 1)[-1] for m in re.findall(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b", text)}


def test_the_citation_finder_finds_documents() -> None:
    assert cited_documents("see docs/server.md, ../java/README.md and `architecture.md`; not md5") == {
        "server.md", "README.md", "architecture.md"}


def test_every_document_the_repository_cites_is_in_it() -> None:
    """Every Markdown document named by the package, the docs, the tests, the benchmarks, the scripts or the top-level
    files is one of the repository's own."""
    own = {path.name for path in ROOT.rglob("*.md") if ".venv" not in path.parts and ".git" not in path.parts}
    missing = []
    files = [path for folder in ("smile_llm", "java_bridge", "docs", "tests", "benchmarks", "scripts")
             for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".java", ".sh", ".toml")]
    for path in files + [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]:
        for document in sorted(cited_documents(path.read_text(encoding="utf-8", errors="replace")) - own):
            missing.append(f"{path.relative_to(ROOT)} cites {document}")
    assert missing == []
