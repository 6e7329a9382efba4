"""What the engine tests run against a live server for the doctor without a target (functions, not fixtures: the
fixtures in test_engine.py call them while their server runs, so each server starts once).

- `dump_env(dir)`: the plugin's dump switched on for the doctor: every forward (a version-1 plugin dumps only the
  first EAGLE3_CAPTURE_DUMP_MAX), the full residual stream of the doctor's requests (version 2).
- `online_without_target(...)`: `doctor online --server URL --draft PATH --dump DIR`, no `--target`.
- `training_data(...)`: the demo pair's training data in SpecForge's layout, written here from the transformers
  target in bfloat16 (as SpecForge stores it), with the taps at the given layer inputs (no server needed: written
  beside the servers); `fingerprint_training(...)` runs `doctor fingerprint --training-data ... --server URL` on
  it.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List

from engine_fixtures import CHAIN, NEW_TOKENS, doctor, flags_text

# ids [0, 1, 4] of a draft config read two ways: SpecForge's HF backend hooks the output of layer d (layer inputs
# [1, 2, 5]); SpecForge's SGLang backend and SGLang serving use them as layer inputs unchanged (ids[0] != 1):
# [0, 1, 4], which is what the plugin serves for the demo draft's [-1, 0, 3].
TRAINING_IDS = [0, 1, 4]
TRAINING_READINGS = {"hf_reading": [1, 2, 5], "sglang_reading": [0, 1, 4]}
TRAINING_SAMPLES = 4
# The teacher-forced pass sends prompt + new tokens + num-steps + 1 tokens; within the demo draft's context of 56
# SGLang takes fewer than 56 - 1 - 5 = 50 input tokens (managers/tp_worker.py, max_req_input_len): 32 + 13 + 4.
NO_TARGET_TOKENS = NEW_TOKENS - 3


def dump_env(d: str) -> Dict[str, str]:
    return {"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_MAX": "100000", "EAGLE3_CAPTURE_DUMP_REQUESTS": "100000",
            "EAGLE3_CAPTURE_DUMP_STREAM": "all"}


def online_without_target(pair, url: str, dump: str, name: str) -> dict:
    out = os.path.join(pair.root, f"online_{name}_no_target.json")
    code, text, err = doctor("online", "--server", url, "--prompts", pair.prompts, "--draft", pair.draft, "--dump",
                             dump, "--new-tokens", NO_TARGET_TOKENS, "--json", out, "--no-progress", "--device", "cpu",
                             "--threads", 1, "--timeout", 300)
    with open(os.path.join(pair.root, f"online_{name}_no_target.txt"), "w") as f:
        f.write(text + err)
    return {"code": code, "text": text, "err": err, "json": json.load(open(out)) if os.path.exists(out) else None}


def accept_with_target(pair, new_tokens: int) -> dict:
    """`doctor accept --target` on the same prompts: the transformers-based prediction."""
    out = os.path.join(pair.root, f"accept_target_{new_tokens}.json")
    if not os.path.exists(out):
        code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts", pair.prompts,
                                 "--server-args", flags_text(CHAIN), "--new-tokens", new_tokens, "--json", out,
                                 "--no-progress", "--device", "cpu", "--threads", 1)
        assert code == 0, text + err
    return json.load(open(out))


def training_data(pair, name: str, layers: List[int]) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from dump_helpers import write_training
    from eagle3_capture.doctor.target_side.model import greedy_continue, residual_stream

    d = os.path.join(pair.root, f"training_{name}")
    if os.path.isdir(d):
        return d
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    with open(pair.prompts) as f:
        prompts = json.load(f)[:TRAINING_SAMPLES]
    seqs, stacks = [], []
    with torch.no_grad():
        for p in prompts:
            ids = greedy_continue(model, torch.tensor([p]), 16)
            seqs.append(ids[0])
    model = model.to(torch.bfloat16)  # SpecForge's target runs and stores bf16
    with torch.no_grad():
        for ids in seqs:
            stacks.append(residual_stream(model, ids[None])[0][0])
    write_training(d, seqs, stacks, layers)
    return d


def fingerprint_training(pair, url: str, dump: str, name: str, d: str) -> dict:
    """`doctor fingerprint --training-data d --server URL --captured dump` on training data `training_data` wrote."""
    cfg = pair.draft_variant("ids_014", eagle_aux_hidden_state_layer_ids=TRAINING_IDS)
    out = os.path.join(pair.root, f"fingerprint_{name}.json")
    code, text, err = doctor("fingerprint", "--training-data", d, "--server", url, "--captured", dump,
                             "--draft-config", cfg, "--target-config", pair.target, "--json", out, "--timeout", 300)
    with open(os.path.join(pair.root, f"fingerprint_{name}.txt"), "w") as f:
        f.write(text + err)
    return {"code": code, "text": text, "err": err, "json": json.load(open(out)) if os.path.exists(out) else None,
            "dir": d}


__all__ = ["NO_TARGET_TOKENS", "accept_with_target", "TRAINING_IDS", "TRAINING_READINGS", "dump_env", "online_without_target", "training_data",
           "fingerprint_training", "CHAIN", "flags_text"]
