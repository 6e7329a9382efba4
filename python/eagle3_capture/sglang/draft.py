"""Draft-side hooks: the EAGLE-3 drafts' fc through the fused ``ops.draft_fc`` (filled in once the op lands)."""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

HOOKS: List[Tuple[str, Callable]] = []


def unavailable() -> Optional[str]:
    """Why the draft fc hooks cannot be installed here (None if they can)."""
    try:
        from .. import ops
    except Exception as e:
        return f"the extension does not load: {e}"
    if not hasattr(ops, "draft_fc"):
        return "this build has no ops.draft_fc yet"
    if not HOOKS:
        return "no draft fc hook yet"
    return None
