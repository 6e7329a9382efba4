"""Canonical EAGLE-3 taps and exact converters between the index conventions in use.

An EAGLE-3 draft consumes the concatenation of K target hidden states ("taps"). Every tool names those taps
with a different integer convention, and a tap that is off by one layer still produces a tensor of the right
shape: the draft runs, and acceptance collapses silently. This module gives the taps one canonical name and
makes every conversion explicit, validated, and loud on error.

One file over 400 lines: it is one class (TapSpec) with a from_/to_ pair per convention and the checks those
conversions share (range, order, duplicates, width, the final boundary); split, each convention's checks would live
apart from the others they must agree with, and the round-trip tests cover the file as one unit.

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

It knows no engine: what each SGLang release does with the draft ids is modelled in sglang_releases/, and captured
taps are compared with trained ones in findings.py. Pure Python (no torch), so configs can be checked anywhere.
"""

from __future__ import annotations

import operator
from collections import abc
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

__all__ = [
    "TapError", "Embedding", "EMBEDDING", "LayerOutput", "Tap", "TapSpec",
    "CONV_CANONICAL", "CONV_HF", "CONV_LAYER_INPUTS", "CONV_DRAFT_IDS",
    "DRAFT_IDS", "LAYER_INPUTS", "HF_HIDDEN_STATES", "CONVENTIONS",
    "ConventionLimit", "convention_limits", "tap_error", "as_index", "positive_int",
]

# Human-readable convention names, used in every error message so the reader knows which integers are meant.
CONV_CANONICAL = "canonical taps (Embedding / LayerOutput(k))"
CONV_HF = "HF outputs.hidden_states[h] (output_hidden_states=True)"
CONV_LAYER_INPUTS = "layer-input index (SGLang layers_to_capture / vLLM aux_hidden_state_layers)"
CONV_DRAFT_IDS = "EAGLE draft id (eagle_config.eagle_aux_hidden_state_layer_ids, SpecForge meaning)"

# Short keys (e.g. the value of a draft config's eagle_config.eagle_aux_hidden_state_convention).
DRAFT_IDS = "draft_ids"
LAYER_INPUTS = "layer_inputs"
HF_HIDDEN_STATES = "hf_hidden_states"
CONVENTIONS: Dict[str, str] = {DRAFT_IDS: CONV_DRAFT_IDS, LAYER_INPUTS: CONV_LAYER_INPUTS,
                               HF_HIDDEN_STATES: CONV_HF}


class TapError(ValueError):
    """Any invalid tap, index or tap set. A ValueError whose message names the offender and the convention."""


def tap_error(msg: str, convention: str) -> TapError:
    """A TapError whose message ends by naming the convention its integers are in."""
    return TapError(f"{msg} [convention: {convention}]")


