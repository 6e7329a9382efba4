"""How the training pipelines read a draft config's ids (pure Python, no torch: ``doctor check`` warns with it, and
the doctor's training-data fingerprint says which reading the data holds).

The key ``eagle_config.eagle_aux_hidden_state_layer_ids`` means different taps to different pipelines:

* SpecForge's HF backend hooks the *output* of decoder layer d for each id d, and ModelOpt reads them so too (it
  builds its list from a ``set``, so in no guaranteed order): LayerOutput(d), layer input d + 1;
* SpecForge's SGLang backend calls the target's ``set_eagle3_layers_to_capture(ids)`` of the SGLang it pins:
  specforge 0.2.0 (the registry's newest) requires sglang==0.5.14 (its METADATA; the call is in
  specforge/offline_capture/sglang_backend/capture.py set_eagle3_capture_layers). On 0.5.14 (as on 0.5.13 - 0.5.23)
  the DeepseekV2 family reads the ids as layer inputs unchanged unless ids[0] == 1 (then + 1); the Qwen MoE family
  always adds 1 (sglang_releases/ has the rule of every release, which serving may use instead).

``[2, 30, 58]`` (SpecForge's Kimi-K2 / K2.5 configs) is LayerOutput(2, 30, 58) from the first and
LayerOutput(1, 29, 57) from the second: one layer off, and nothing in the config says which. Only the training
data can tell (``doctor fingerprint --training-data``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from .sglang_releases import FAMILY_DEEPSEEK_V2, SPECFORGE_SGLANG, native_capture, release
from .spec import EMBEDDING, LayerOutput, TapError, TapSpec

HF_READING = "SpecForge HF backend / ModelOpt (output of layer d)"
SGLANG_READING = (f"SpecForge SGLang backend (specforge 0.2.0 pins sglang {SPECFORGE_SGLANG}: "
                  f"set_eagle3_layers_to_capture, {release(SPECFORGE_SGLANG).id_rule})")


@dataclass
class Readings:
    """A draft config's ids read by each pipeline, as layer inputs (None: that pipeline cannot read them, ``why``)."""

    ids: List[int]
    hf: Optional[List[int]]
    sglang: Optional[List[int]]
    sglang_error: Optional[str] = None

    @property
    def differ(self) -> bool:
        return self.hf != self.sglang

    @staticmethod
    def taps(inputs: Optional[Sequence[int]]) -> Optional[List[object]]:
        return None if inputs is None else [EMBEDDING if i == 0 else LayerOutput(i - 1) for i in inputs]


def readings_of(ids: Sequence[int], num_layers: int, hidden_size: int,
                family: str = FAMILY_DEEPSEEK_V2, sglang_release: str = SPECFORGE_SGLANG) -> Readings:
    """The ids as each pipeline reads them; the SGLang reading is that of ``sglang_release`` (default: the one
    SpecForge pins). Eager forwards: SpecForge's offline capture runs prefill batches."""
    try:
        spec = TapSpec.from_draft_ids(list(ids), num_layers, hidden_size)
        hf = [0 if t == EMBEDDING else t.k + 1 for t in spec.taps]
    except TapError:
        hf = None
    native = native_capture(list(ids), num_layers, hidden_size, sglang_release, family, cuda_graphs=False)
    if native.error:
        return Readings(list(ids), hf, None, native.error)
    return Readings(list(ids), hf, list(native.captured_inputs))


__all__ = ["HF_READING", "SGLANG_READING", "Readings", "readings_of"]
