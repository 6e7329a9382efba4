"""Single tensors of a target checkpoint, read alone: ``embed_tokens`` (and ``lm_head``) from the safetensors shard
that ``model.safetensors.index.json`` names, never the rest of the model (Kimi-K2.5's checkpoint is ~600 GB; its
embedding is 2.3 GB of one shard).

Names differ by model: DeepSeek-V3 ``model.embed_tokens.weight`` / ``lm_head.weight``; Kimi-K2.5 (a multimodal
wrapper) ``language_model.model.embed_tokens.weight`` / ``language_model.lm_head.weight``; transformers' newer
multimodal layout ``model.language_model.embed_tokens.weight``. DeepSeek-V3's MTP layer carries its own copy
(``model.layers.61.embed_tokens.weight``), so names are matched exactly, in this order, never by suffix.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from ..common import DoctorError, read_json, require_file

EMBED_NAMES = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
               "model.language_model.embed_tokens.weight", "language_model.embed_tokens.weight",
               "embed_tokens.weight")
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight",
                 "model.language_model.lm_head.weight")


@dataclass
class CheckpointTensors:
    """Where a checkpoint's tensors are: name -> shard file, from its index (or the files' headers)."""

    path: str
    where: Dict[str, str]
    index: Optional[str]

    def find(self, names) -> Optional[str]:
        return next((n for n in names if n in self.where), None)

    def shape_dtype(self, name: str) -> Tuple[List[int], torch.dtype]:
        from safetensors import safe_open

        f = self.where[name]
        try:
            with safe_open(f, framework="pt") as h:
                sl = h.get_slice(name)
                shape = list(sl.get_shape())
                dtype = sl[tuple(slice(0, 0) for _ in shape)].dtype
        except Exception as e:  # a shard that is not safetensors, or lacks the tensor its index names
            raise DoctorError(f"target checkpoint {self.path}: cannot read {name} from {os.path.basename(f)} "
                              f"({e})") from None
        return shape, dtype

    def read(self, name: str, device: str = "cpu", rows=None) -> torch.Tensor:
        """The tensor (or some of its rows: a list of row indices) straight from its shard onto ``device``."""
        from safetensors import safe_open

        f = self.where[name]
        try:
            with safe_open(f, framework="pt", device=str(device)) as h:
                if rows is None:
                    return h.get_tensor(name)
                sl = h.get_slice(name)
                return torch.stack([sl[int(r):int(r) + 1][0] for r in rows]) if len(rows) else \
                    sl[0:0]
        except Exception as e:
            raise DoctorError(f"target checkpoint {self.path}: cannot read {name} from {os.path.basename(f)} "
                              f"({e})") from None


def open_checkpoint(path: str) -> CheckpointTensors:
    """The tensor map of a checkpoint directory: its ``*.safetensors.index.json`` if it has one (every shard it
    names must exist), else the header of each ``*.safetensors`` in it."""
    require_file(path, "--target-checkpoint", allow_dir=True)
    if not os.path.isdir(path):
        raise DoctorError(f"--target-checkpoint {path}: expected the target's checkpoint directory (config.json, "
                          "model.safetensors.index.json and its shards)")
    indexes = sorted(glob.glob(os.path.join(path, "*.safetensors.index.json")))
    if len(indexes) > 1:
        raise DoctorError(f"--target-checkpoint {path}: {len(indexes)} shard indexes "
                          f"({[os.path.basename(i) for i in indexes]}); expected one")
    where: Dict[str, str] = {}
    if indexes:
        data = read_json(indexes[0], "shard index")
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise DoctorError(f"shard index {indexes[0]}: expected an object with 'weight_map' {{tensor name: file "
                              "name}}")
        from ...weights import shard_path

        for k, v in wm.items():
            try:
                where[k] = shard_path(path, v, indexes[0])
            except ValueError as e:
                raise DoctorError(str(e)) from None
        return CheckpointTensors(path, where, indexes[0])
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise DoctorError(f"--target-checkpoint {path}: no model.safetensors.index.json and no *.safetensors file")
    from safetensors import safe_open

    for f in files:
        try:
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    where[k] = f
        except Exception as e:
            raise DoctorError(f"--target-checkpoint {path}: {os.path.basename(f)} is not a readable safetensors "
                              f"file ({e})") from None
    return CheckpointTensors(path, where, None)


def _named(ck: CheckpointTensors, names, what: str) -> str:
    name = ck.find(names)
    if name is None:
        src = os.path.basename(ck.index) if ck.index else "its safetensors files"
        raise DoctorError(f"--target-checkpoint {ck.path}: no {what} in {src} (looked for {list(names)})")
    f = ck.where[name]
    if not os.path.isfile(f):
        raise DoctorError(f"--target-checkpoint {ck.path}: {name} is in {os.path.basename(f)}, which is missing")
    return name


def read_embedding(ck: CheckpointTensors, vocab_size: Optional[int], hidden_size: int, device: str = "cpu",
                   rows=None) -> torch.Tensor:
    """``embed_tokens`` [V, H] (or some of its rows), checked against the target's vocabulary and width."""
    name = _named(ck, EMBED_NAMES, "embed_tokens")
    _check_shape(ck, name, vocab_size, hidden_size)
    return ck.read(name, device, rows)


