"""A draft checkpoint directory (config.json + *.safetensors, the SpecForge / SGLang ``llama_eagle3`` layout) to
and from :class:`~eagle3_capture.doctor.draft.model.Eagle3Draft`: the demo writes one, ``doctor accept`` and
``doctor online`` read any. The fc (and its per-tap norms, fp8 dequantized) is read by
:func:`eagle3_capture.weights.load_draft_fc`, as the SGLang plugin reads it; every problem is a DoctorError naming
the file."""
from __future__ import annotations

import os
from typing import Dict, Optional

import torch

from ... import draft_layouts
from ...weights import canonical_name
from ..common import DoctorError
from .layers import rope_kind, rope_scaling_of
from .model import DraftArch, Eagle3Draft
from .validate import check_finite, check_weights


def save_draft(model: Eagle3Draft, path: str, extra_config: Optional[dict] = None) -> None:
    """Write config.json and model.safetensors (SpecForge names: midlayer.*, fc.*, fc_norm.{k}.*, d2t)."""
    from ..common import save_safetensors, write_json

    os.makedirs(path, exist_ok=True)
    cfg = model.arch.config_json()
    cfg.update(extra_config or {})
    write_json(os.path.join(path, "config.json"), cfg)
    state = {k: v for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(path, "model.safetensors"), state, {"format": "pt"})


def _module_name(name: str) -> str:
    """A checkpoint tensor's name in :class:`Eagle3Draft` (the fc loader's canonical name; ``layers.0.`` is the
    midlayer)."""
    return canonical_name(name).replace("layers.0.", "midlayer.")


