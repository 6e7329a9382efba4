"""Whether one of this plugin's hooks is really in place on an SGLang attribute: a leaf shared by the entry point
(plugin.py, for the hooks' status on the startup line) and the target hooks (taps/target.py, which refuse a final
boundary whose capture hooks are missing).

SGLang's HookRegistry only *logs* a hook it could not apply, so the plugin checks its own: each registry wrapper
keeps its hook in its closure and the function it wraps in ``__wrapped__``.
"""
from __future__ import annotations

import pkgutil
from typing import Callable

# Longest wrapper chain followed: far more than the plugins of one process stack on one attribute.
_MAX_CHAIN = 64


def _chain_has(fn_obj, hook: Callable) -> bool:
    """Whether `hook` is in the HookRegistry wrapper chain of `fn_obj`."""
    seen = 0
    f = getattr(fn_obj, "__func__", fn_obj)
    while f is not None and seen < _MAX_CHAIN:
        for cell in getattr(f, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                pass
        f = getattr(f, "__wrapped__", None)
        seen += 1
    return False


def hook_in_place(obj, attr: str, hook: Callable) -> bool:
    """Whether ``obj.attr`` runs through `hook` (False when the attribute does not exist)."""
    try:
        return _chain_has(getattr(obj, attr), hook)
    except AttributeError:
        return False


def hook_path_in_place(path: str, hook: Callable) -> bool:
    """:func:`hook_in_place` for a dotted path (``module.Class.attr``); False when the path does not resolve."""
    obj_path, attr = path.rsplit(".", 1)
    try:
        obj = pkgutil.resolve_name(obj_path)
    except Exception:
        return False
    return hook_in_place(obj, attr, hook)


__all__ = ["hook_in_place", "hook_path_in_place"]
