"""What a draft checkpoint must be before the doctor runs it (issue 32, kinds 3 and 7): every bad value is one
DoctorError naming the file and the value, never a traceback and never a silent cast or truncation.

* Weights: floating point only (fp8 only for the fc, which :func:`eagle3_capture.weights.load_draft_fc`
  dequantizes by its scale). An integer weight (int8 with a ``weight_scale`` beside it, W8A8; int32; a packed
  ``qweight``) would be cast to float with its scale ignored: a different draft, a different prediction. Every
  weight is checked finite once, at load: a NaN weight changes the prediction without a word.
* Each draft layout's own config fields (draft_layouts.py names the reader of each: :func:`llama_fields`,
  :func:`mla_fields`). MLA: the ranks and head sizes are positive integers (16.7 is not 16), the rope head size is
  even (RoPE rotates pairs), the rope_scaling kind is one the offline MLA attention computes, and its factor /
  mscale values are finite numbers (a factor > 0).
"""
from __future__ import annotations

import math
from typing import Dict

import torch

from ... import draft_layouts
from ..common import DoctorError
from .layers import rope_kind, rope_scaling_of

# integer tensors a draft holds by design: the draft -> target vocabulary map and its inverse
INDEX_TENSORS = ("d2t", "t2d")
# names of the tensors a quantized layer stores beside (or instead of) its weight
QUANT_SUFFIXES = ("weight_scale", "weight_scale_inv", "input_scale", "weight_zero_point", "input_zero_point",
                  "qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_shape")
MLA_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# rope_scaling kinds transformers' DeepseekV3 rotary embedding computes (what the offline MLA attention runs)
MLA_ROPE_KINDS = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
SCALING_NUMBERS = ("factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "original_max_position_embeddings",
                   "attention_factor", "low_freq_factor", "high_freq_factor")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_weights(state: Dict[str, torch.Tensor], path: str) -> None:
    """Refuse integer and quantized weights, and any weight holding a NaN or Inf. ``state``: the module's names;
    the fc's own tensors (``fc.*``) have been read, dequantized and checked by load_draft_fc except finiteness."""
    for k, v in state.items():
        if k in INDEX_TENSORS:
            continue
        leaf = k.rsplit(".", 1)[-1]
        if not k.startswith("fc.") and leaf in QUANT_SUFFIXES:
            raise DoctorError(f"draft checkpoint {path}: {k} is a quantization tensor: the doctor runs drafts "
                              "in bf16/fp16/fp32 only (only the fc may be fp8, with its weight_scale); give it the "
                              "unquantized draft")
        if not v.dtype.is_floating_point:
            raise DoctorError(f"draft checkpoint {path}: {k} is {v.dtype}, an integer weight: casting it to float "
                              "would ignore its quantization scale; give the draft in bf16/fp16/fp32")


def check_finite(state: Dict[str, torch.Tensor], path: str, skip=()) -> None:
    """Every floating weight of ``state`` finite (once, at load); ``skip``: names not read from the draft (the
    target's embedding standing in)."""
    for k, v in state.items():
        if k in INDEX_TENSORS or k in skip or not v.dtype.is_floating_point or v.element_size() == 1:
            continue
        bad = ~torch.isfinite(v)
        if bool(bad.any()):
            raise DoctorError(f"draft checkpoint {path}: {k} holds {int(bad.sum())} NaN or Inf value(s) (of "
                              f"{v.numel()}): a broken draft; every prediction from it would be wrong")


def mla_sizes(cfg: dict, label: str) -> Dict[str, int]:
    """The MLA ranks and head sizes: each a positive integer (an integral float such as 16.0 is taken)."""
    out = {}
    for k in MLA_SIZES:
        v = cfg.get(k)
        if v is None:
            raise DoctorError(f"{label}: missing '{k}' (needed to build the draft)")
        if not _number(v) or float(v) != int(v) or int(v) <= 0:
            raise DoctorError(f"{label}: '{k}' must be a positive integer, got {v!r}")
        out[k] = int(v)
    if out["qk_rope_head_dim"] % 2:
        raise DoctorError(f"{label}: 'qk_rope_head_dim' must be even (RoPE rotates pairs of dimensions), got "
                          f"{out['qk_rope_head_dim']}")
    return out


def mla_rope_scaling(scaling: dict, kind, label: str) -> None:
    """An MLA draft's rope_scaling object: a known kind, its numbers finite, the factor > 0."""
    if kind not in MLA_ROPE_KINDS:
        raise DoctorError(f"{label}: rope_scaling type {kind!r} is not one the offline MLA attention computes "
                          f"({', '.join(MLA_ROPE_KINDS)})")
    for k in SCALING_NUMBERS:
        if k in scaling and scaling[k] is not None and not _number(scaling[k]):
            raise DoctorError(f"{label}: rope_scaling '{k}' must be a finite number, got {scaling[k]!r}")
    f = scaling.get("factor")
    if f is not None and f <= 0:
        raise DoctorError(f"{label}: rope_scaling 'factor' must be > 0, got {f!r}")


def llama_fields(cfg: dict, label: str) -> Dict[str, object]:
    """The Llama layout has no fields of its own (the common ones are read by checkpoint.arch_from_config)."""
    return {}


def mla_fields(cfg: dict, label: str) -> Dict[str, object]:
    """The MLA layout's own fields of a draft config, each checked: the ranks and head sizes, the rope_scaling
    (default scaling read as none) and the rope's interleaving."""
    if not cfg.get("q_lora_rank"):
        raise DoctorError(f"{label}: {draft_layouts.MLA.architecture} needs q_lora_rank (SGLang's Eagle3 MLA layer "
                          "requires it)")
    out: Dict[str, object] = dict(mla_sizes(cfg, label))
    scaling = rope_scaling_of(cfg)
    if scaling is not None and not isinstance(scaling, dict):
        raise DoctorError(f"{label}: rope_scaling must be an object, got {scaling!r}")
    if isinstance(scaling, dict) and rope_kind(scaling) == "default":
        scaling = None
    if scaling is not None and "factor" not in scaling:
        raise DoctorError(f"{label}: rope_scaling {scaling!r} has no 'factor'")
    if scaling is not None:
        mla_rope_scaling(scaling, rope_kind(scaling), label)
    out.update(rope_scaling=scaling, rope_interleave=bool(cfg.get("rope_interleave", True)))
    return out


__all__ = ["INDEX_TENSORS", "QUANT_SUFFIXES", "MLA_SIZES", "MLA_ROPE_KINDS", "check_weights", "check_finite",
           "mla_sizes", "mla_rope_scaling", "llama_fields", "mla_fields"]
