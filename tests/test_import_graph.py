"""The import graph of python/eagle3_capture, read with `ast` (lazy imports inside functions included): it has no
cycle (every module's imports point down a tree of concerns: entry points -> features -> shared leaves), no doctor
command imports another (what two commands share lives in the doctor's parts), the SGLang plugin's folders import
nothing above them and one another without a cycle, and no module reaches for a private (`_name`) of another module,
by `from m import _name` or `m._name`."""
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


def _bound_modules(tree, name: str, is_package: bool, known: Set[str]) -> Dict[str, str]:
    """Local name -> package module, for the names a module's imports bind to whole modules."""
    out: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_package, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                if f"{mod}.{a.name}" in known:
                    out[a.asname or a.name] = f"{mod}.{a.name}"
    return out


def _top_level_names(path: Path) -> Set[str]:
    """The names a module's own top level binds (defs, classes, assignments, imports)."""
    names: Set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def private_reaches(name: str, path: Path, known: Set[str], root: Path = ROOT) -> List[str]:
    """Each place where module `name` uses a private name of another package module: ``from m import _x`` (unless
    ``_x`` is a submodule of package ``m``, e.g. the compiled ``_C``, which its ``__init__`` does not bind) or
    ``m._x`` on a name bound to module m."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    mods = package_modules(root)
    out = []

    def private(n: str) -> bool:
        return n.startswith("_") and not n.startswith("__")

    def submodule(package: str, n: str) -> bool:
        init = mods.get(package)
        return f"{package}.{n}" in known or (init is not None and init.name == "__init__.py"
                                              and n not in _top_level_names(init))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_package, node.level, node.module) if node.level else (node.module or "")
            if mod not in known or mod == name:
                continue
            for a in node.names:
                if private(a.name) and not submodule(mod, a.name):
                    out.append(f"{name}:{node.lineno}: from {mod} import {a.name}")
    bound = _bound_modules(tree, name, is_package, known)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and private(node.attr):
            mod = bound.get(node.value.id)
            if mod is not None and mod != name:
                out.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr} ({mod})")
    return out


COMMANDS = f"{PACKAGE}.doctor.commands"
PLUGIN = f"{PACKAGE}.sglang"


def package_of(name: str, packages: Set[str]) -> str:
    """The package a module sits in (a package's ``__init__`` is its own package)."""
    return name if name in packages else name.rpartition(".")[0]


def arrows_back_up(graph: Dict[str, Set[str]], root: str, packages: Set[str]) -> List[str]:
    """Each import, by a module inside a folder (sub-package) of ``root``, of a module that sits in a folder above
    its own: ``root`` itself (its top modules) or a folder its own is nested in."""
    out = []
    for m, targets in sorted(graph.items()):
        own = package_of(m, packages)
        if not own.startswith(root + "."):
            continue
        for t in sorted(targets):
            if (t == root or t.startswith(root + ".")) and own.startswith(package_of(t, packages) + "."):
                out.append(f"{m} -> {t}")
    return out


def folder_graph(graph: Dict[str, Set[str]], root: str, packages: Set[str]) -> Dict[str, Set[str]]:
    """The folders (first-level sub-packages) of ``root`` as nodes, an edge where a module of one imports one of
    another."""
    def folder(m: str) -> Optional[str]:
        own = package_of(m, packages)
        return own[len(root) + 1:].split(".")[0] if own.startswith(root + ".") else None

    out: Dict[str, Set[str]] = {}
    for m, targets in graph.items():
        if folder(m) is not None:
            out.setdefault(folder(m), set()).update(folder(t) for t in targets if folder(t) not in (None, folder(m)))
    return out


def packages(root: Path = ROOT) -> Set[str]:
    return {name for name, path in package_modules(root).items() if path.name == "__init__.py"}


def test_package_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30, f"expected the whole package, got {sorted(graph)}"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in python/eagle3_capture: " + " -> ".join(cycle)


def test_no_doctor_command_imports_another():
    graph = import_graph()
    commands = {m for m in graph if m.startswith(COMMANDS + ".")}
    assert len(commands) >= 6, f"expected the doctor's subcommands under {COMMANDS}, got {sorted(commands)}"
    crossing = sorted(f"{m} -> {t}" for m in commands for t in graph[m] if t in commands)
    assert not crossing, "a doctor command imports another (move what they share into a part): " + "; ".join(crossing)


def test_the_doctors_parts_form_no_cycle():
    """Read a package (or a top-level module) of the doctor as one node: the parts import one another down a tree
    too, not only their modules."""
    doctor = f"{PACKAGE}.doctor."

    def part(m: str) -> Optional[str]:
        return m[len(doctor):].split(".")[0] if m.startswith(doctor) else None

    parts: Dict[str, Set[str]] = {}
    for m, targets in import_graph().items():
        if part(m) is not None:
            parts.setdefault(part(m), set()).update(part(t) for t in targets if part(t) not in (None, part(m)))
    assert {"commands", "target_side", "draft", "replay", "fingerprint", "sglang_model"} <= set(parts), sorted(parts)
    cycle = find_cycle(parts)
    assert cycle is None, "the doctor's parts import each other in a cycle: " + " -> ".join(cycle)


def test_the_plugins_folders_import_nothing_above_them():
    """The plugin's folders (installed, settings, taps, dump, monitor) hold its concerns; the modules at its top
    (the entry point, the hooks that combine folders) import them, never the other way round."""
    graph, pkgs = import_graph(), packages()
    folders = folder_graph(graph, PLUGIN, pkgs)
    assert {"installed", "settings", "taps", "dump", "monitor"} <= set(folders), sorted(folders)
    up = arrows_back_up(graph, PLUGIN, pkgs)
    assert not up, "a module of the plugin's folders imports one above it: " + "; ".join(up)
    cycle = find_cycle(folders)
    assert cycle is None, "the plugin's folders import each other in a cycle: " + " -> ".join(cycle)


def test_the_back_up_rule_sees_every_level(tmp_path):
    """An arrow from a folder to the root's top, or from a nested folder to the folder it sits in, is back up; one
    down or across is not; and a cycle between folders is seen even when no module cycle exists."""
    pkg = write_package(tmp_path, {
        "__init__.py": "", "top.py": "from .a import x\n",
        "a/__init__.py": "", "a/x.py": "from .. import top\nfrom ..b import y\n",
        "a/inner/__init__.py": "", "a/inner/z.py": "from .. import x\nfrom ...b import y\n",
        "b/__init__.py": "", "b/y.py": "def f():\n    from ..a.inner import z\n    return z\n"})
    graph, pkgs = import_graph(pkg), packages(pkg)
    assert arrows_back_up(graph, PACKAGE, pkgs) == [f"{PACKAGE}.a.inner.z -> {PACKAGE}.a.x",
                                                    f"{PACKAGE}.a.x -> {PACKAGE}.top"]
    assert find_cycle(folder_graph(graph, PACKAGE, pkgs)) == ["a", "b", "a"]


def test_no_module_uses_a_private_name_of_another():
    mods = package_modules()
    known = set(mods)
    found = [r for name, path in mods.items() for r in private_reaches(name, path, known)]
    assert not found, "private names used across modules: " + "; ".join(found)


def write_package(root: Path, files: Dict[str, str]) -> Path:
    """A package named like the real one under `root`, its files given as {relative path: source}."""
    pkg = root / PACKAGE
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_private_name_rule_sees_both_spellings(tmp_path):
    pkg = write_package(tmp_path, {
        "__init__.py": "_shown = 1\n", "a.py": "def _hidden():\n    pass\n\ndef shown():\n    pass\n",
        "sub/__init__.py": "", "sub/_inner.py": "",
        "sub/b.py": "from ..a import _hidden, shown\nfrom . import _inner\n",
        "sub/c.py": "def f():\n    from .. import a as alias\n    return alias._hidden\n",
        "sub/d.py": "from .. import a\n\ndef g():\n    return a.shown\n",
        "e.py": "from . import _C\n", "f.py": "from . import _shown\n"})
    mods = package_modules(pkg)
    known = set(mods)

    def reaches(m):
        return private_reaches(f"{PACKAGE}.{m}", mods[f"{PACKAGE}.{m}"], known, pkg)

    assert reaches("sub.b") == [f"{PACKAGE}.sub.b:1: from {PACKAGE}.a import _hidden"]
    assert reaches("sub.c") == [f"{PACKAGE}.sub.c:3: alias._hidden ({PACKAGE}.a)"]
    assert reaches("sub.d") == []
    # a compiled submodule (no .py here) that the package's __init__ does not bind is a module, not a name of it
    assert reaches("e") == [] and reaches("f") == [f"{PACKAGE}.f:1: from {PACKAGE} import _shown"]


def test_graph_reader_sees_lazy_and_relative_imports(tmp_path):
    """The reader must see what the rule is about: a lazy import inside a function closing a cycle, relative
    imports at every depth, and `from pkg import submodule`."""
    pkg = write_package(tmp_path, {
        "__init__.py": "from .a import f\n", "a.py": "from .sub import b\n\ndef f():\n    return b\n",
        "sub/__init__.py": "", "sub/b.py": "def g():\n    from ..a import f\n    return f\n",
        "c.py": "import eagle3_capture.sub.b\nfrom eagle3_capture import a\n"})
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
