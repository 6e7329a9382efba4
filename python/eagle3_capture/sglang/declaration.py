"""The draft config's tap declaration as this process read it (beside SGLang's own read, at model load): a leaf
shared by the taps hook (target.py), which turns it into the taps to capture, and the self-test (selftest.py),
which checks a capture against it."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import List, Optional

from .. import configs as _configs


@dataclass(frozen=True)
class DraftDeclaration:
    """What the draft config says about its taps, read beside SGLang's own read of it.

    ``sglang_ids``: what SGLang hands to ``set_eagle3_layers_to_capture`` (``eagle_config`` ids only, or None);
    ``draft``: the project's reading (ids from ``eagle_config`` then the top level, and their convention);
    ``error``: why the draft config could not be read, raised later by the DeepseekV2 hook.
    """

    sglang_ids: Optional[List[int]]
    draft: Optional[_configs.DraftConfig]
    error: Optional[str] = None
    source: str = "draft config"


_declaration_lock = threading.Lock()
_declaration: Optional[DraftDeclaration] = None


def current_declaration() -> Optional[DraftDeclaration]:
    return _declaration


def set_declaration(decl: Optional[DraftDeclaration]) -> None:
    """Record (or clear, with None) the draft's declaration for this process."""
    global _declaration
    with _declaration_lock:
        _declaration = decl


__all__ = ["DraftDeclaration", "current_declaration", "set_declaration"]
