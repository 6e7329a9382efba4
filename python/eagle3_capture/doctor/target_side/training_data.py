"""SpecForge's offline training data, read as the ground truth of what a draft was trained on.

``scripts/prepare_hidden_states.py`` writes one ``torch.save`` dict per sample, ``<out>/rows_<a>-<b>/data_<i>.ckpt``:
``input_ids`` [T] (or [1, T]), ``loss_mask`` [T], ``hidden_state`` [1, T, H] (the target's last hidden state, after
its final norm) and ``aux_hidden_state`` [1, T, K*H] (the K taps the draft is trained on, concatenated, bf16).
Nothing in a sample says which layers the K slots were: the SpecForge HF backend hooks the *output* of layer d for
each id d, its SGLang backend (and SGLang serving) reads the same ids as layer *inputs* unless ids[0] == 1. Which
one a sample holds is what the fingerprint measures (``fingerprint.training``).
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import List, Optional

import torch

from ..common import DoctorError, require_file, shown

_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass
class TrainingSample:
    path: str
    input_ids: torch.Tensor            # [T] int64
    loss_mask: Optional[torch.Tensor]  # [T]
    aux: torch.Tensor                  # [T, K*H]
    hidden_state: Optional[torch.Tensor]  # [T, H]

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def _index(path: str) -> int:
    m = re.search(r"data_(\d+)\.ckpt$", path)
    return int(m.group(1)) if m else -1


def training_files(path: str) -> List[str]:
    """The sample files of a SpecForge hidden-states directory (``rows_*/data_*.ckpt``, any depth), by sample
    index; or the one file given."""
    require_file(path, "--training-data", allow_dir=True)
    if not os.path.isdir(path):
        return [path]
    files = [f for f in glob.glob(os.path.join(path, "**", "*.ckpt"), recursive=True) if os.path.isfile(f)]
    if not files:
        raise DoctorError(f"--training-data {path}: no *.ckpt sample in it (SpecForge's prepare_hidden_states.py "
                          "writes rows_<a>-<b>/data_<i>.ckpt)")
    return sorted(files, key=lambda f: (_index(f), f))


def _squeeze_batch(v: torch.Tensor, dims: int) -> torch.Tensor:
    return v[0] if v.dim() == dims + 1 and v.shape[0] == 1 else v


def load_sample(path: str, hidden_size: Optional[int] = None) -> TrainingSample:
    what = f"--training-data {path}"
    try:
        d = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # a truncated or foreign file
        raise DoctorError(f"{what}: not a readable SpecForge sample (torch.load: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(d, dict):
        raise DoctorError(f"{what}: expected a dict with input_ids, loss_mask, hidden_state, aux_hidden_state; got "
                          f"{type(d).__name__}")
    ids = d.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dtype not in _INT:
        raise DoctorError(f"{what}: 'input_ids' must be an integer tensor [T], got {shown(ids)}")
    ids = _squeeze_batch(ids, 1)
    if ids.dim() != 1 or ids.numel() == 0:
        raise DoctorError(f"{what}: 'input_ids' must be [T] or [1, T], got shape {tuple(d['input_ids'].shape)}")
    T = ids.numel()
    aux = d.get("aux_hidden_state")
    if aux is None:
        raise DoctorError(f"{what}: no 'aux_hidden_state' (the draft's taps): written without "
                          "--enable-aux-hidden-states?")
    if not isinstance(aux, torch.Tensor) or aux.dtype not in _FLOAT:
        raise DoctorError(f"{what}: 'aux_hidden_state' must be a floating tensor [1, T, K*H], got {shown(aux)}")
    aux = _squeeze_batch(aux, 2)
    if aux.dim() != 2 or aux.shape[0] != T:
        raise DoctorError(f"{what}: 'aux_hidden_state' is {tuple(d['aux_hidden_state'].shape)}; expected [1, {T}, "
                          "K*H] (one row per input id)")
    if hidden_size is not None and aux.shape[1] % hidden_size:
        raise DoctorError(f"{what}: 'aux_hidden_state' is {aux.shape[1]} wide, not a multiple of the target's "
                          f"hidden size {hidden_size}: training data of another model")
    hs = d.get("hidden_state")
    if hs is not None:
        if not isinstance(hs, torch.Tensor) or hs.dtype not in _FLOAT:
            raise DoctorError(f"{what}: 'hidden_state' must be a floating tensor [1, T, H], got {shown(hs)}")
        hs = _squeeze_batch(hs, 2)
        if hs.dim() != 2 or hs.shape[0] != T or (hidden_size is not None and hs.shape[1] != hidden_size):
            raise DoctorError(f"{what}: 'hidden_state' is {tuple(d['hidden_state'].shape)}; expected [1, {T}, "
                              f"{hidden_size or 'H'}]")
    mask = d.get("loss_mask")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise DoctorError(f"{what}: 'loss_mask' must be a tensor [T], got {shown(mask)}")
        mask = mask.reshape(-1)
        if mask.numel() != T:
            raise DoctorError(f"{what}: 'loss_mask' has {mask.numel()} entries, input_ids {T}")
    return TrainingSample(path, ids.to(torch.int64), mask, aux, hs)


def save_sample(path: str, input_ids: torch.Tensor, aux: torch.Tensor, hidden_state: torch.Tensor,
                loss_mask: Optional[torch.Tensor] = None) -> None:
    """One sample in SpecForge's layout (tests and benchmarks write training data with it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ids = input_ids.reshape(-1).to(torch.int64).cpu()
    torch.save({"input_ids": ids, "loss_mask": (loss_mask if loss_mask is not None else torch.ones_like(ids)).cpu(),
                "hidden_state": hidden_state.reshape(1, ids.numel(), -1).cpu(),
                "aux_hidden_state": aux.reshape(1, ids.numel(), -1).cpu()}, path)


__all__ = ["TrainingSample", "training_files", "load_sample", "save_sample"]
