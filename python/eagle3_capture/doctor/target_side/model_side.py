"""The target side from a transformers model (``--target PATH|demo``): its greedy continuation with its KV cache,
then one forward over the whole sequence for the greedy token at every position (argmax of the logits) and the
residual stream at the asked taps (``model.residual_stream``: the final boundary taken before the final
norm)."""
from __future__ import annotations

from typing import List, Sequence

import torch

from ... import configs
from ..common import DoctorError
from .model import Target, greedy_continue, residual_stream
from .side import TargetBatch, TargetInfo, TargetSide, info_from_config


class TransformersTarget(TargetSide):
    def __init__(self, target: Target):
        super().__init__()
        self.target = target
        self.source = target.source
        self.tokenizer = target.tokenizer
        try:
            cfg = configs.read_target_config(target.config_dict)
        except ValueError as e:
            raise DoctorError(f"target {target.source}: {e}") from None
        self._info = info_from_config(cfg, target.vocab_size)

    @classmethod
    def load(cls, path: str, device: str = "cpu", seed: int = 0, quiet: bool = False) -> "TransformersTarget":
        from .model import load_target

        return cls(load_target(path, device=device, seed=seed, quiet=quiet))

    @property
    def info(self) -> TargetInfo:
        return self._info

    @property
    def device(self):
        return next(self.target.model.parameters()).device

    def batch(self, prompts: Sequence[List[int]], members: List[int], continuation: int,
              wanted: List[int]) -> TargetBatch:
        ids = torch.tensor([prompts[i] for i in members], dtype=torch.int64, device=self.device)
        seq = greedy_continue(self.target.model, ids, continuation)
        stack, _, greedy = residual_stream(self.target.model, seq)
        B, T = seq.shape
        return TargetBatch(members, ids.shape[1], seq, greedy, stack[:, :, wanted].reshape(B, T, -1))


__all__ = ["TransformersTarget"]
