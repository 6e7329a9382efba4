"""``doctor dump-reference``: the training side's hidden states for some prompts, from a transformers model.

Writes a safetensors file (format ``eagle3-capture-reference/1``, read by ``doctor fingerprint``):

* ``hidden_states`` [L+1, T, H]: HF's ``output_hidden_states`` stack, index h = ``hidden_states[h]`` (0: embedding
  output, k+1: output of layer k; L: the last entry, post-final-norm in DeepseekV3, Llama, Qwen and most others);
* ``final_prenorm`` [T, H]: the final boundary LayerOutput(L-1), the residual stream *before* the final norm,
  taken by a forward pre-hook on ``model.model.norm`` -- the value a draft trained on draft id L-1 saw, and the one
  HF's stack does not hold;
* ``input_ids`` [T], ``positions`` [T] (within each prompt), ``prompt_offsets`` [n+1]: the prompts, concatenated.

The server must see the same token ids: send them as ids (SGLang's ``/generate`` with ``input_ids``), since a chat
template or another tokenizer changes them.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from ..bounds import check_positions
from ..common import save_safetensors
from ..progress import bar as progress_bar
from ..target_side.model import Target, greedy_continue, residual_stream
from .files import REFERENCE_FORMAT


@torch.no_grad()
def reference_tensors(target: Target, prompts: Sequence[Sequence[int]], new_tokens: int = 0,
                      dtype: torch.dtype = torch.float32, progress: bool = False) -> dict:
    """The tensors of a reference file for these prompts (each optionally extended by the target's greedy
    continuation of ``new_tokens`` tokens)."""
    device = next(target.model.parameters()).device
    hs_all, pre_all, ids_all, pos_all, offsets = [], [], [], [], [0]
    bar = progress_bar(len(prompts), "reference", "prompt", progress)
    for p in prompts:
        ids = torch.tensor([list(p)], dtype=torch.int64, device=device)
        if new_tokens > 0:
            ids = greedy_continue(target.model, ids, new_tokens)
        stack, post, _ = residual_stream(target.model, ids)
        # stack [1, T, L+1, H]: 0..L-1 are HF hidden_states[0..L-1]; L is the pre-norm final boundary
        L = stack.shape[2] - 1
        hs = torch.cat([stack[0, :, :L].transpose(0, 1), post[0][None]], 0)  # [L+1, T, H]
        hs_all.append(hs.to("cpu", dtype))
        pre_all.append(stack[0, :, L].to("cpu", dtype))
        ids_all.append(ids[0].cpu())
        pos_all.append(torch.arange(ids.shape[1]))
        offsets.append(offsets[-1] + ids.shape[1])
        bar.update(1)
    bar.close()
    return {
        "hidden_states": torch.cat(hs_all, 1), "final_prenorm": torch.cat(pre_all, 0),
        "input_ids": torch.cat(ids_all), "positions": torch.cat(pos_all),
        "prompt_offsets": torch.tensor(offsets, dtype=torch.int64),
    }


def write_reference(path: str, tensors: dict, *, num_layers: int, hidden_size: int, source: str) -> None:
    final_is_prenorm = bool(torch.equal(tensors["hidden_states"][-1], tensors["final_prenorm"]))
    save_safetensors(path, tensors, {"format": REFERENCE_FORMAT, "num_layers": num_layers,
                                     "hidden_size": hidden_size, "model": source,
                                     "last_entry_is_prenorm": final_is_prenorm})


def dump_reference(target: Target, prompts: List[List[int]], out: str, new_tokens: int = 0,
                   dtype: torch.dtype = torch.float32, progress: bool = False) -> dict:
    check_positions(target.model, prompts, new_tokens, 0, "--new-tokens")
    t = reference_tensors(target, prompts, new_tokens, dtype, progress)
    write_reference(out, t, num_layers=target.num_layers, hidden_size=target.hidden_size, source=target.source)
    return t


__all__ = ["reference_tensors", "write_reference", "dump_reference"]
