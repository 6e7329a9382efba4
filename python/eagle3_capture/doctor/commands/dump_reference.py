"""``doctor dump-reference``: the training side's hidden states for some prompts, from a transformers model, written
for ``doctor fingerprint --reference`` (the file: :mod:`..fingerprint.reference_dump`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .. import arg_types as at
from .. import options
from ..common import EXIT_OK
from ..options import flag


DESCRIPTION = ("Runs a transformers model on the prompts and writes every hidden state (the HF hidden_states stack, "
               "whose last entry is post-norm, plus the final boundary taken before the final norm by a hook) to a "
               "safetensors file for doctor fingerprint.")


@dataclass(frozen=True, kw_only=True)
class Options:
    model: str = flag("--model", required=True, metavar="PATH|demo", help="transformers model directory, or 'demo'")
    prompts: str = flag("--prompts", required=True, metavar="FILE",
                        help="prompts: .json list (strings or token-id lists), .jsonl, or text with one prompt a line")
    out: str = flag("--out", required=True, metavar="REF.safetensors", type=at.output_file)
    new_tokens: int = flag("--new-tokens", type=at.NON_NEGATIVE, default=0,
                           help="also append the model's greedy continuation of this many tokens (default 0)")
    dtype: str = flag("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                      help="storage dtype of the hidden states (computed in the model's dtype)")
    device: str = options.device()
    threads: Optional[int] = options.threads()
    seed: int = options.seed("seed of the demo model (with --model demo)")


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


__all__ = ["DESCRIPTION", "Options", "ReferenceReport", "run", "render", "exit_code"]
