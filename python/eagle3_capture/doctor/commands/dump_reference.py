"""``doctor dump-reference``: the training side's hidden states for some prompts, from a transformers model, written
for ``doctor fingerprint --reference`` (the file: :mod:`..fingerprint.reference_dump`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..common import EXIT_OK


@dataclass(frozen=True)
class Options:
    model: str
    prompts: str
    out: str
    new_tokens: int = 0
    dtype: str = "float32"     # the storage dtype of the hidden states (computed in the model's)
    device: str = "auto"
    threads: Optional[int] = None
    seed: int = 0


@dataclass
class ReferenceReport:
    out: str
    prompts: int
    tokens: int
    hidden_states: Tuple[int, ...]
    num_layers: int


def run(opts: Options) -> ReferenceReport:
    import torch

    from ..common import pick_device, read_prompts, torch_threads
    from ..fingerprint.reference_dump import dump_reference
    from ..target_side.model import load_target

    device = pick_device(opts.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[opts.dtype]
    with torch_threads(opts.threads):
        target = load_target(opts.model, device=device, seed=opts.seed, quiet=True)  # an error stays one line
        prompts = read_prompts(opts.prompts, target.tokenizer, vocab_size=target.vocab_size)
        t = dump_reference(target, prompts, opts.out, new_tokens=opts.new_tokens, dtype=dtype, progress=True)
    return ReferenceReport(opts.out, len(prompts), t["input_ids"].numel(), tuple(t["hidden_states"].shape),
                           target.num_layers)


def render(rep: ReferenceReport) -> str:
    return (f"wrote {rep.out}: {rep.prompts} prompt(s), {rep.tokens} tokens, hidden_states {rep.hidden_states} (HF "
            f"stack, last entry post-norm) + final_prenorm (LayerOutput({rep.num_layers - 1}) before the final norm)")


def exit_code(rep: ReferenceReport) -> int:
    return EXIT_OK


__all__ = ["Options", "ReferenceReport", "run", "render", "exit_code"]
