"""SGLang 0.5.23's rule for an EAGLE-3 draft's layer ids, under the names the package used before it modelled every
release: thin wrappers on :mod:`eagle3_capture.sglang_releases` with the release fixed to 0.5.23.

New code calls the release-parameterised functions there, e.g.
``sglang_releases.native_capture(ids, num_layers, hidden_size, rel="0.5.12", family="deepseek_v2")``; these names
stay because existing callers (the plugin's startup note, configs.py) use them.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from . import sglang_releases as _releases
from .findings import Finding
from .sglang_releases import NativeCapture, compare_native_capture
from .spec import TapSpec

__all__ = [
    "CONV_SGLANG_0523", "SGLANG_0523_DEEPSEEK_V2", "SGLANG_0523_QWEN_MOE", "SGLANG_0523_FAMILIES",
    "sglang_0523_family", "sglang_0523_default_layers_to_capture", "sglang_0523_layers_to_capture", "NativeCapture",
    "sglang_0523_native_capture", "sglang_0523_ids_for", "compare_native_capture", "check_sglang_0523",
]

_RELEASE = "0.5.23"

# The convention named in the error messages of the 0.5.23 rule.
CONV_SGLANG_0523 = f"SGLang {_RELEASE} set_eagle3_layers_to_capture(ids) -> model.layers_to_capture"

SGLANG_0523_DEEPSEEK_V2 = _releases.FAMILY_DEEPSEEK_V2
SGLANG_0523_QWEN_MOE = _releases.FAMILY_QWEN_MOE
SGLANG_0523_FAMILIES = _releases.FAMILIES


def sglang_0523_family(model_type: Optional[str]) -> Optional[str]:
    """The SGLang capture family of a target model_type, or None if not modelled (the same in every release)."""
    return _releases.sglang_family(model_type)


def sglang_0523_default_layers_to_capture(num_layers: int) -> List[int]:
    """What SGLang stores when the draft config has no ids: ``[2, L // 2, L - 3]`` as layer-input indices."""
    return _releases.default_layers_to_capture(num_layers)


def sglang_0523_layers_to_capture(ids: Optional[Sequence[int]], num_layers: int,
                                  family: str = SGLANG_0523_DEEPSEEK_V2) -> List[int]:
    """:func:`eagle3_capture.sglang_releases.layers_to_capture` on SGLang 0.5.23."""
    return _releases.layers_to_capture(ids, num_layers, _RELEASE, family)


def sglang_0523_native_capture(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                               family: str = SGLANG_0523_DEEPSEEK_V2) -> NativeCapture:
    """:func:`eagle3_capture.sglang_releases.native_capture` on SGLang 0.5.23."""
    return _releases.native_capture(ids, num_layers, hidden_size, _RELEASE, family)


def sglang_0523_ids_for(spec: TapSpec, family: str = SGLANG_0523_DEEPSEEK_V2) -> List[int]:
    """:func:`eagle3_capture.sglang_releases.ids_for` on SGLang 0.5.23."""
    return _releases.ids_for(spec, _RELEASE, family)


def check_sglang_0523(declared: TapSpec, ids: Optional[Sequence[int]],
                      family: str = SGLANG_0523_DEEPSEEK_V2) -> List[Finding]:
    """:func:`eagle3_capture.sglang_releases.check_release` on SGLang 0.5.23."""
    return _releases.check_release(declared, ids, _RELEASE, family)
