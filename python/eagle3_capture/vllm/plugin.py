"""vLLM general plugin: entry point ``eagle3_capture = "eagle3_capture.vllm.plugin:register"`` in group
``vllm.general_plugins``. ``vllm.plugins.load_general_plugins()`` runs it once per process in the API server, the
EngineCore and every worker, before any model is built.

:func:`register` looks at the installed vLLM (internals.py), and on a release of the table (vllm_releases/) whose
DeepseekV2 code matches an adapter wraps the two target methods of target.py on their classes. vLLM calls a general
plugin without catching what it raises, so a refusal here is an exception that stops the process at startup with
one line: an unknown release, internals that match no adapter, a hook whose wrapper is not what vLLM then resolves,
a malformed setting. A declaration the plugin cannot serve is refused later, at the target's model load (target.py).

Settings: ``EAGLE3_CAPTURE_DISABLE`` = ``all`` (or ``taps``, the plugin's only hook group on vLLM) registers nothing
and stock vLLM serves; empty or unset installs the hooks; any other value refuses (a name meant to turn something
off that does not exist on vLLM). ``VLLM_PLUGINS`` without ``eagle3_capture`` keeps vLLM from loading the plugin.
"""
from __future__ import annotations

import os
from typing import Dict

from . import internals, target

ENV_DISABLE = "EAGLE3_CAPTURE_DISABLE"
GROUPS = ("taps",)
_OFF_VALUES = ("all",) + GROUPS
registered: Dict[str, str] = {}  # path -> "on"


def _disabled() -> bool:
    raw = os.environ.get(ENV_DISABLE, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = sorted(names - set(_OFF_VALUES))
    if unknown:
        raise RuntimeError(f"eagle3_capture: refusing to serve: {ENV_DISABLE}={raw!r} names {unknown}, which the "
                           f"vLLM plugin does not have (it knows {list(_OFF_VALUES)}: each turns the whole plugin off)")
    return bool(names)


def status_text() -> str:
    parts = []
    for path, _ in target.HOOKS:
        why = target.in_place(path) if path in registered else "not registered"
        parts.append(f"{path.rsplit('.', 2)[-2]}.{path.rsplit('.', 1)[-1]}={'on' if why is None else why}")
    return "hooks: " + " ".join(parts) + f" (turn off with {ENV_DISABLE}=all)"


def register() -> None:
    """Install the target hooks, or raise one line saying why the plugin refuses to serve."""
    if _disabled():
        target.logger.info("eagle3_capture: %s set: every hook off, stock vLLM serves", ENV_DISABLE)
        return
    rel = internals.detect()
    if rel.refusal is not None:
        raise RuntimeError(rel.refusal)
    target.report_status_with(status_text)
    for path, hook in target.HOOKS:
        owner_path, _, name = path.rpartition(".")
        owner = internals.resolve(owner_path)
        current = getattr(owner, name)
        if getattr(current, "_eagle3_capture_hook", None) is hook:
            registered[path] = "on"  # this process registered it already
            continue
        target.ORIGINALS[path] = current
        setattr(owner, name, target.wrap(path, current, hook))
        why = target.in_place(path)
        if why is not None:
            raise RuntimeError(f"eagle3_capture: refusing to serve on {rel.describe()}: the hook on {path} did not "
                               f"attach ({why})")
        registered[path] = "on"
    target.logger.debug("eagle3_capture: %s: %s", rel.describe(), status_text())


__all__ = ["register", "status_text", "registered", "ENV_DISABLE"]
