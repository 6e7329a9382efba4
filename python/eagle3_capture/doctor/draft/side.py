"""The draft side: the draft checkpoint loaded for a target (its declared taps read against the target's layer count
and width, ``--taps`` to replay another capture), with its embedding / lm_head from wherever the target side can
give them when the checkpoint lacks them (SGLang shares the target's)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ... import configs
from ...spec import CONVENTIONS, TapError, TapSpec
from ..common import DoctorError
from ..target_side.side import TargetInfo


def parse_taps(text: str, num_layers: int, hidden_size: int) -> TapSpec:
    """``"<convention>:<i,j,...>"`` with convention draft_ids | layer_inputs | hf_hidden_states (``hf`` for short),
    or bare integers (draft ids)."""
    conv, sep, rest = text.partition(":")
    if not sep:
        conv, rest = "draft_ids", text
    conv = {"hf": "hf_hidden_states", "draft": "draft_ids", "inputs": "layer_inputs"}.get(conv.strip(), conv.strip())
    if conv not in CONVENTIONS:
        raise DoctorError(f"--taps {text!r}: unknown convention {conv!r}; expected one of {sorted(CONVENTIONS)} "
                          "(e.g. draft_ids:-1,2,5)")
    try:
        ids = [int(v) for v in rest.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise DoctorError(f"--taps {text!r}: expected comma-separated integers after '{conv}:'") from None
    opts = {"allow_final_boundary": True} if conv == "layer_inputs" else (
        {"final_is_prenorm": True} if conv == "hf_hidden_states" else {})
    try:
        return TapSpec.from_convention(conv, ids, num_layers, hidden_size, **opts)
    except TapError as e:
        raise DoctorError(f"--taps {text!r}: {e}") from None


def draft_dtype(name: Optional[str], device: str, with_target: bool) -> torch.dtype:
    """``--dtype``: auto is float32 beside a transformers target (the replay as it always ran) and on the CPU,
    bfloat16 on a GPU without one (what a server runs, at half the memory)."""
    name = (name or "auto").lower()
    if name == "auto":
        return torch.bfloat16 if (str(device).startswith("cuda") and not with_target) else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise DoctorError(f"--dtype {name!r}: expected auto, float32 or bfloat16")
    return table[name]


def draft_vocab_sizes(draft_path: str) -> Tuple[Optional[int], Optional[int]]:
    """The draft config's (``vocab_size``: the target's vocabulary, ``draft_vocab_size``: the draft's own head,
    ``vocab_size`` where it has none), each None when absent; read before the draft is loaded (``online`` without
    ``--target`` bounds the flags by them before asking the server anything)."""
    from ..common import read_json

    cfg = read_json(os.path.join(draft_path, "config.json"), "draft config")

    def get(key):
        v = cfg.get(key) if isinstance(cfg, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    return get("vocab_size"), get("draft_vocab_size") or get("vocab_size")


@dataclass
class DraftSide:
    draft: object                   # model.Eagle3Draft
    taps: TapSpec                   # what the replay feeds it
    declared: Optional[TapSpec]     # what its config declares (None when unusable and --taps given)
    notes: List[str] = field(default_factory=list)

    @property
    def layer_input_ids(self) -> List[int]:
        from ..target_side.side import layer_inputs

        return layer_inputs(self.taps)


def load_draft_side(draft_path: str, info: TargetInfo, taps: Optional[str], device: str,
                    dtype: Optional[torch.dtype] = None, embed=None, lm_head=None) -> DraftSide:
    """The draft for this target. ``embed`` / ``lm_head``: a tensor, or a function giving one, used only when the
    checkpoint has none."""
    from .checkpoint import load_draft

    draft = load_draft(draft_path, embed, lm_head, device=device, dtype=dtype)
    dcfg = configs.read_draft_config(os.path.join(draft_path, "config.json"))
    notes: List[str] = list(getattr(draft, "notes", []))
    declared = None
    try:
        declared = configs.draft_taps(dcfg, info.config)
    except (TapError, ValueError) as e:
        if taps is None:
            raise DoctorError(f"the draft's declared taps do not fit the target: {e}; give --taps") from None
        notes.append(f"declared taps unusable ({e})")
    spec = parse_taps(taps, info.num_layers, info.hidden_size) if taps else declared
    if spec.K != draft.arch.num_aux:
        raise DoctorError(f"the draft's fc takes K={draft.arch.num_aux} taps of H={draft.arch.target_hidden_size}, "
                          f"--taps gives K={spec.K}: {list(spec.taps)}")
    if spec.hidden_size != draft.arch.target_hidden_size:
        raise DoctorError(f"the draft was built for a target of H={draft.arch.target_hidden_size}, this target has "
                          f"H={spec.hidden_size}")
    if info.vocab_size is not None and draft.arch.vocab_size != info.vocab_size:
        raise DoctorError(f"the draft's vocab_size is {draft.arch.vocab_size}, the target's {info.vocab_size}: a "
                          "draft for another model?")
    return DraftSide(draft, spec, declared, notes)


__all__ = ["parse_taps", "draft_dtype", "draft_vocab_sizes", "DraftSide", "load_draft_side"]
