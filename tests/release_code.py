"""Reading a released package's source without importing it (shared by test_sglang_releases_code.py and
test_vllm_rules.py): find a function by its dotted path with `ast`, and exec that one function's real source in a
namespace the test provides, so its real code runs on any release whose files are on disk."""
from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Dict, List, Optional, Tuple


def module_file(root: Path, dotted: str) -> Tuple[Optional[Path], List[str]]:
    """(file of the longest module prefix of ``dotted`` under ``root``, the remaining attribute names)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), parts[n:]
        if (base / "__init__.py").is_file():
            return base / "__init__.py", parts[n:]
    return None, parts


def _find(body, names: List[str]):
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == names[0]:
            return node if len(names) == 1 else _find(node.body, names[1:])
    return None


def find_def(root: Path, dotted: str):
    """The ast node of the class or function at ``dotted`` (e.g. ``sglang.srt.models.deepseek_v2.
    DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``), with its file's source; (None, None) if absent."""
    f, rest = module_file(root, dotted)
    if f is None or not rest:
        return None, None
    src = f.read_text()
    return _find(ast.parse(src).body, rest), src


def has_path(root: Path, dotted: str) -> bool:
    """Whether ``dotted`` names a module-level or class-level def/class in the release under ``root``; a trailing
    ``(name)`` also requires the function to take a parameter ``name``."""
    param = None
    if dotted.endswith(")"):
        dotted, param = dotted[:-1].split("(")
    node, _ = find_def(root, dotted)
    if node is None:
        # a module-level name bound by an import or an assignment (e.g. load_plugins re-exported)
        f, rest = module_file(root, dotted)
        if f is None or len(rest) != 1:
            return False
        for n in ast.parse(f.read_text()).body:
            if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == rest[0] for a in n.names):
                return param is None
        return False
    if param is None:
        return True
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    a = node.args
    return param in [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def exec_def(root: Path, dotted: str, namespace: Optional[Dict] = None):
    """The real function or class at ``dotted``, compiled from its own source alone (its module is not imported):
    ``namespace`` supplies the names it uses (typing's are given)."""
    node, src = find_def(root, dotted)
    if node is None:
        raise LookupError(f"{dotted} not found under {root}")
    ns = {name: getattr(typing, name) for name in typing.__all__}
    ns.update(namespace or {})
    node.decorator_list = []  # @staticmethod and the like need their class; the body is what is tested
    code = compile(ast.Module(body=[node], type_ignores=[]), f"{root}/{dotted}", "exec")
    exec(code, ns)
    return ns[node.name]


def calls_in(root: Path, dotted: str, attr: str) -> List[ast.Call]:
    """The calls ``<anything>.attr(...)`` inside the def at ``dotted``."""
    node, _ = find_def(root, dotted)
    if node is None:
        return []
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr == attr]
