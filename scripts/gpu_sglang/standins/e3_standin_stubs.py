"""Test-only: the import machinery behind the compiled-package stand-ins (``sgl_kernel``, ``flash_mla``,
``cutlass``) that let SGLang 0.5.23 import on a GPU machine without sglang-kernel (scripts/gpu_sglang).

SGLang imports hundreds of names from these packages at module level, nearly all on paths a tiny DeepseekV3 +
EAGLE-3 pair with ``--attention-backend triton`` never runs. Each such name resolves to an :class:`ImportOnly`
object: importing it, reading attributes of it (``scalar_types.uint4b8``), using it as a base class or as a bare
decorator all work; *calling* it raises :class:`StandInNotImplemented` naming the dotted name, so a stand-in
that SGLang really calls fails loudly instead of computing something else. What the path does call is written
out in torch (``sgl_kernel/native.py``).

:func:`install_finder` makes ``import pkg.any.submodule`` produce a module of the same kind for every submodule
that has no file of its own.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from typing import Dict, Tuple

# every dotted name SGLang called although it is only stood in for its import (kept for the failure report)
CALLED: Dict[str, int] = {}


class StandInNotImplemented(NotImplementedError):
    pass


class _ImportOnlyBase:
    """What a class that subclasses a stand-in name derives from."""


class ImportOnly:
    """A name SGLang imports but, on the tested path, never calls."""

    __slots__ = ("_e3_name", "_e3_children")

    def __init__(self, name: str):
        object.__setattr__(self, "_e3_name", name)
        object.__setattr__(self, "_e3_children", {})

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        children = object.__getattribute__(self, "_e3_children")
        if attr not in children:
            children[attr] = ImportOnly(f"{object.__getattribute__(self, '_e3_name')}.{attr}")
        return children[attr]

    def __call__(self, *args, **kwargs):
        name = object.__getattribute__(self, "_e3_name")
        # a bare decorator at import time (``@pkg.name`` over a function or class): hand the object back
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]
        CALLED[name] = CALLED.get(name, 0) + 1
        raise StandInNotImplemented(
            f"{name} was called, but it is only an import stand-in (scripts/gpu_sglang/standins): SGLang reached a "
            f"path the stand-ins do not implement; write a torch-native version of it in "
            f"scripts/gpu_sglang/standins/sgl_kernel/native.py (or keep the server off that path)")

    def __mro_entries__(self, bases) -> Tuple[type, ...]:
        return (_ImportOnlyBase,)

    def __repr__(self) -> str:
        return f"<import-only stand-in {object.__getattribute__(self, '_e3_name')}>"

    def __bool__(self) -> bool:  # `if some_kernel:` availability tests read "present"
        return True


class StandInModule(types.ModuleType):
    """A (sub)module of a stand-in package: every unknown attribute is an :class:`ImportOnly` name."""

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = ImportOnly(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


def module_getattr(package_name: str):
    """A module-level ``__getattr__`` for a stand-in package's ``__init__``."""

    def __getattr__(attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        pkg = sys.modules[package_name]
        value = ImportOnly(f"{package_name}.{attr}")
        setattr(pkg, attr, value)
        return value

    return __getattr__


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = StandInModule(spec.name)
        mod.__path__ = []  # a package: deeper submodules resolve too
        return mod

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: a submodule of a stand-in package that no file provides becomes a StandInModule."""

    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".", 1)[0]
        if root not in self.roots or "." not in fullname:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


_FINDER = _Finder(())


def install_finder(root: str) -> None:
    """Register ``root`` (a stand-in package) with the submodule finder (once per process)."""
    _FINDER.roots.add(root)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


__all__ = ["ImportOnly", "StandInModule", "StandInNotImplemented", "CALLED", "install_finder", "module_getattr"]
