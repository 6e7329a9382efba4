"""What SGLang 0.5.23 does with an EAGLE-3 draft's layer ids: the layers its target really captures, what it
raises, which ids would make stock SGLang capture a given spec, and the findings for serving a draft with it.

A model of the engine, read from its source (models/deepseek_v2.py, qwen2_moe.py, qwen3_moe.py, qwen3_next.py,
kimi_k25.py, layers/aux_hidden_states.py); the canonical taps it is checked against are spec.py's, which knows no
engine. Pure Python (no torch, no SGLang), so configs can be checked anywhere. The central rule:
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture(ids)`` applies the +1 only when ``ids[0] == 1``, so
SpecForge ids ``[-1, 2, 30]`` are stored as layer-input indices unchanged, and -1 never matches a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .findings import Finding, compare_taps, wanted_capture
from .spec import EMBEDDING, LayerOutput, Tap, TapError, TapSpec, as_index, positive_int, tap_error

__all__ = [
    "CONV_SGLANG_0523", "SGLANG_0523_DEEPSEEK_V2", "SGLANG_0523_QWEN_MOE", "SGLANG_0523_FAMILIES",
    "sglang_0523_family", "sglang_0523_default_layers_to_capture", "sglang_0523_layers_to_capture", "NativeCapture",
    "sglang_0523_native_capture", "sglang_0523_ids_for", "compare_native_capture", "check_sglang_0523",
]

# The convention named in this module's error messages.
CONV_SGLANG_0523 = "SGLang 0.5.23 set_eagle3_layers_to_capture(ids) -> model.layers_to_capture"

SGLANG_0523_DEEPSEEK_V2 = "deepseek_v2"
SGLANG_0523_QWEN_MOE = "qwen_moe"
SGLANG_0523_FAMILIES = (SGLANG_0523_DEEPSEEK_V2, SGLANG_0523_QWEN_MOE)

# model_type -> family. deepseek_v2.py serves DeepseekV2/V3/V32ForCausalLM; kimi_k25.py's
# KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture delegates to its DeepseekV3 language_model.
# qwen2_moe.py, qwen3_moe.py and qwen3_next.py each add +1 to every id.
_SGLANG_0523_FAMILY_BY_MODEL_TYPE = {
    "deepseek_v2": SGLANG_0523_DEEPSEEK_V2, "deepseek_v3": SGLANG_0523_DEEPSEEK_V2,
    "deepseek_v32": SGLANG_0523_DEEPSEEK_V2, "kimi_k2": SGLANG_0523_DEEPSEEK_V2, "kimi_k25": SGLANG_0523_DEEPSEEK_V2,
    "qwen2_moe": SGLANG_0523_QWEN_MOE, "qwen3_moe": SGLANG_0523_QWEN_MOE, "qwen3_next": SGLANG_0523_QWEN_MOE,
}


def sglang_0523_family(model_type: Optional[str]) -> Optional[str]:
    """The SGLang 0.5.23 capture family of a target model_type, or None if this module does not model it."""
    return _SGLANG_0523_FAMILY_BY_MODEL_TYPE.get(model_type or "")


def _check_family(family: str) -> None:
    if family not in SGLANG_0523_FAMILIES:
        raise TapError(f"unknown SGLang 0.5.23 model family {family!r}; known: {list(SGLANG_0523_FAMILIES)}")


def sglang_0523_default_layers_to_capture(num_layers: int) -> List[int]:
    """What SGLang 0.5.23 stores when the draft config has no ids: ``[2, L // 2, L - 3]`` as LAYER-INPUT indices
    (= outputs of layers 1, L//2 - 1, L - 4). Same literal in deepseek_v2.py, qwen2_moe.py and qwen3_moe.py."""
    L = positive_int(num_layers, "num_layers")
    return [2, L // 2, L - 3]


def sglang_0523_layers_to_capture(ids: Optional[Sequence[int]], num_layers: int,
                                  family: str = SGLANG_0523_DEEPSEEK_V2) -> List[int]:
    """Reproduce what SGLang 0.5.23's ``set_eagle3_layers_to_capture(ids)`` stores in ``model.layers_to_capture``.

    * ``deepseek_v2`` (models/deepseek_v2.py, DeepseekV2ForCausalLM): ``None`` -> ``[2, L//2, L-3]``;
      ``if layer_ids and layer_ids[0] == 1: [v + 1 for v in layer_ids]`` else ``list(layer_ids)`` unchanged.
      So SpecForge ids are shifted only when the first one happens to be 1; ``[-1, 2, 30]`` is stored as is.
    * ``qwen_moe`` (Qwen2Moe/Qwen3Moe/Qwen3Next ForCausalLM): ``None`` -> ``[2, L//2, L-3]`` (no +1);
      otherwise ``[v + 1 for v in layer_ids]`` always.
    No validation: the point is to reproduce SGLang, mistakes included.
    """
    _check_family(family)
    if ids is None:
        return sglang_0523_default_layers_to_capture(num_layers)
    ids = [as_index(v, "draft id", CONV_SGLANG_0523) for v in ids]
    if family == SGLANG_0523_DEEPSEEK_V2:
        if ids and ids[0] == 1:
            return [v + 1 for v in ids]
        return list(ids)
    return [v + 1 for v in ids]


@dataclass(frozen=True)
class NativeCapture:
    """What stock SGLang 0.5.23 captures for a draft's ids.

    ``stored``: ``model.layers_to_capture``; ``captured_inputs``: layer-input indices actually captured, in slot
    order (= layer order); ``dropped``: stored entries that never produce a capture; ``error``: what SGLang then
    raises, if anything (None when the capture completes, even if it is the wrong one).
    """

    family: str
    ids: Optional[Tuple[int, ...]]
    num_layers: int
    hidden_size: int
    stored: Tuple[int, ...]
    captured_inputs: Tuple[int, ...]
    dropped: Tuple[int, ...]
    error: Optional[str]

    @property
    def captured_taps(self) -> Tuple[Tap, ...]:
        return tuple(EMBEDDING if i == 0 else LayerOutput(i - 1) for i in self.captured_inputs)

    @property
    def declared_count(self) -> int:
        """How many slots SGLang expects (its packer's K)."""
        return len(self.stored)

    @property
    def captured_features(self) -> int:
        return len(self.captured_inputs) * self.hidden_size


def sglang_0523_native_capture(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                               family: str = SGLANG_0523_DEEPSEEK_V2) -> NativeCapture:
    """Simulate stock SGLang 0.5.23 capture for draft ids (pp=1, no two-batch overlap).

    deepseek_v2: ``DeepseekV2Model.forward`` loops ``i in range(L)`` and captures the input of layer i (residual
    ``hidden + residual``; the embedding at i = 0) when ``i in self.layers_to_capture``, into an
    ``AuxHiddenStatePacker(len(layers_to_capture))``. Entries outside 0..L-1 never match; a repeated entry
    matches once. ``finalize()`` raises ``captured n of K`` when 0 < n < K; with n = 0 the model returns no aux
    tensor and ``DeepseekV2ForCausalLM.forward`` unpacks the bare hidden states as a pair.
    (With two-batch overlap, layers from ``first_k_dense_replace`` on run through ``model_forward_stages`` with no
    capture at all: not modelled here.)

    qwen_moe: ``Qwen2MoeModel.set_eagle3_layers_to_capture`` flags ``self.layers[i]`` for each stored i, so an
    entry outside -L..L-1 raises IndexError at startup and a negative one wraps to layer L+i; captures go to a
    plain list (no count check: a short capture surfaces as an fc shape error in the draft).
    """
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    stored = sglang_0523_layers_to_capture(ids, L, family)
    ids_t = None if ids is None else tuple(as_index(v, "draft id", CONV_SGLANG_0523) for v in ids)
    error: Optional[str] = None
    if family == SGLANG_0523_QWEN_MOE:
        bad = [i for i in stored if not -L <= i < L]
        if bad:
            return NativeCapture(family, ids_t, L, H, tuple(stored), (), tuple(stored),
                                 f"IndexError at startup: Qwen2MoeModel.set_eagle3_layers_to_capture indexes "
                                 f"self.layers[{bad[0]}] of a {L}-layer model")
        flagged = {i % L for i in stored}
        captured = tuple(i for i in range(L) if i in flagged)
    else:
        captured = tuple(i for i in range(L) if i in stored)
    remaining = list(stored)
    for i in captured:
        remaining.remove(i if i in remaining else i - L)  # qwen: a wrapped negative entry was consumed
    n, k = len(captured), len(stored)
    if n != k:
        if family == SGLANG_0523_DEEPSEEK_V2:
            error = (f"RuntimeError: captured {n} of {k} aux hidden states" if n else
                     "no aux hidden states captured: DeepseekV2Model.forward returns bare hidden_states and "
                     "DeepseekV2ForCausalLM.forward unpacks them as (hidden_states, aux)")
        else:
            error = (f"{n} of {k} aux hidden states captured: the draft fc receives {n}*{H} = {n * H} features "
                     f"instead of {k * H}")
    return NativeCapture(family, ids_t, L, H, tuple(stored), captured, tuple(remaining), error)


def sglang_0523_ids_for(spec: TapSpec, family: str = SGLANG_0523_DEEPSEEK_V2) -> List[int]:
    """Ids to write in the draft config so that stock SGLang 0.5.23 captures exactly ``spec`` (a workaround when
    this project's plugin is not installed). Raises TapError when no id list can (e.g. the final boundary, or
    LayerOutput(0) as first tap on deepseek_v2: layer input 1 needs ids[0] == 1, which becomes 2).

    Note the ids returned for deepseek_v2 are layer-input indices, not SpecForge ids: the draft side of SGLang
    only uses their count, but other tools reading the config would misread them.
    """
    _check_family(family)
    L = spec.num_layers
    if spec.includes_final_boundary:
        raise tap_error(f"the final boundary LayerOutput({L - 1}) would be layer-input index {L}, which SGLang "
                        f"0.5.23's capture loop (0..{L - 1}) never reaches: no id list captures it", CONV_SGLANG_0523)
    inputs = spec.to_layer_inputs()
    if family == SGLANG_0523_QWEN_MOE:
        ids = [i - 1 for i in inputs]
    elif inputs[0] == 1:
        raise tap_error(f"{spec.taps[0]!r} as first tap needs layers_to_capture to start with 1, but SGLang 0.5.23's "
                        "DeepseekV2 shifts any ids starting with 1 to start with 2: no id list captures it",
                        CONV_SGLANG_0523)
    else:
        ids = list(inputs)
    assert sglang_0523_native_capture(ids, spec.num_layers, spec.hidden_size, family).captured_taps == spec.taps
    return ids


def compare_native_capture(declared: TapSpec, native: NativeCapture, *, fix: Optional[str] = None) -> List[Finding]:
    """:func:`~eagle3_capture.findings.compare_taps` for what stock SGLang 0.5.23 captures: first the stored entries
    it drops and the error it then raises, then the slot-by-slot differences. The default fix says which ids stock
    SGLang would need, or why none can."""
    if fix is None:
        fix = _stock_fix(declared, native)
    out: List[Finding] = []
    L = native.num_layers
    qwen = native.family == SGLANG_0523_QWEN_MOE
    startup_failed = bool(native.error) and native.error.startswith("IndexError")
    for i in native.dropped:
        if startup_failed and -L <= i < L:
            continue  # in range, but nothing runs: the startup error below says it
        what = (f"SGLang 0.5.23 ({native.family}) stores layer-input index {i} in layers_to_capture "
                f"(draft ids {list(native.ids) if native.ids is not None else 'absent: default'})")
        if qwen and not -L <= i < L:
            why = "out of range of self.layers: IndexError at startup"
        elif qwen or 0 <= i < L:
            why = "repeats an index already captured, which matches once"
        else:
            why = f"never matches a layer (capture loop runs over 0..{L - 1})"
        if i == L:
            out.append(Finding("error", "final-boundary-dropped",
                               f"{what}: it is the final boundary LayerOutput({L - 1}), which a capture at "
                               f"layer inputs (loop 0..{L - 1}) never reaches: {why}; dropped", fix))
        else:
            out.append(Finding("error", "dropped-tap", f"{what}: {why}; dropped", fix))
    if native.error:
        code = "startup-error" if native.error.startswith("IndexError") else "capture-error"
        out.append(Finding("error", code, f"SGLang 0.5.23 then fails: {native.error}", fix))
    return out + compare_taps(declared, native.captured_taps, fix=fix)


def _stock_fix(declared: TapSpec, native: NativeCapture) -> str:
    want = wanted_capture(declared)
    plugin = "use this project's SGLang plugin, which captures the declared taps exactly"
    try:
        ids = sglang_0523_ids_for(declared, native.family)
    except TapError as e:
        return f"{want}: {plugin} (stock SGLang 0.5.23 cannot: {e})"
    return (f"{want}: {plugin}, or with stock SGLang 0.5.23 ({native.family}) set "
            f"eagle_config.eagle_aux_hidden_state_layer_ids to {ids}")


def check_sglang_0523(declared: TapSpec, ids: Optional[Sequence[int]],
                      family: str = SGLANG_0523_DEEPSEEK_V2) -> List[Finding]:
    """Findings for serving a draft trained on ``declared`` with stock SGLang 0.5.23 given draft-config ``ids``."""
    native = sglang_0523_native_capture(ids, declared.num_layers, declared.hidden_size, family)
    return compare_native_capture(declared, native)