def arch_from_config(cfg: dict, label: str, num_aux: int, target_hidden: int, layer_ids) -> DraftArch:
    def need(key, default=None):
        v = cfg.get(key, default)
        if v is None:
            raise DoctorError(f"{label}: missing '{key}' (needed to build the draft)")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DoctorError(f"{label}: '{key}' must be a number, got {v!r}")
        return v

    archs = cfg.get("architectures") or []
    layout = draft_layouts.by_architecture(archs[0]) if archs else draft_layouts.LLAMA
    if layout is None:
        runs = " and ".join(f"{lay.architecture}{' drafts' if i == 0 else ''} ({lay.what})"
                            for i, lay in enumerate(draft_layouts.LAYOUTS))
        expected = " or ".join(f"[{lay.architecture!r}]" for lay in draft_layouts.LAYOUTS)
        raise DoctorError(f"{label}: architecture {archs[0]!r} is not supported offline: the doctor runs {runs}; "
                          f"expected architectures {expected}")
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        raise DoctorError(f"{label}: num_hidden_layers is {cfg.get('num_hidden_layers')}; EAGLE-3 drafts have 1")
    H = int(need("hidden_size"))
    nh = int(need("num_attention_heads"))
    ec = cfg.get("eagle_config") or {}
    vocab = int(need("vocab_size"))
    extra = draft_layouts.implementation(layout.config_reader)(cfg, label)  # the layout's own fields, checked
    return DraftArch(
        **extra,
        hidden_size=H, target_hidden_size=target_hidden, num_aux=num_aux, vocab_size=vocab,
        draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab), num_attention_heads=nh,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or nh),
        head_dim=int(cfg.get("head_dim") or H // nh), intermediate_size=int(need("intermediate_size")),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(cfg.get("rope_theta", 10000.0)),
        fc_norm=bool(cfg.get("fc_norm") or cfg.get("use_aux_norm", False)),
        norm_before_fc=bool(ec.get("norm_before_fc", cfg.get("norm_before_fc", False))),
        norm_output=bool(cfg.get("norm_output", False)), fc_bias=bool(cfg.get("bias", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        layer_ids=list(layer_ids or []),
    )


def load_draft(path: str, target_embed=None, target_lm_head=None, device: str = "cpu",
               dtype: Optional[torch.dtype] = None) -> Eagle3Draft:
    """Build the draft from a checkpoint directory (config.json + *.safetensors). The fc (and fc_norm) is read by
    :func:`eagle3_capture.weights.load_draft_fc`; a missing ``embed_tokens`` / ``lm_head`` is taken from the target,
    as SGLang does (``target_embed`` / ``target_lm_head``: a tensor, or a function giving one, called only when the
    checkpoint lacks it). The weights are read straight onto ``device`` and held in ``dtype`` (default float32), the
    module built without a second copy. Raises DoctorError on anything it cannot use."""
    from safetensors import safe_open

    from ... import configs
    from ...weights import checkpoint_files, load_draft_fc
    from ..common import read_json, require_file

    require_file(path, "draft checkpoint", allow_dir=True)
    if not os.path.isdir(path):
        raise DoctorError(f"draft checkpoint {path}: expected a directory with config.json and *.safetensors")
    cfg_path = os.path.join(path, "config.json")
    cfg = read_json(cfg_path, "draft config")
    if not isinstance(cfg, dict):
        raise DoctorError(f"draft config {cfg_path}: expected a JSON object")
    try:
        dc = configs.read_draft_config(cfg)
    except (ValueError, FileNotFoundError) as e:
        raise DoctorError(f"draft config {cfg_path}: {e}") from None
    try:
        files = checkpoint_files(path)
    except (ValueError, FileNotFoundError) as e:
        raise DoctorError(f"draft checkpoint {path}: {e}") from None
    if not files:
        raise DoctorError(f"draft checkpoint {path}: no *.safetensors file")
    try:
        fc = load_draft_fc(path)
    except (ValueError, FileNotFoundError) as e:
        raise DoctorError(f"draft checkpoint {path}: {e}") from None
    target_hidden = dc.target_hidden_size or dc.hidden_size
    if fc.in_features != dc.K * target_hidden:
        raise DoctorError(f"draft checkpoint {path}: fc.weight has in_features {fc.in_features} but the config "
                          f"declares K={dc.K} taps of H={target_hidden} ({dc.K * target_hidden})")
    arch = arch_from_config(cfg, f"draft config {cfg_path}", dc.K, target_hidden, dc.layer_ids)
    arch.fc_bias = fc.bias is not None
    dtype = dtype or torch.float32
    with torch.device("meta"):  # no memory until the checkpoint's tensors are assigned
        model = Eagle3Draft(arch)
    state: Dict[str, torch.Tensor] = {}
    try:
        for f in files:
            with safe_open(f, framework="pt", device=str(device)) as h:
                for k in h.keys():
                    state[_module_name(k)] = h.get_tensor(k)
    except Exception as e:  # safetensors raises several types for a corrupt file
        raise DoctorError(f"draft checkpoint {path}: cannot read its safetensors ({e})") from None
    # the fc (and its scales) came through load_draft_fc, which dequantizes fp8; other fp8 tensors would be cast raw
    fp8 = [k for k, v in state.items() if v.dtype.is_floating_point and v.element_size() == 1
           and not k.startswith("fc.")]
    if fp8:
        raise DoctorError(f"draft checkpoint {path}: {fp8[0]} is {state[fp8[0]].dtype}"
                          + (f" (and {len(fp8) - 1} more fp8 tensors)" if len(fp8) > 1 else "")
                          + "; doctor accept dequantizes only the fc weight: give it a checkpoint in bf16/fp16/fp32")
    check_weights(state, path)
    state["fc.weight"] = fc.weight
    if fc.bias is not None:
        state["fc.bias"] = fc.bias
    if fc.norm_weight is not None:
        for k in range(fc.norm_weight.shape[0]):
            state[f"fc_norm.{k}.weight"] = fc.norm_weight[k]
    borrowed = {k for k in ("embed_tokens.weight", "lm_head.weight") if k not in state}  # the target's
    if "embed_tokens.weight" not in state:
        if target_embed is None:
            raise DoctorError(f"draft checkpoint {path}: no embed_tokens.weight, and no target embedding given (SGLang "
                              "shares the target's: give the target, or --target-checkpoint to read it alone)")
        state["embed_tokens.weight"] = target_embed() if callable(target_embed) else target_embed
    if "lm_head.weight" not in state:
        if target_lm_head is None or arch.draft_vocab_size != arch.vocab_size:
            raise DoctorError(f"draft checkpoint {path}: no lm_head.weight (and the target's cannot stand in)")
        state["lm_head.weight"] = target_lm_head() if callable(target_lm_head) else target_lm_head
    if "d2t" not in state:
        state["d2t"] = torch.zeros(arch.draft_vocab_size, dtype=torch.int64)
    state = {k: v for k, v in state.items() if k != "t2d"}
    check_finite(state, path, skip=borrowed)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise DoctorError(f"draft checkpoint {path}: missing weights {missing[:6]}"
                          + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise DoctorError(f"draft checkpoint {path}: {k} has shape {tuple(state[k].shape)}, the config "
                              f"implies {tuple(v.shape)}")
    model.load_state_dict({k: state[k].to(device=device, dtype=v.dtype if k == "d2t" else dtype)
                           for k, v in own.items()}, assign=True)
    del state
    model.notes = []
    scaling = rope_scaling_of(cfg)
    if not arch.layout.rope_scaling_offline and rope_kind(scaling) not in ("default", None):
        model.notes.append(f"the draft's rope_scaling {rope_kind(scaling)!r} is not "
                           "applied offline (plain RoPE with rope_theta): exact only for positions where the scaling "
                           "leaves the frequencies alone")
    if cfg.get("sliding_window"):
        model.notes.append("the draft's sliding_window is not applied offline")
    return model.to(device).eval()


__all__ = ["save_draft", "load_draft", "arch_from_config"]
