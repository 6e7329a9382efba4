"""The draft config's tap declaration as this process read it (beside SGLang's own read, at model load): a leaf shared
by the taps hook (taps/target.py), which turns it into the taps to capture, the self-test (monitor/selftest.py), which
checks a capture against it, and the dump (dump/record.py), which records it; and the target config a DeepseekV2Model
answers to (:func:`config_of`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ... import configs as _configs
from ...spec import TapSpec


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


# Set on a DeepseekV2Model that has no ``config`` of its own (0.5.12 keeps it only on the causal LM around it).
CONFIG_ATTR = "_eagle3_capture_config"


def config_of(inner):
    """The HF config a DeepseekV2Model was built from: its own ``config`` (0.5.14+), else the one the plugin
    recorded from the causal LM holding it (``remember_config``). Raises AttributeError naming both."""
    cfg = getattr(inner, "config", None)
    if cfg is None:
        cfg = getattr(inner, CONFIG_ATTR, None)
    if cfg is None:
        raise AttributeError(f"{type(inner).__name__} has no config and none was recorded by the plugin")
    return cfg


def remember_config(causal_lm) -> None:
    """Record ``causal_lm.config`` on its DeepseekV2Model where that model has no config of its own."""
    inner = getattr(causal_lm, "model", None)
    if inner is not None and getattr(inner, "config", None) is None and getattr(causal_lm, "config", None) is not None:
        setattr(inner, CONFIG_ATTR, causal_lm.config)


_declaration_lock = threading.Lock()
_declaration: Optional[DraftDeclaration] = None


def current_declaration() -> Optional[DraftDeclaration]:
    return _declaration


def set_declaration(decl: Optional[DraftDeclaration]) -> None:
    """Record (or clear, with None) the draft's declaration for this process."""
    global _declaration
    with _declaration_lock:
        _declaration = decl


def declared_taps(model, spec: Optional[TapSpec]) -> Tuple[Optional[TapSpec], str]:
    """(the taps the draft declares, where the declaration came from) for a DeepseekV2Model `model`. With the taps
    hook on: the plugin's spec; with it off: the draft config, read beside SGLang's own read of it. Raises
    TapError / ValueError when the declaration does not fit the model."""
    if spec is not None:
        return spec, "the plugin's tap spec"
    decl = current_declaration()
    if decl is None or decl.draft is None:
        return None, "no draft config declaration was read"
    cfg = config_of(model)
    L, H = int(cfg.num_hidden_layers), int(cfg.hidden_size)
    target = _configs.read_target_config({"num_hidden_layers": L, "hidden_size": H,
                                          "model_type": getattr(cfg, "model_type", None)})
    return _configs.draft_taps(decl.draft, target), f"the draft config {decl.source}"


__all__ = ["DraftDeclaration", "current_declaration", "set_declaration", "declared_taps", "CONFIG_ATTR", "config_of",
           "remember_config"]