def embedding_rows(ck: CheckpointTensors) -> int:
    """The rows of the checkpoint's ``embed_tokens`` (its vocabulary), read from the shard's header alone."""
    shape, _ = ck.shape_dtype(_named(ck, EMBED_NAMES, "embed_tokens"))
    if len(shape) != 2:
        raise DoctorError(f"--target-checkpoint {ck.path}: embed_tokens is {shape}, expected [V, H]")
    return int(shape[0])


def read_lm_head(ck: CheckpointTensors, vocab_size: Optional[int], hidden_size: int, device: str = "cpu"
                 ) -> torch.Tensor:
    name = _named(ck, LM_HEAD_NAMES, "lm_head")
    _check_shape(ck, name, vocab_size, hidden_size)
    return ck.read(name, device)


def _check_shape(ck: CheckpointTensors, name: str, vocab_size: Optional[int], hidden_size: int) -> None:
    shape, dtype = ck.shape_dtype(name)
    if len(shape) != 2 or shape[1] != hidden_size or (vocab_size is not None and shape[0] != vocab_size):
        want = f"[{vocab_size if vocab_size is not None else 'V'}, {hidden_size}]"
        raise DoctorError(f"--target-checkpoint {ck.path}: {name} is {shape}, expected {want} (the served target's "
                          "vocabulary and width): a checkpoint of another model?")
    if not dtype.is_floating_point:
        raise DoctorError(f"--target-checkpoint {ck.path}: {name} is {dtype}; expected a floating-point (bf16/fp16/"
                          "fp32) embedding")


def checkpoint_config(path: str) -> dict:
    """The checkpoint's config.json, as a dict."""
    cfg = read_json(os.path.join(path, "config.json"), "target config")
    if not isinstance(cfg, dict):
        raise DoctorError(f"target config {path}/config.json: expected a JSON object")
    return cfg


def vocab_of(config: dict) -> Optional[int]:
    """The language model's vocabulary size in a target config (a multimodal wrapper's nested config first), None
    when it gives none."""
    sub = next((config[k] for k in ("text_config", "language_config", "llm_config")
                if isinstance(config.get(k), dict)), config)
    v = sub.get("vocab_size", config.get("vocab_size"))
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def config_vocab(path: str) -> Optional[int]:
    """vocab_of the target config at ``path`` (config.json, or a directory holding it)."""
    p = os.path.join(path, "config.json") if os.path.isdir(path) else path
    cfg = read_json(p, "target config")
    return vocab_of(cfg) if isinstance(cfg, dict) else None


class CheckpointSide:
    """What ``--target-checkpoint`` gives when there is no ``--target``: the config, the tokenizer, and the
    embedding / lm_head read alone from their shard."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.config = self.tokenizer = self.tensors = None
        self.vocab_size = None
        if path is None:
            return
        self.tensors = open_checkpoint(path)
        self.config = checkpoint_config(path)
        self.vocab_size = vocab_of(self.config)
        try:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception:  # no tokenizer files: prompts must then be token ids
            self.tokenizer = None

    def weights(self, info, device: str):
        if self.tensors is None:
            return None, None
        return (lambda: read_embedding(self.tensors, info.vocab_size, info.hidden_size, device),
                lambda: read_lm_head(self.tensors, info.vocab_size, info.hidden_size, device))


__all__ = ["CheckpointSide", "vocab_of", "config_vocab", "EMBED_NAMES", "LM_HEAD_NAMES", "CheckpointTensors", "open_checkpoint",
           "read_embedding", "read_lm_head", "embedding_rows", "checkpoint_config"]
