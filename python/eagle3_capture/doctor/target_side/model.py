"""The target side, with transformers: the demo's tiny DeepseekV3, loading any causal LM, greedy continuations,
and every residual-stream tap of a forward (including the final boundary before the final norm, which HF's
``hidden_states`` stack does not hold: its last entry is taken after the norm in most models).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from typing import Optional, Tuple

import torch

from ..common import DoctorError, require_file

DEMO = "demo"
DEMO_TARGET_CONFIG = "demo_target_config.json"


def demo_target_config_dict() -> dict:
    return json.loads(resources.files("eagle3_capture").joinpath("data", DEMO_TARGET_CONFIG).read_text())


def require_transformers():
    """transformers, or a DoctorError saying how to get it (the target side of the doctor runs HF models)."""
    try:
        import transformers
    except ImportError as e:
        raise DoctorError(f"this command runs a transformers model, and transformers does not import ({e}); "
                          "install it: pip install 'transformers>=5.17' (requirements-dev.txt pins 5.19.0)") from None
    return transformers


def demo_target_config(overrides: Optional[dict] = None):
    """The demo target's transformers DeepseekV3Config (from the JSON shipped in the package, plus overrides)."""
    require_transformers()
    from transformers import DeepseekV3Config

    d = demo_target_config_dict()
    d.update(overrides or {})
    d.pop("model_type", None)
    d.pop("torch_dtype", None)
    cfg = DeepseekV3Config(**d)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


DEMO_SETTINGS = "demo.json"

# parameter name pattern -> key of the init spec (first match wins); std = gain / sqrt(fan_in) except "embed"
_INIT_GROUPS = (("embed_tokens", "embed"), ("lm_head", "lm_head"), ("q_a_proj", "q"), ("q_b_proj", "q"),
                ("kv_a_proj", "kv_a"), ("kv_b_proj", "kv_b"), ("o_proj", "o"), ("mlp.gate.", "router"),
                ("mlp", "mlp"))


def demo_settings() -> dict:
    """The demo's settings shipped in the package (seed, target init, taps, data and training sizes)."""
    return json.loads(resources.files("eagle3_capture").joinpath("data", DEMO_SETTINGS).read_text())


def build_demo_target(seed: int = 0, init: Optional[dict] = None, overrides: Optional[dict] = None):
    """The demo's tiny DeepseekV3 with seeded weights, independent of transformers' own init: every parameter,
    in name order, from one generator. Norm weights 1 + norm_noise N(0,1); the embedding embed N(0,1); every other
    matrix gain/sqrt(fan_in) N(0,1) with the gain of its group (``init``: q, kv_a, kv_b, o, router, mlp, lm_head);
    the router's correction bias router_bias N(0,1). ``init`` defaults to the packaged demo settings."""
    from transformers import DeepseekV3ForCausalLM

    spec = dict(demo_settings()["target_init"])
    spec.update(init or {})
    cfg = demo_target_config(overrides)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).to(torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + spec.get("norm_noise", 0.1) * torch.randn(p.shape, generator=g))
                continue
            group = next((key for pat, key in _INIT_GROUPS if pat in name), None)
            if group is None:
                raise RuntimeError(f"demo target: no init group for parameter {name}")
            if group == "embed":
                std = float(spec["embed"])
            else:
                std = float(spec.get(group, 1.0)) / float(p.shape[-1]) ** 0.5
            p.copy_(std * torch.randn(p.shape, generator=g))
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(spec.get("router_bias", 0.01) * torch.randn(b.shape, generator=g))
    return model.eval()


@dataclass
class Target:
    model: torch.nn.Module
    tokenizer: object
    num_layers: int
    hidden_size: int
    vocab_size: int
    source: str
    config_dict: dict


def load_target(path: str, device: str = "cpu", seed: int = 0, dtype: Optional[torch.dtype] = None,
                quiet: bool = False) -> Target:
    """``demo`` (the built-in tiny DeepseekV3) or a transformers model directory (config.json + weights)."""
    if path == DEMO:
        model = build_demo_target(seed)
        cfg = demo_target_config_dict()
        tok = None
        source = f"demo (tiny DeepseekV3 from the packaged {DEMO_TARGET_CONFIG}, seed {seed})"
    else:
        require_file(path, "target model", allow_dir=True)
        if not os.path.isdir(path):
            raise DoctorError(f"target model {path}: expected a transformers model directory (config.json + "
                              "weights) or 'demo'")
        from ..common import read_json

        cfg = read_json(os.path.join(path, "config.json"), "target config")
        if not isinstance(cfg, dict):
            raise DoctorError(f"target config {path}/config.json: expected a JSON object")
        require_transformers()
        from transformers import AutoModelForCausalLM

        from transformers.utils import logging as hf_logging

        _require_layers(cfg, f"target config {path}/config.json")
        bars = hf_logging.is_progress_bar_enabled()
        verbosity = hf_logging.get_verbosity()
        if quiet:
            hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()  # its load report is many lines; the doctor says what is wrong in one
        try:
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32,
                                                               ignore_mismatched_sizes=True, output_loading_info=True)
        except Exception as e:  # transformers raises many types for an unusable checkpoint
            raise DoctorError(f"target model {path}: transformers could not load it: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
        finally:
            hf_logging.set_verbosity(verbosity)
            if quiet and bars:
                hf_logging.enable_progress_bar()
        refuse_partly_random(info, f"target model {path}")
        tok = None
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
        except Exception:
            tok = None
        source = path
    model = model.to(device).eval()
    c = model.config
    c = getattr(c, "text_config", None) or c
    _require_layers({"num_hidden_layers": getattr(c, "num_hidden_layers", None)}, f"target {source}")
    return Target(model, tok, int(c.num_hidden_layers), int(c.hidden_size), int(c.vocab_size), source, cfg)


def _require_layers(cfg: dict, what: str) -> None:
    """A target has at least one decoder layer (with 0, HF's stack holds the embedding alone, the post-norm one)."""
    for holder in (cfg, *(cfg.get(k) for k in ("text_config", "llm_config", "language_config") if isinstance(cfg.get(k), dict))):
        n = holder.get("num_hidden_layers")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise DoctorError(f"{what}: num_hidden_layers {n!r}: a target has at least one decoder layer")


def _weight_groups(keys, limit: int = 6) -> str:
    """Weight names for one line: those under one numbered block (``model.layers.3``) counted together."""
    import re

    groups = {}
    for k in sorted(keys):
        m = re.match(r"^(.*?\.\d+)\.", k) or re.match(r"^([^.]+)\.", k)
        g = m.group(1) if m else k
        groups.setdefault(g, []).append(k)
    parts = [v[0] if len(v) == 1 else f"{g}.* ({len(v)})" for g, v in groups.items()]
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def refuse_partly_random(info: dict, what: str) -> None:
    """transformers fills weights a checkpoint lacks (or holds in another shape) with random values and only logs a
    report: a reference or a prediction from such a model is noise. DoctorError naming the missing, unexpected and
    mismatched weights (``from_pretrained(..., output_loading_info=True)``; the keys transformers itself ignores,
    tied weights and e.g. DeepSeek-V3's MTP layer, are not in it)."""
    missing = set(info.get("missing_keys") or ())
    unexpected = set(info.get("unexpected_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (transformers would fill them with random values): "
                     + _weight_groups(missing))
    if mismatched:
        shown_ = ", ".join(f"{k} {tuple(a)} in the checkpoint, {tuple(b)} in the model" for k, a, b in mismatched[:3])
        parts.append(f"{len(mismatched)} of another shape: {shown_}" + (" ..." if len(mismatched) > 3 else ""))
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (the checkpoint is of another model): " + _weight_groups(unexpected))
    hint = ""
    if any(k == "fc.weight" or k.startswith("midlayer.") for k in unexpected):
        hint = "; this is an EAGLE-3 draft checkpoint, not a target"
    raise DoctorError(f"{what}: the checkpoint does not fit the model its config.json builds: " + "; ".join(parts)
                      + hint)


def _decoder(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise DoctorError(f"{type(model).__name__}: no .model.layers to read the residual stream from")
    return inner


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """prompts [B, P] -> [B, P + new_tokens]: the target's greedy continuation (no stop token), with its KV cache."""
    out = model(prompts, use_cache=True)
    pkv = out.past_key_values
    seq = [prompts]
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new_tokens - 1):
        seq.append(nxt)
        out = model(nxt, past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    seq.append(nxt)
    return torch.cat(seq, 1)


@torch.no_grad()
def residual_stream(model, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over ids [B, T]: (stack [B, T, L+1, H] of the canonical taps -- index 0 Embedding, index k+1
    LayerOutput(k), the last one being the final boundary before the final norm --, HF's last hidden_states entry
    [B, T, H] (post-norm in most models), greedy tokens [B, T] = argmax of the logits)."""
    inner = _decoder(model)
    grabbed = {}

    def pre_norm(module, args, kwargs=None):
        grabbed["x"] = args[0] if args else (kwargs or {}).get("hidden_states")

    norm = getattr(inner, "norm", None)
    if norm is not None:
        handle = norm.register_forward_pre_hook(pre_norm)
    else:
        def post(module, args, output):
            grabbed["x"] = output[0] if isinstance(output, tuple) else output
        handle = inner.layers[-1].register_forward_hook(post)
    try:
        out = model(ids, output_hidden_states=True)
    finally:
        handle.remove()
    hs = out.hidden_states
    L = len(inner.layers)
    if len(hs) != L + 1:
        raise DoctorError(f"{type(model).__name__}: hidden_states has {len(hs)} entries, expected L+1 = {L + 1}")
    final = grabbed.get("x")
    if final is None:
        raise DoctorError(f"{type(model).__name__}: the final boundary (input of the final norm) was not seen")
    stack = torch.stack(list(hs[:L]) + [final], dim=2)
    return stack, hs[L], out.logits.argmax(-1)


__all__ = ["DEMO", "demo_target_config", "demo_target_config_dict", "demo_settings", "build_demo_target", "Target", "load_target",
           "refuse_partly_random", "greedy_continue", "residual_stream"]
