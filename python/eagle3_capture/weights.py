"""Loading a draft's fc (and its per-tap fc_norm) from a safetensors checkpoint, whole or as the column shard one
tensor-parallel rank holds.

Checkpoint names, as SGLang 0.5.23's EAGLE-3 loaders accept them (models/llama_eagle3.py, kimi_k25_eagle3.py):
`fc.weight` [N, K*H], optional `fc.bias` [N], optional `fc_norm.{k}.weight` [H] (legacy `aux_norm_low/mid/high`),
any of them under a `model.` prefix. SGLang's fc is a ColumnParallelLinear: rank r of tp holds output rows
[r*N/tp, (r+1)*N/tp) of the weight and of the bias, and the whole fc_norm (it acts on the replicated input).
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Optional

import torch

_LEGACY_NORMS = {"aux_norm_low": 0, "aux_norm_mid": 1, "aux_norm_high": 2}


@dataclass
class DraftFc:
    weight: torch.Tensor                 # [N/tp, K*H]
    norm_weight: Optional[torch.Tensor]  # [K, H] or None
    bias: Optional[torch.Tensor]         # [N/tp] or None
    out_features_total: int              # N before sharding
    tp_rank: int
    tp_size: int
    source: str

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]


def _checkpoint_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in draft checkpoint directory {path}")
        return files
    if not os.path.exists(path):
        raise FileNotFoundError(f"draft checkpoint {path} does not exist")
    return [path]


def _canonical(name: str) -> str:
    name = name[len("model."):] if name.startswith("model.") else name
    for legacy, k in _LEGACY_NORMS.items():
        name = name.replace(legacy, f"fc_norm.{k}")
    return name


def load_draft_fc(path: str, tp_rank: int = 0, tp_size: int = 1, dtype: Optional[torch.dtype] = None,
                  device="cpu") -> DraftFc:
    """Reads fc.weight / fc.bias / fc_norm.*.weight from a safetensors file or directory; shards like SGLang."""
    from safetensors import safe_open

    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, tp_size): got tp_rank={tp_rank}, tp_size={tp_size}")
    found: dict[str, tuple[str, str]] = {}
    for f in _checkpoint_files(path):
        with safe_open(f, framework="pt") as h:
            for key in h.keys():
                c = _canonical(key)
                if c == "fc.weight" or c == "fc.bias" or re.fullmatch(r"fc_norm\.\d+\.weight", c):
                    if c in found:
                        raise ValueError(f"{path}: {c} appears twice ({found[c][1]} in {found[c][0]} and {key} in {f})")
                    found[c] = (f, key)
    if "fc.weight" not in found:
        raise ValueError(f"{path}: no fc weight (looked for fc.weight, model.fc.weight)")

    def read(c, rows: Optional[slice] = None) -> torch.Tensor:
        f, key = found[c]
        with safe_open(f, framework="pt") as h:
            t = h.get_slice(key)[rows] if rows is not None else h.get_tensor(key)
        t = t.contiguous()
        return t.to(device=device, dtype=dtype or t.dtype)

    with safe_open(found["fc.weight"][0], framework="pt") as h:
        shape = h.get_slice(found["fc.weight"][1]).get_shape()
    if len(shape) != 2:
        raise ValueError(f"{path}: fc.weight must be 2-D [N, K*H], got shape {shape}")
    n_total = shape[0]
    if n_total % tp_size:
        raise ValueError(f"{path}: fc out_features {n_total} is not divisible by tp_size {tp_size} "
                         "(ColumnParallelLinear needs equal shards)")
    per = n_total // tp_size
    rows = slice(tp_rank * per, (tp_rank + 1) * per)
    weight = read("fc.weight", rows)
    bias = read("fc.bias", rows) if "fc.bias" in found else None
    norm_keys = sorted((k for k in found if k.startswith("fc_norm.")), key=lambda k: int(k.split(".")[1]))
    norm = None
    if norm_keys:
        idx = [int(k.split(".")[1]) for k in norm_keys]
        if idx != list(range(len(idx))):
            raise ValueError(f"{path}: fc_norm indices {idx} are not 0..K-1")
        norm = torch.stack([read(k) for k in norm_keys])
        if norm.shape[0] * norm.shape[1] != shape[1]:
            raise ValueError(f"{path}: {norm.shape[0]} fc_norm weights of size {norm.shape[1]} do not match fc "
                             f"in_features {shape[1]} (expected K*H)")
    return DraftFc(weight, norm, bias, n_total, tp_rank, tp_size, path)
