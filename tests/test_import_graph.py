"""The import graph of python/eagle3_capture has no cycle, lazy imports (inside functions) included: every module's
imports, read with `ast`, point down a tree of concerns (entry points -> features -> shared leaves)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

PACKAGE = "eagle3_capture"
ROOT = Path(__file__).resolve().parents[1] / "python" / PACKAGE


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path = ROOT) -> Dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    """The absolute module a relative `from ... import` names (level dots, counted from the importer's package)."""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The package modules `name` imports anywhere in its source (module level or inside a function).

    ``from X import y`` counts as an import of ``X.y`` when that is a module, else of ``X``; a module importing one of
    its parent packages is not an edge (Python has that package in sys.modules already)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_package, node.level, node.module) if node.level else (node.module or "")
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import eagle3_capture.x.y` of a non-module name: its module
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    mods = package_modules(root)
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_package_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30, f"expected the whole package, got {sorted(graph)}"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in python/eagle3_capture: " + " -> ".join(cycle)


def test_graph_reader_sees_lazy_and_relative_imports(tmp_path):
    """The reader must see what the rule is about: a lazy import inside a function closing a cycle, relative
    imports at every depth, and `from pkg import submodule`."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .sub import b\n\ndef f():\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def g():\n    from ..a import f\n    return f\n")
    (pkg / "c.py").write_text("import eagle3_capture.sub.b\nfrom eagle3_capture import a\n")
    graph = import_graph(pkg)
    assert graph[f"{PACKAGE}.a"] == {f"{PACKAGE}.sub.b"}
    assert graph[f"{PACKAGE}.sub.b"] == {f"{PACKAGE}.a"}
    assert graph[f"{PACKAGE}.c"] == {f"{PACKAGE}.sub.b", f"{PACKAGE}.a"}
    assert graph[PACKAGE] == {f"{PACKAGE}.a"}
    assert find_cycle(graph) == [f"{PACKAGE}.a", f"{PACKAGE}.sub.b", f"{PACKAGE}.a"]


@pytest.mark.parametrize("graph,cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle
