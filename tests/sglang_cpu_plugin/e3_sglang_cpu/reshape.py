"""Test-only: a dummy-weight target whose layers differ (``E3_SGLANG_RESHAPE_TARGET=<gain>[:<seed>]``).

SGLang's ``load_format="dummy"`` leaves every norm at ~1e-3 and every same-shaped parameter equal in all layers
(scripts/gpu_sglang/kimi_shape.py says why that hides a miswired capture). With this setting, right after the
target's ``ModelRunner.load_model`` the target gets kimi_shape.layer_batches for its own config, one checkpoint
batch at a time through the model's own ``load_weights`` -- the function SGLang's checkpoint loader and its
update-weights API call (DeepseekV2's fuses q_a / kv_a within a call and re-derives the absorbed MLA weights of
the layers whose kv_b_proj came). In every scheduler process (each TP rank loads the full tensors and keeps its
shard), before CUDA graphs are captured; the draft's runner is left alone. Works on the GPU as on the CPU
(weights made on the model's device), for the Engine and for ``launch_server`` alike.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Tuple

ENV = "E3_SGLANG_RESHAPE_TARGET"
LOAD_MODEL_PATH = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
logger = logging.getLogger("e3_sglang_cpu")
# kimi_shape.py lives with the GPU serving harness (scripts/gpu_sglang), which also writes the target's config
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_GPU_HARNESS = os.path.join(_REPO, "scripts", "gpu_sglang")


def parse(value: str) -> Tuple[float, int]:
    """``"<gain>[:<seed>]"`` -> (gain, seed); ValueError naming the setting otherwise."""
    text = value.strip()
    gain_s, _, seed_s = text.partition(":")
    try:
        gain, seed = float(gain_s), int(seed_s) if seed_s else 0
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected <gain>[:<seed>], e.g. 0.5 or 0.5:3") from None
    if not 0 < gain <= 4:
        raise ValueError(f"{ENV}={value!r}: the gain must be in (0, 4], got {gain}")
    return gain, seed


def _kimi_shape():
    if _GPU_HARNESS not in sys.path:
        sys.path.append(_GPU_HARNESS)
    import kimi_shape

    return kimi_shape


def reshape_model(model, gain: float, seed: int) -> dict:
    """Send the reshaped weights for `model`'s config through its load_weights; returns what was sent."""
    import torch

    kimi_shape = _kimi_shape()
    cfg = model.config.to_dict()
    weight = model.model.embed_tokens.weight
    t0, tensors, batches = time.time(), 0, 0
    with torch.no_grad():
        for batch in kimi_shape.layer_batches(cfg, gain, seed, dtype=weight.dtype, device=str(weight.device)):
            model.load_weights(batch)
            tensors += len(batch)
            batches += 1
            del batch  # before the next batch is made: one layer's tensors alive at a time, not two
    if weight.device.type == "cuda":
        torch.cuda.synchronize()
    return {"gain": gain, "seed": seed, "batches": batches, "tensors": tensors, "seconds": round(time.time() - t0, 2)}


def load_model_hook(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    if getattr(self, "is_draft_worker", False):
        return out
    gain, seed = parse(os.environ[ENV])
    done = reshape_model(self.model, gain, seed)
    logger.warning("e3_sglang_cpu: target reshaped (%s): %d tensors in %d batches, %.1f s (pid %d)",
                   f"gain {gain}, seed {seed}", done["tensors"], done["batches"], done["seconds"], os.getpid())
    return out


def register_reshape(HookRegistry, HookType) -> None:
    parse(os.environ[ENV])  # a malformed value stops the server here, at plugin load
    HookRegistry.register(LOAD_MODEL_PATH, load_model_hook, HookType.AROUND)
