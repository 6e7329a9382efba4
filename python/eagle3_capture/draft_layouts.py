"""The EAGLE-3 draft layouts this project serves and runs, one row each: the draft config's architecture -> the SGLang
draft model the plugin hooks and the hook (the fused fc for that model), the doctor's plain-torch attention for it,
and the reader that checks the layout's own config fields. Every user reads its column here -- the plugin's hook
table (sglang/draft.py) and its detection (sglang/installed/internals.py), the doctor's draft model, config.json
writer and checkpoint reader (doctor/draft/) -- so a new layout is a new row (and the functions it names), never a
flag threaded through those modules.

Implementations are named as ``"module:attribute"`` under this package and imported only when used
(:func:`implementation`): this module stays pure Python (the doctor's ``check`` and the plugin's registration read it
without torch or SGLang), and a copy of the package loaded under another name (benchmarks/hook_timing.py) resolves
its own modules.
"""
from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class DraftLayout:
    name: str                     # short name ("llama", "mla")
    architecture: str             # config.json ``architectures[0]``
    model_type: str               # config.json ``model_type`` the doctor writes for it
    what: str                     # how messages name it
    sglang_forward: str           # the SGLang draft model forward the plugin hooks (AROUND), a dotted path
    plugin_hook: str              # that hook: the fused fc of this layout ("module:attribute")
    doctor_attention: str         # the doctor's attention (an nn.Module class built from a DraftArch)
    config_reader: str            # (config dict, label) -> this layout's own DraftArch fields, each checked
    marker: Optional[str] = None  # the DraftArch field whose being set selects this layout (None: the default one)
    config_fields: Tuple[str, ...] = ()  # DraftArch fields its config.json carries besides the common ones
    config_drops: Tuple[str, ...] = ()   # common config.json keys its config does not carry
    gather_attr: Optional[str] = None    # the attribute by which SGLang all-gathers a column-sharded fc, if it does
    rope_scaling_offline: bool = False   # whether the doctor's attention applies the config's rope_scaling


LLAMA = DraftLayout(
    name="llama", architecture="LlamaForCausalLMEagle3", model_type="llama",
    what="the SpecForge / SGLang llama_eagle3 layout",
    sglang_forward="sglang.srt.models.llama_eagle3.LlamaModel.forward",
    plugin_hook="sglang.draft:llama_forward_hook",
    doctor_attention="doctor.draft.model:LlamaAttention",
    config_reader="doctor.draft.validate:llama_fields")

MLA = DraftLayout(
    name="mla", architecture="Eagle3DeepseekV2ForCausalLM", model_type="deepseek_v3",
    what="SGLang's kimi_k25_eagle3, MLA",
    sglang_forward="sglang.srt.models.kimi_k25_eagle3.Eagle3MLAModel.forward",
    plugin_hook="sglang.draft:mla_forward_hook",
    doctor_attention="doctor.draft.mla:MLAAttention",
    config_reader="doctor.draft.validate:mla_fields",
    marker="q_lora_rank",
    config_fields=("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                   "rope_scaling", "rope_interleave"),
    config_drops=("num_key_value_heads", "head_dim"),
    gather_attr="_fc_gatherer", rope_scaling_offline=True)

LAYOUTS: Tuple[DraftLayout, ...] = (LLAMA, MLA)


def by_architecture(architecture: Optional[str]) -> Optional[DraftLayout]:
    """The layout of a config's ``architectures[0]``, or None when no row has it."""
    return next((lay for lay in LAYOUTS if lay.architecture == architecture), None)


def of_fields(arch) -> DraftLayout:
    """The layout a DraftArch (or anything with its fields) describes: the first row whose marker field is set,
    else the default row (the one without a marker)."""
    for lay in LAYOUTS:
        if lay.marker is not None and getattr(arch, lay.marker, None):
            return lay
    return next(lay for lay in LAYOUTS if lay.marker is None)


def implementation(ref: str):
    """The object a row names (``"module:attribute"``, the module under this package), imported now."""
    return pkgutil.resolve_name(f"{__package__}.{ref}")


__all__ = ["DraftLayout", "LLAMA", "MLA", "LAYOUTS", "by_architecture", "of_fields", "implementation"]