def as_index(x, what: str, convention: str) -> int:
    """Accept ints (and int-like, e.g. numpy ints) but not bools, floats or strings: a silent cast hides bugs."""
    if isinstance(x, bool):
        raise tap_error(f"{what} {x!r} is a bool, not an integer index", convention)
    try:
        return operator.index(x)
    except TypeError:
        raise tap_error(f"{what} {x!r} is not an integer index", convention) from None


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
        k = as_index(self.k, "LayerOutput layer", CONV_CANONICAL)
        if k < 0:
            raise tap_error(f"LayerOutput({k}) is not a tap: layers are numbered from 0; the embedding is Embedding",
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
            raise tap_error(f"duplicate {labels[pos]} at positions {first_at[v]} and {pos}: "
                            "each tap may appear once", convention)
        first_at[v] = pos
    for pos in range(len(values) - 1):
        if values[pos] > values[pos + 1]:
            raise tap_error(f"{labels[pos]} (position {pos}) comes before {labels[pos + 1]} (position {pos + 1}): "
                            "taps must be strictly increasing, because engines capture in layer order", convention)


def positive_int(x, name: str) -> int:
    """`x` as an int >= 1 (a layer count or a width), else a TapError naming `name`."""
    v = as_index(x, name, CONV_CANONICAL)
    if v < 1:
        raise tap_error(f"{name} must be >= 1, got {v}", CONV_CANONICAL)
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
        L = positive_int(self.num_layers, "num_layers")
        H = positive_int(self.hidden_size, "hidden_size")
        if isinstance(self.taps, (str, bytes, _Tap)):
            raise tap_error(f"taps must be a sequence of taps, got {self.taps!r}", CONV_CANONICAL)
        taps = tuple(self.taps)
        if not taps:
            raise tap_error("a tap spec needs at least one tap, got none", CONV_CANONICAL)
        for t in taps:
            if not isinstance(t, _Tap):
                raise tap_error(f"{t!r} is not a tap (expected Embedding or LayerOutput(k))", CONV_CANONICAL)
            if isinstance(t, LayerOutput) and t.k >= L:
                raise tap_error(f"{t!r} is out of range for a {L}-layer model "
                                f"(valid LayerOutput(0)..LayerOutput({L - 1}))", CONV_CANONICAL)
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
        n = as_index(n, "fc in_features", CONV_CANONICAL)
        K, H = self.K, self.hidden_size
        if n == K * H:
            return
        if n > 0 and n % H == 0:
            hint = f"{n} = {n // H}*{H} would fit K={n // H} taps of H={H}"
        else:
            hint = f"{n} is not a multiple of H={H}: the draft was built for another hidden size"
        raise tap_error(f"draft fc.in_features is {n} but taps {list(self.taps)} give K={K} taps of H={H}: "
                        f"K*H = {K * H} != {n}; {hint}", CONV_CANONICAL)

    # -- EAGLE draft ids (SpecForge meaning) ---------------------------------------------------------------------
    @classmethod
    def from_draft_ids(cls, ids: Sequence[int], num_layers: int, hidden_size: int) -> "TapSpec":
        """d = -1 -> Embedding, d = k -> LayerOutput(k) (SpecForge / EAGLE-3 training meaning)."""
        L = positive_int(num_layers, "num_layers")

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
        L = positive_int(num_layers, "num_layers")

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
            raise tap_error(_final_boundary_layer_input_msg(self.num_layers, False),
                            CONV_LAYER_INPUTS)
        return [0 if isinstance(t, Embedding) else t.k + 1 for t in self.taps]

    # -- HF output_hidden_states ---------------------------------------------------------------------------------
    @classmethod
    def from_hf_hidden_states(cls, indices: Sequence[int], num_layers: int, hidden_size: int, *,
                              final_is_prenorm: bool = False) -> "TapSpec":
        """h = 0 -> Embedding, h = k+1 -> LayerOutput(k). h = L only with ``final_is_prenorm=True``: in most HF
        models the last entry is taken after the final norm and is not a residual-stream value."""
        L = positive_int(num_layers, "num_layers")

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
            raise tap_error(_final_hf_msg(self.num_layers, False), CONV_HF)
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
    """An ordered sequence (list, tuple, range; a 1-D numpy array or tensor) of integers. A dict (its keys), a set
    (no order), a generator or a string is refused: the taps' order is the packed slots' order."""
    if hasattr(indices, "tolist") and getattr(indices, "ndim", None) == 1:  # numpy / torch, 1-D
        indices = indices.tolist()
    if indices is None or isinstance(indices, (str, bytes, bytearray)) or not isinstance(indices, abc.Sequence):
        raise tap_error(f"expected a sequence of {label}s (a list or tuple of integers, in slot order), got "
                        f"{type(indices).__name__} {indices!r:.80}", convention)
    vals = [as_index(x, label, convention) for x in indices]
    if not vals:
        raise tap_error(f"no {label}s given: a tap spec needs at least one tap", convention)
    for v in vals:
        msg = check(v)
        if msg is not None:
            raise tap_error(msg, convention)
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
