"""The target side of the doctor, one interface whatever supplies it.

A draft is judged against its target through three things per prompt: the token sequence (the prompt, the
target's greedy continuation, and the few tokens past it that the last verifies of SGLang's loop look at), the
target's greedy token at each position, and the residual stream at the taps the draft declares. Four sources give
them:

=====================  ===================================================  =========================================
source                 sequence and greedy tokens                           residual stream at the taps
=====================  ===================================================  =========================================
a transformers model   its own greedy continuation; argmax of its logits    its hidden states (model_side)
(``--target``)         over the whole sequence in one forward
a live server          the server's response (+ a short extension), then    the plugin's stream dump of that
(``--server URL``)     one teacher-forced prefill: SGLang's input logprobs  teacher-forced prefill (server_side)
a recorded dump        the dumped teacher-forced request's token ids; the   the same records (dump_side)
(``--hidden-states``)  greedy token at t is the sequence's token t+1
SpecForge training     the sample's input_ids                               its aux_hidden_state slots, whatever
data                                                                        layers they were (training_data; for
                                                                            the fingerprint only)
=====================  ===================================================  =========================================

``accept``, ``online`` and ``demo`` read a :class:`TargetSide` (``accept`` and ``online`` open it with
:mod:`.open`); the replay (``replay.evaluate``) needs nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch

from ... import configs
from ...spec import EMBEDDING, TapSpec
from ..progress import bar as progress_bar


@dataclass(frozen=True)
class TargetInfo:
    """The target's facts the draft's taps and the flag rules depend on."""

    num_layers: int
    hidden_size: int
    vocab_size: Optional[int]
    architecture: Optional[str]
    config: configs.TargetConfig


def info_from_config(cfg: configs.TargetConfig, vocab_size: Optional[int]) -> TargetInfo:
    arch = cfg.architectures[0] if cfg.architectures else None
    return TargetInfo(cfg.num_layers, cfg.hidden_size, vocab_size, arch, cfg)


@dataclass
class TargetBatch:
    """Prompts of one length, side by side. ``greedy[:, t]`` is the target's greedy token after position t (what
    it would emit there); positions in the prompt may be -1 where a source does not know it (the replay looks only
    at positions from the last prompt token on)."""

    indices: List[int]             # which prompts, in the caller's order
    prompt_len: int
    seq: torch.Tensor              # [B, T] int64
    greedy: torch.Tensor           # [B, T] int64
    taps: torch.Tensor             # [B, T, K*H], the residual stream at the asked taps, packed in tap order
    expected: Optional[torch.Tensor] = None  # [B, T]: the target's own token at each position, to check a server's
    #                                          outputs against (None: seq, the target's own continuation)


def layer_inputs(spec: TapSpec) -> List[int]:
    """Each tap's layer-input index (0 the embedding, k+1 LayerOutput(k), L the final boundary before the final
    norm): the numbering of SGLang's ``layers_to_capture``, of the dump's stream and of the stack that
    ``model.residual_stream`` returns."""
    return [0 if t == EMBEDDING else t.k + 1 for t in spec.taps]


def length_groups(prompts: Sequence[Sequence[int]], batch_size: int) -> List[List[int]]:
    """Prompt indices in batches of equal length (prompts of one length batch together)."""
    groups = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    return [g[i:i + batch_size] for _, g in sorted(groups.items()) for i in range(0, len(g), batch_size)]


class TargetSide:
    """Base of the sources above. ``batches`` yields every prompt once, in batches of equal length, each with
    ``continuation`` tokens after the prompt (new tokens + the draft steps the last verifies look past them); a
    source says how it makes one batch (:meth:`batch`)."""

    source: str = ""
    tokenizer = None

    def __init__(self):
        self.notes: List[str] = []

    @property
    def info(self) -> TargetInfo:  # pragma: no cover - every source defines it
        raise NotImplementedError

    def prompt_name(self, i: int) -> str:
        """Prompt i in messages (a source that reads it from somewhere says where)."""
        return f"prompt {i}"

    def batch(self, prompts: Sequence[List[int]], members: List[int], continuation: int,
              wanted: List[int]) -> TargetBatch:  # pragma: no cover - every source defines it
        """The prompts ``members`` (of one length) with ``continuation`` tokens each and the stream at the layer
        inputs ``wanted``."""
        raise NotImplementedError

    def batches(self, prompts: Sequence[List[int]], continuation: int, taps: TapSpec, batch_size: int,
                progress: bool = False, desc: str = "target") -> Iterator[TargetBatch]:
        wanted = layer_inputs(taps)
        bar = progress_bar(len(prompts), desc, "prompt", progress)
        try:
            for members in length_groups(prompts, batch_size):
                yield self.batch(prompts, members, continuation, wanted)
                bar.update(len(members))
        finally:
            bar.close()


__all__ = ["TargetInfo", "info_from_config", "TargetBatch", "TargetSide", "layer_inputs", "length_groups"]
