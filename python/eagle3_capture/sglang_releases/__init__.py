"""Every SGLang release from 0.5.8 through 0.5.23 (each one on the registry, .post releases included), modelled
from its released wheel: how ``set_eagle3_layers_to_capture`` turns an EAGLE-3 draft's ids into layer-input
indices, how DeepseekV2Model captures them (and what it raises), the capture-only mode, the plugin registry, the
torch pin, and where each of the plugin's hook points lives in that release.

Pure Python (no torch, no SGLang import): the doctor uses it anywhere, and the plugin asks it which capture
variant (adapter) the installed release needs and what stock SGLang would have captured.

Read in the wheels (``pip download --no-deps sglang==X``), 2026-12-03. Paths below are inside the ``sglang/srt``
package of the release named first; a rule holds for every release of its range (the function's source is the
same, or differs only in lines that do not touch the rule). The central facts:

* Target side, which ids: every release reads only ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` of the
  draft config (any exception -> None -> the default layers): 0.5.8 ``model_executor/model_runner.py
  ModelRunner.__init__`` (inline, through 0.5.15.post1); 0.5.16 ``model_executor/model_runner_components/
  spec_aux_hidden_state.py _resolve_eagle_aux_hidden_state`` (through 0.5.23).
* The id rule, ``models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``: 0.5.8 - 0.5.12.post1
  ``[val + 1 for val in layer_ids]`` (+1 on every id); 0.5.13 - 0.5.23 ``+1`` only ``if layer_ids and
  layer_ids[0] == 1``, else the ids unchanged. ``None`` -> ``[2, L // 2, L - 3]`` everywhere.
* How DeepseekV2Model captures (``models/deepseek_v2.py DeepseekV2Model.forward``): 0.5.8 - 0.5.13.post1 appends
  ``hidden_states + residual`` in its layer loop ("list-in-loop"): at layer input 0 the residual is still None and
  the add raises ``TypeError``; 0.5.14 - 0.5.16 hands the list into each layer (``captured_last_layer_outputs``),
  and ``layers/communicator.py LayerCommunicator.prepare_attn_and_capture_last_layer_outputs`` appends the
  residual after the input norm, the embedding at layer input 0 ("list-into-layer"); 0.5.17 - 0.5.21 hands an
  ``AuxHiddenStatePacker`` (``layers/aux_hidden_states.py``) instead ("packer"), whose ``finalize`` checks the count
  (0.5.17 - 0.5.19 by ``assert``, 0.5.20 on by ``RuntimeError``); 0.5.21 - 0.5.23 keep the residual in the
  batch's residual stream and capture through the layer boundary (``layers/layer_boundary/stage.py
  StageBoundary._prepare_attention``: keyword ``captured_last_layer_outputs`` on 0.5.21, ``capture_gathered`` on
  0.5.22+) into the packer ("packer+layer-boundary"); their final norm is ``layers/layer_boundary/residual/batch.py
  norm(capture_output=)`` on 0.5.21 and ``final_norm(capture=)`` on 0.5.22+ (the plugin's adapter is the same
  one, its final-boundary hook follows the function, sglang/installed/internals.py).
* 0.5.8 - 0.5.10.post1: ``model_executor/cuda_graph_runner.py CudaGraphRunner.__init__`` calls
  ``set_eagle3_layers_to_capture()`` with no ids before capturing, and ``ModelRunner.initialize`` sets the draft's
  ids only after ``init_device_graphs``: forwards replayed from CUDA graphs (decode / target verify) capture the
  default layers, eager forwards (prefill) the ids. 0.5.11 moved ``init_aux_hidden_state_capture()`` before the
  graphs ("Must be called BEFORE init_device_graphs()").

The package: versions.py (the releases and their order), hook_points.py (where each plugin hook lives per release),
catalogue.py (each release's facts as step tables, and what this project does with it: the plugin's range, the CPU
machine, the doctor's serving model, the test matrix), stock_capture.py (what stock SGLang does with a draft's ids),
outlook.py (the same ids on every release at once). It has the shape every engine's table has
(eagle3_capture/release_table.py); docs/sglang_releases.md is printed from it, and CONTRIBUTING.md's "Adding an
SGLang release" says what a new release takes.
"""
from __future__ import annotations

from .catalogue import (COUNT_CHECK_ASSERT, COUNT_CHECK_NONE, COUNT_CHECK_RAISE, ERROR_AT_DRAFT_FC, ERROR_AT_FORWARD,
                        ERROR_AT_LOAD, FAMILIES, FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE, ID_RULE_PLUS_ONE_ALWAYS,
                        ID_RULE_PLUS_ONE_IF_FIRST_IS_1, IDS_KEY_EAGLE_CONFIG, MATRIX_KINDS, RELEASES, SUPPORTED_RANGE,
                        VARIANT_LIST_IN_LOOP, VARIANT_LIST_INTO_LAYER, VARIANT_PACKER, VARIANT_PACKER_LAYER_BOUNDARY,
                        VARIANTS, SGLangRelease, assumed_release, installed_sglang_version, matrix, model_support_error,
                        release, serving_model_release, sglang_family, supported)
from .hook_points import HOOK_POINTS, HookPoint
from .outlook import ReleaseSpan, release_outlook
from .stock_capture import (NativeCapture, capture_only, capture_only_ids_for, check_release, compare_native_capture,
                            default_layers_to_capture, ids_for, layers_to_capture, native_capture)
from .versions import ENGINE, KNOWN_RANGE, KNOWN_VERSIONS, NEWEST, OLDEST, SPECFORGE_SGLANG

__all__ = [
    "ID_RULE_PLUS_ONE_ALWAYS", "ID_RULE_PLUS_ONE_IF_FIRST_IS_1", "VARIANT_LIST_IN_LOOP", "VARIANT_LIST_INTO_LAYER",
    "VARIANT_PACKER", "VARIANT_PACKER_LAYER_BOUNDARY", "VARIANTS", "COUNT_CHECK_NONE", "COUNT_CHECK_ASSERT",
    "COUNT_CHECK_RAISE", "FAMILY_DEEPSEEK_V2", "FAMILY_QWEN_MOE", "FAMILIES", "ERROR_AT_LOAD", "ERROR_AT_FORWARD",
    "ERROR_AT_DRAFT_FC", "IDS_KEY_EAGLE_CONFIG", "HookPoint", "HOOK_POINTS", "SGLangRelease", "RELEASES", "ENGINE",
    "KNOWN_VERSIONS", "KNOWN_RANGE", "OLDEST", "NEWEST", "SPECFORGE_SGLANG", "supported", "SUPPORTED_RANGE", "serving_model_release",
    "matrix", "MATRIX_KINDS", "release", "installed_sglang_version", "assumed_release", "sglang_family",
    "model_support_error", "default_layers_to_capture", "layers_to_capture", "NativeCapture", "native_capture",
    "capture_only", "ids_for", "capture_only_ids_for", "compare_native_capture", "check_release", "ReleaseSpan",
    "release_outlook",
]
