"""Canonical EAGLE-3 taps and exact converters between the index conventions in use.

An EAGLE-3 draft consumes the concatenation of K target hidden states ("taps"). Every tool names those taps
with a different integer convention, and a tap that is off by one layer still produces a tensor of the right
shape: the draft runs, and acceptance collapses silently. This module gives the taps one canonical name and
makes every conversion explicit, validated, and loud on error.

Canonical taps (decoder layers numbered 0..L-1):

* ``Embedding``       -- the embedding output, i.e. the input of layer 0.
* ``LayerOutput(k)``  -- the residual-stream value ``hidden + residual`` after layer k, before the next layer's
                         input norm (for k = L-1: before the final norm; the "final boundary").

Conventions (the table in DESIGN.md, "Tap conventions"):

=================================  =========  ===================  ==========================================
convention                         Embedding  LayerOutput(k)       notes
=================================  =========  ===================  ==========================================
HF ``outputs.hidden_states[h]``    h = 0      h = k + 1            h = L is post-final-norm in most HF models
layer-input index i                i = 0      i = k + 1 (k < L-1)  engines loop i over 0..L-1: i = L is never
(SGLang / vLLM)                                                    reached, hence silently dropped
EAGLE draft id d (SpecForge)       d = -1     d = k
=================================  =========  ===================  ==========================================

The second half of the module models what SGLang 0.5.23 really does with the draft ids (its
``set_eagle3_layers_to_capture`` applies the +1 only when ``ids[0] == 1``) and compares captured taps with the
taps a draft was trained on. It is pure Python (no torch) so configs can be checked anywhere.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

__all__ = [
    "TapError", "Embedding", "EMBEDDING", "LayerOutput", "Tap", "TapSpec",
    "CONV_CANONICAL", "CONV_HF", "CONV_LAYER_INPUTS", "CONV_DRAFT_IDS", "CONV_SGLANG_0523",
    "DRAFT_IDS", "LAYER_INPUTS", "HF_HIDDEN_STATES", "CONVENTIONS",
    "ConventionLimit", "convention_limits",
    "SGLANG_0523_DEEPSEEK_V2", "SGLANG_0523_QWEN_MOE", "SGLANG_0523_FAMILIES", "sglang_0523_family",
    "sglang_0523_default_layers_to_capture", "sglang_0523_layers_to_capture", "NativeCapture",
    "sglang_0523_native_capture", "sglang_0523_ids_for", "Finding", "compare_taps", "check_sglang_0523",
]

# Human-readable convention names, used in every error message so the reader knows which integers are meant.
CONV_CANONICAL = "canonical taps (Embedding / LayerOutput(k))"
CONV_HF = "HF outputs.hidden_states[h] (output_hidden_states=True)"
CONV_LAYER_INPUTS = "layer-input index (SGLang layers_to_capture / vLLM aux_hidden_state_layers)"
CONV_DRAFT_IDS = "EAGLE draft id (eagle_config.eagle_aux_hidden_state_layer_ids, SpecForge meaning)"
CONV_SGLANG_0523 = "SGLang 0.5.23 set_eagle3_layers_to_capture(ids) -> model.layers_to_capture"

# Short keys (e.g. the value of a draft config's eagle_config.eagle_aux_hidden_state_convention).
DRAFT_IDS = "draft_ids"
LAYER_INPUTS = "layer_inputs"
HF_HIDDEN_STATES = "hf_hidden_states"
CONVENTIONS: Dict[str, str] = {DRAFT_IDS: CONV_DRAFT_IDS, LAYER_INPUTS: CONV_LAYER_INPUTS,
                               HF_HIDDEN_STATES: CONV_HF}


class TapError(ValueError):
    """Any invalid tap, index or tap set. A ValueError whose message names the offender and the convention."""


def _err(msg: str, convention: str) -> TapError:
    return TapError(f"{msg} [convention: {convention}]")


def _as_int(x, what: str, convention: str) -> int:
    """Accept ints (and int-like, e.g. numpy ints) but not bools, floats or strings: a silent cast hides bugs."""
    if isinstance(x, bool):
        raise _err(f"{what} {x!r} is a bool, not an integer index", convention)
    try:
        return operator.index(x)
    except TypeError:
        raise _err(f"{what} {x!r} is not an integer index", convention) from None


# ----------------------------------------------------------------------------------------------------------------
# Taps
# ----------------------------------------------------------------------------------------------------------------

class _Tap:
    """Total order shared by all taps: Embedding < LayerOutput(0) < LayerOutput(1) < ... (residual-stream order)."""

    __slots__ = ()

    def _key(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _cmp(self, other, op):
        if not isinstance(other, _Tap):
            return NotImplemented
        return op(self._key(), other._key())

    def __lt__(self, other):
        return self._cmp(other, operator.lt)

    def __le__(self, other):
        return self._cmp(other, operator.le)

    def __gt__(self, other):
        return self._cmp(other, operator.gt)

    def __ge__(self, other):
        return self._cmp(other, operator.ge)


@dataclass(frozen=True, repr=False)
class Embedding(_Tap):
    """The embedding output (= input of layer 0). Draft id -1, layer-input 0, HF hidden_states[0]."""

    def _key(self) -> int:
        return -1

    def __repr__(self) -> str:
        return "Embedding"


EMBEDDING = Embedding()


@dataclass(frozen=True, repr=False)
class LayerOutput(_Tap):
    """Output of decoder layer k: ``hidden + residual`` before layer k+1's input norm (or the final norm)."""

    k: int

    def __post_init__(self):
        k = _as_int(self.k, "LayerOutput layer", CONV_CANONICAL)
        if k < 0:
            raise _err(f"LayerOutput({k}) is not a tap: layers are numbered from 0; the embedding is Embedding",
                       CONV_CANONICAL)
        object.__setattr__(self, "k", k)

    def _key(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"LayerOutput({self.k})"


Tap = Union[Embedding, LayerOutput]


def _check_strictly_increasing(values: Sequence[int], labels: Sequence[str], convention: str) -> None:
    """Reject duplicates, then unsorted entries, each with its own message.

    Sorted order is required because every engine emits captures in layer order (SGLang appends inside its layer
    loop), so the fc slot order of the served model is the sorted order whatever the config says.
    """
    first_at: Dict[int, int] = {}
    for pos, v in enumerate(values):
        if v in first_at:
            raise _err(f"duplicate {labels[pos]} at positions {first_at[v]} and {pos}: "
                       "each tap may appear once", convention)
        first_at[v] = pos
    for pos in range(len(values) - 1):
        if values[pos] > values[pos + 1]:
            raise _err(f"{labels[pos]} (position {pos}) comes before {labels[pos + 1]} (position {pos + 1}): "
                       "taps must be strictly increasing, because engines capture in layer order", convention)


def _positive(x, name: str) -> int:
    v = _as_int(x, name, CONV_CANONICAL)
    if v < 1:
        raise _err(f"{name} must be >= 1, got {v}", CONV_CANONICAL)
    return v


# ----------------------------------------------------------------------------------------------------------------
# TapSpec
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TapSpec:
    """The taps a draft consumes, for a target of ``num_layers`` decoder layers of width ``hidden_size``.

    Validated on construction (non-empty, in range, strictly increasing), so a TapSpec in hand is always one
    that some capture can produce. The draft's ``fc`` then has ``in_features == K * H``.
    """

    taps: Tuple[Tap, ...]
    num_layers: int
    hidden_size: int

    def __post_init__(self):
        L = _positive(self.num_layers, "num_layers")
        H = _positive(self.hidden_size, "hidden_size")
        if isinstance(self.taps, (str, bytes, _Tap)):
            raise _err(f"taps must be a sequence of taps, got {self.taps!r}", CONV_CANONICAL)
        taps = tuple(self.taps)
        if not taps:
            raise _err("a tap spec needs at least one tap, got none", CONV_CANONICAL)
        for t in taps:
            if not isinstance(t, _Tap):
                raise _err(f"{t!r} is not a tap (expected Embedding or LayerOutput(k))", CONV_CANONICAL)
            if isinstance(t, LayerOutput) and t.k >= L:
                raise _err(f"{t!r} is out of range for a {L}-layer model (valid LayerOutput(0)..LayerOutput({L - 1}))",
                           CONV_CANONICAL)
        _check_strictly_increasing([t._key() for t in taps], [repr(t) for t in taps], CONV_CANONICAL)
        object.__setattr__(self, "taps", taps)
        object.__setattr__(self, "num_layers", L)
        object.__setattr__(self, "hidden_size", H)

    # -- shape ---------------------------------------------------------------------------------------------------
    @property
    def K(self) -> int:
        """Number of taps (fc input chunks)."""
        return len(self.taps)

    @property
    def fc_in_features(self) -> int:
        """Width of the packed capture and of the draft's fc input: K * H."""
        return self.K * self.hidden_size

    @property
    def includes_embedding(self) -> bool:
        return isinstance(self.taps[0], Embedding)

    @property
    def final_boundary(self) -> LayerOutput:
        """LayerOutput(L-1): residual stream before the final norm; unreachable for layer-input capture."""
        return LayerOutput(self.num_layers - 1)

    @property
    def includes_final_boundary(self) -> bool:
        return self.taps[-1] == self.final_boundary

    def check_fc_in_features(self, n: int) -> None:
        """Raise if a draft fc with ``in_features == n`` cannot consume this capture (n must equal K*H)."""
        n = _as_int(n, "fc in_features", CONV_CANONICAL)
        K, H = self.K, self.hidden_size
        if n == K * H:
            return
        if n > 0 and n % H == 0:
            hint = f"{n} = {n // H}*{H} would fit K={n // H} taps of H={H}"
        else:
            hint = f"{n} is not a multiple of H={H}: the draft was built for another hidden size"
        raise _err(f"draft fc.in_features is {n} but taps {list(self.taps)} give K={K} taps of H={H}: "
                   f"K*H = {K * H} != {n}; {hint}", CONV_CANONICAL)

    # -- EAGLE draft ids (SpecForge meaning) ---------------------------------------------------------------------
    @classmethod
    def from_draft_ids(cls, ids: Sequence[int], num_layers: int, hidden_size: int) -> "TapSpec":
        """d = -1 -> Embedding, d = k -> LayerOutput(k) (SpecForge / EAGLE-3 training meaning)."""
        L = _positive(num_layers, "num_layers")

        def check(d: int) -> Optional[str]:
            if -1 <= d < L:
                return None
            hint = (" (did you pass HF hidden_states or layer-input indices? draft id d means the output of layer d)"
                    if d == L else "")
            return f"draft id {d} is out of range for a {L}-layer model (valid -1..{L - 1}, -1 = Embedding){hint}"

        vals = _parse_indices(ids, "draft id", CONV_DRAFT_IDS, check)
        return cls(tuple(EMBEDDING if d == -1 else LayerOutput(d) for d in vals), L, hidden_size)

    def to_draft_ids(self) -> List[int]:
        return [-1 if isinstance(t, Embedding) else t.k for t in self.taps]

    # -- layer-input indices (SGLang layers_to_capture, vLLM aux_hidden_state_layers) ----------------------------
    @classmethod
    def from_layer_inputs(cls, indices: Sequence[int], num_layers: int, hidden_size: int, *,
                          allow_final_boundary: bool = False) -> "TapSpec":
        """i = 0 -> Embedding, i = k+1 -> LayerOutput(k). i = L (the final boundary) only if allowed: stock
        engines never reach it (their capture loop runs i in 0..L-1) and drop it without a word."""
        L = _positive(num_layers, "num_layers")

        def check(i: int) -> Optional[str]:
            if 0 <= i < L or (i == L and allow_final_boundary):
                return None
            if i < 0:
                return (f"layer-input index {i} is out of range for a {L}-layer model (valid 0..{L - 1}): a negative "
                        f"index never matches a layer (engines loop i over 0..{L - 1}) and is dropped silently; "
                        "the embedding is layer-input index 0")
            if i == L:
                return _final_boundary_layer_input_msg(L, True)
            top = f"{L - 1}; {L} only with allow_final_boundary=True" if not allow_final_boundary else f"{L}"
            return f"layer-input index {i} is out of range for a {L}-layer model (valid 0..{top})"

        vals = _parse_indices(indices, "layer-input index", CONV_LAYER_INPUTS, check)
        return cls(tuple(EMBEDDING if i == 0 else LayerOutput(i - 1) for i in vals), L, hidden_size)

    def to_layer_inputs(self, *, allow_final_boundary: bool = False) -> List[int]:
        if self.includes_final_boundary and not allow_final_boundary:
            raise _err(_final_boundary_layer_input_msg(self.num_layers, False),
                       CONV_LAYER_INPUTS)
        return [0 if isinstance(t, Embedding) else t.k + 1 for t in self.taps]

    # -- HF output_hidden_states ---------------------------------------------------------------------------------
    @classmethod
    def from_hf_hidden_states(cls, indices: Sequence[int], num_layers: int, hidden_size: int, *,
                              final_is_prenorm: bool = False) -> "TapSpec":
        """h = 0 -> Embedding, h = k+1 -> LayerOutput(k). h = L only with ``final_is_prenorm=True``: in most HF
        models the last entry is taken after the final norm and is not a residual-stream value."""
        L = _positive(num_layers, "num_layers")

        def check(h: int) -> Optional[str]:
            if 0 <= h < L or (h == L and final_is_prenorm):
                return None
            if h < 0:
                return (f"negative HF hidden_states index {h} is not accepted: Python-style wrap-around hides which "
                        f"layer is meant (hidden_states[-1] of a {L}-layer model is index {L}, the post-norm final "
                        f"entry); give indices 0..{L - 1}")
            if h == L:
                return _final_hf_msg(L, True)
            return (f"HF hidden_states index {h} is out of range for a {L}-layer model (hidden_states has {L + 1} "
                    f"entries 0..{L}; 0..{L - 1} are residual-stream values)")

        vals = _parse_indices(indices, "HF hidden_states index", CONV_HF, check)
        return cls(tuple(EMBEDDING if h == 0 else LayerOutput(h - 1) for h in vals), L, hidden_size)

    def to_hf_hidden_states(self, *, final_is_prenorm: bool = False) -> List[int]:
        if self.includes_final_boundary and not final_is_prenorm:
            raise _err(_final_hf_msg(self.num_layers, False), CONV_HF)
        return [0 if isinstance(t, Embedding) else t.k + 1 for t in self.taps]

    # -- by key --------------------------------------------------------------------------------------------------
    @classmethod
    def from_convention(cls, key: str, indices: Sequence[int], num_layers: int, hidden_size: int,
                        **options) -> "TapSpec":
        """Dispatch on a short key (DRAFT_IDS, LAYER_INPUTS, HF_HIDDEN_STATES); options go to the converter."""
        if key == DRAFT_IDS:
            return cls.from_draft_ids(indices, num_layers, hidden_size, **options)
        if key == LAYER_INPUTS:
            return cls.from_layer_inputs(indices, num_layers, hidden_size, **options)
        if key == HF_HIDDEN_STATES:
            return cls.from_hf_hidden_states(indices, num_layers, hidden_size, **options)
        raise TapError(f"unknown tap convention {key!r}; known: {sorted(CONVENTIONS)}")

    def to_convention(self, key: str, **options) -> List[int]:
        if key == DRAFT_IDS:
            return self.to_draft_ids(**options)
        if key == LAYER_INPUTS:
            return self.to_layer_inputs(**options)
        if key == HF_HIDDEN_STATES:
            return self.to_hf_hidden_states(**options)
        raise TapError(f"unknown tap convention {key!r}; known: {sorted(CONVENTIONS)}")

    # -- reporting -----------------------------------------------------------------------------------------------
    def describe(self) -> str:
        """One line naming the taps in every convention (for logs), 'n/a (...)' where one cannot express them."""
        lim = convention_limits(self)
        parts = [f"taps {list(self.taps)}"]
        for key, label in ((DRAFT_IDS, "draft ids"), (LAYER_INPUTS, "layer inputs"),
                           (HF_HIDDEN_STATES, "HF hidden_states")):
            c = lim[key]
            parts.append(f"{label} {list(c.indices)}" if c.ok else f"{label} n/a ({c.short_reason})")
        parts.append(f"L={self.num_layers} H={self.hidden_size} K={self.K} fc_in={self.fc_in_features}")
        return " | ".join(parts)


def _final_boundary_layer_input_msg(L: int, index_side: bool) -> str:
    what = (f"layer-input index {L} is the final boundary LayerOutput({L - 1}) of a {L}-layer model, which"
            if index_side else
            f"LayerOutput({L - 1}) is the final boundary of a {L}-layer model: as a layer-input index it is {L}, which")
    return (f"{what} engines capturing at layer inputs (loop i over 0..{L - 1}) never reach and drop silently; "
            "pass allow_final_boundary=True only for a capture that handles it (e.g. this project's plugin)")


def _final_hf_msg(L: int, index_side: bool) -> str:
    what = (f"HF hidden_states index {L} is the last entry of a {L}-layer model, which" if index_side else
            f"LayerOutput({L - 1}) would be HF hidden_states[{L}], the last entry of a {L}-layer model, which")
    return (f"{what} most HF models (DeepseekV3, Llama, Qwen2/3 included: transformers' output collector replaces "
            "it by last_hidden_state = model.norm(...)) take AFTER the final norm: not the residual-stream value "
            f"LayerOutput({L - 1}); pass final_is_prenorm=True only if you know this model appends it before the "
            "norm (e.g. tie_last_hidden_states=False)")


def _parse_indices(indices, label: str, convention: str, check) -> List[int]:
    if indices is None or isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise _err(f"expected a sequence of {label}s, got {indices!r}", convention)
    vals = [_as_int(x, label, convention) for x in indices]
    if not vals:
        raise _err(f"no {label}s given: a tap spec needs at least one tap", convention)
    for v in vals:
        msg = check(v)
        if msg is not None:
            raise _err(msg, convention)
    _check_strictly_increasing(vals, [f"{label} {v}" for v in vals], convention)
    return vals


# ----------------------------------------------------------------------------------------------------------------
# What each convention can express
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConventionLimit:
    """Whether one convention can name a spec's taps: ``indices`` if it can, else ``reason`` why not."""

    key: str
    convention: str
    indices: Optional[Tuple[int, ...]]
    reason: Optional[str] = None
    short_reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.indices is not None


def convention_limits(spec: TapSpec) -> Dict[str, ConventionLimit]:
    """Per convention key: the indices naming ``spec``, or why that convention cannot (the final boundary is
    unreachable for layer-input capture and is post-norm in HF hidden_states)."""
    out: Dict[str, ConventionLimit] = {}
    for key, short in ((DRAFT_IDS, None), (LAYER_INPUTS, "final boundary"), (HF_HIDDEN_STATES, "final boundary")):
        try:
            out[key] = ConventionLimit(key, CONVENTIONS[key], tuple(spec.to_convention(key)))
        except TapError as e:
            out[key] = ConventionLimit(key, CONVENTIONS[key], None, str(e), short)
    return out


# ----------------------------------------------------------------------------------------------------------------
# SGLang 0.5.23: what the target really captures for given draft ids
# ----------------------------------------------------------------------------------------------------------------

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
    L = _positive(num_layers, "num_layers")
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
    ids = [_as_int(v, "draft id", CONV_SGLANG_0523) for v in ids]
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
    L = _positive(num_layers, "num_layers")
    H = _positive(hidden_size, "hidden_size")
    stored = sglang_0523_layers_to_capture(ids, L, family)
    ids_t = None if ids is None else tuple(_as_int(v, "draft id", CONV_SGLANG_0523) for v in ids)
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
        raise _err(f"the final boundary LayerOutput({L - 1}) would be layer-input index {L}, which SGLang "
                   f"0.5.23's capture loop (0..{L - 1}) never reaches: no id list captures it", CONV_SGLANG_0523)
    inputs = spec.to_layer_inputs()
    if family == SGLANG_0523_QWEN_MOE:
        ids = [i - 1 for i in inputs]
    elif inputs[0] == 1:
        raise _err(f"{spec.taps[0]!r} as first tap needs layers_to_capture to start with 1, but SGLang 0.5.23's "
                   "DeepseekV2 shifts any ids starting with 1 to start with 2: no id list captures it",
                   CONV_SGLANG_0523)
    else:
        ids = list(inputs)
    assert sglang_0523_native_capture(ids, spec.num_layers, spec.hidden_size, family).captured_taps == spec.taps
    return ids


# ----------------------------------------------------------------------------------------------------------------
# Findings: declared taps vs captured taps
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One mismatch between what a draft was trained on and what is captured."""

    severity: str  # "error" | "warning" | "info"
    code: str      # e.g. "missing-embedding", "shifted-tap", "dropped-tap", "count-mismatch"
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code}: {self.message}" + (f" (fix: {self.fix})" if self.fix else "")


def _layers(n: int) -> str:
    return f"{n:+d} layer" + ("" if abs(n) == 1 else "s")


def compare_taps(declared: TapSpec, captured: Union[Sequence[Tap], NativeCapture], *,
                 fix: Optional[str] = None) -> List[Finding]:
    """Name every difference between the taps a draft was trained on and those a capture delivers.

    ``captured`` is a sequence of taps in slot order, or a :class:`NativeCapture` (then its dropped entries and
    runtime error are reported too, and the default fix says which ids stock SGLang would need). The fc consumes
    slots by position, so with equal counts slots are compared one to one; with unequal counts the draft cannot
    run at all, and layer taps are paired in order (when their counts match) to show the shift. An empty list
    means the capture is exactly the trained one.
    """
    native = captured if isinstance(captured, NativeCapture) else None
    cap: Tuple[Tap, ...] = native.captured_taps if native else tuple(captured)
    for t in cap:
        if not isinstance(t, _Tap):
            raise _err(f"captured {t!r} is not a tap", CONV_CANONICAL)
    if fix is None:
        fix = _default_fix(declared, native)
    H, K, n = declared.hidden_size, declared.K, len(cap)
    out: List[Finding] = []

    if native is not None:
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

    if n != K:
        out.append(Finding("error", "count-mismatch",
                           f"the draft was trained on K={K} taps {list(declared.taps)} (fc in_features {K}*{H} = "
                           f"{K * H}) but {n} are captured {list(cap)} ({n}*{H} = {n * H})", fix))

    emb_declared = declared.includes_embedding
    emb_captured = any(isinstance(t, Embedding) for t in cap)
    if emb_declared and not emb_captured:
        got = f"; slot 0 receives {cap[0]!r} instead" if n == K and n else ""
        out.append(Finding("error", "missing-embedding",
                           f"the draft was trained with Embedding in slot 0 but the embedding is not captured{got}",
                           fix))
    if emb_captured and not emb_declared:
        out.append(Finding("error", "unexpected-embedding",
                           "the embedding is captured but the draft was not trained on it", fix))

    if n == K:
        for s, (d, c) in enumerate(zip(declared.taps, cap)):
            if d == c or isinstance(d, Embedding) or isinstance(c, Embedding):
                continue  # embedding slots are reported above
            out.append(Finding("error", "shifted-tap",
                               f"slot {s} captures {c!r} but the draft was trained on {d!r}: shifted by "
                               f"{_layers(c.k - d.k)}", fix))
        return out

    d_layers = [(s, t) for s, t in enumerate(declared.taps) if isinstance(t, LayerOutput)]
    c_layers = [(s, t) for s, t in enumerate(cap) if isinstance(t, LayerOutput)]
    if len(d_layers) == len(c_layers):
        for (ds, d), (cs, c) in zip(d_layers, c_layers):
            if d != c:
                out.append(Finding("error", "shifted-tap",
                                   f"draft slot {ds} (trained on {d!r}) is served {c!r} from captured slot {cs}: "
                                   f"shifted by {_layers(c.k - d.k)}", fix))
    else:
        cset, dset = set(cap), set(declared.taps)
        for s, d in d_layers:
            if d not in cset:
                out.append(Finding("error", "missing-tap", f"draft slot {s} was trained on {d!r}, not captured", fix))
        for s, c in c_layers:
            if c not in dset:
                out.append(Finding("error", "unexpected-tap",
                                   f"captured slot {s} holds {c!r}, which the draft was not trained on", fix))
    return out


def _default_fix(declared: TapSpec, native: Optional[NativeCapture]) -> str:
    lim = convention_limits(declared)
    want = (f"capture {list(declared.taps)} = draft ids {declared.to_draft_ids()}"
            + (f" = layer inputs {list(lim[LAYER_INPUTS].indices)}" if lim[LAYER_INPUTS].ok else ""))
    plugin = "use this project's SGLang plugin, which captures the declared taps exactly"
    if native is None:
        return want
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
    return compare_taps(declared, native)
