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
  one, its final-boundary hook follows the function, sglang/internals.py).
* 0.5.8 - 0.5.10.post1: ``model_executor/cuda_graph_runner.py CudaGraphRunner.__init__`` calls
  ``set_eagle3_layers_to_capture()`` with no ids before capturing, and ``ModelRunner.initialize`` sets the draft's
  ids only after ``init_device_graphs``: forwards replayed from CUDA graphs (decode / target verify) capture the
  default layers, eager forwards (prefill) the ids. 0.5.11 moved ``init_aux_hidden_state_capture()`` before the
  graphs ("Must be called BEFORE init_device_graphs()").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .findings import Finding, compare_taps, wanted_capture
from .spec import EMBEDDING, LayerOutput, Tap, TapError, TapSpec, as_index, positive_int, tap_error

__all__ = [
    "ID_RULE_PLUS_ONE_ALWAYS", "ID_RULE_PLUS_ONE_IF_FIRST_IS_1", "VARIANT_LIST_IN_LOOP", "VARIANT_LIST_INTO_LAYER",
    "VARIANT_PACKER", "VARIANT_PACKER_LAYER_BOUNDARY", "VARIANTS", "COUNT_CHECK_NONE", "COUNT_CHECK_ASSERT",
    "COUNT_CHECK_RAISE", "FAMILY_DEEPSEEK_V2", "FAMILY_QWEN_MOE", "FAMILIES", "ERROR_AT_LOAD", "ERROR_AT_FORWARD",
    "ERROR_AT_DRAFT_FC", "HookPoint", "HOOK_POINTS", "SGLangRelease", "RELEASES", "KNOWN_VERSIONS", "OLDEST",
    "NEWEST", "SPECFORGE_SGLANG", "release", "installed_sglang_version", "assumed_release", "sglang_family",
    "model_support_error", "default_layers_to_capture", "layers_to_capture", "NativeCapture", "native_capture",
    "capture_only", "ids_for", "capture_only_ids_for", "compare_native_capture", "check_release", "ReleaseSpan",
    "release_outlook",
]

ID_RULE_PLUS_ONE_ALWAYS = "+1 on every id"
ID_RULE_PLUS_ONE_IF_FIRST_IS_1 = "+1 only if ids[0] == 1"

# The plugin's adapters, one per way DeepseekV2Model captures (names shared with eagle3_capture.sglang).
VARIANT_LIST_IN_LOOP = "list-in-loop"
VARIANT_LIST_INTO_LAYER = "list-into-layer"
VARIANT_PACKER = "packer"
VARIANT_PACKER_LAYER_BOUNDARY = "packer+layer-boundary"
VARIANTS = (VARIANT_LIST_IN_LOOP, VARIANT_LIST_INTO_LAYER, VARIANT_PACKER, VARIANT_PACKER_LAYER_BOUNDARY)

# What stock DeepseekV2 does when it captures fewer slots than layers_to_capture has entries.
COUNT_CHECK_NONE = "none"        # a plain list: the draft's fc gets n*H features instead of K*H
COUNT_CHECK_ASSERT = "assert"    # AuxHiddenStatePacker.finalize: assert ..., "captured n of K aux hidden states"
COUNT_CHECK_RAISE = "raise"      # AuxHiddenStatePacker.finalize: raise RuntimeError("captured n of K ...")

FAMILY_DEEPSEEK_V2 = "deepseek_v2"
FAMILY_QWEN_MOE = "qwen_moe"
FAMILIES = (FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE)

# When stock SGLang fails (NativeCapture.error_at).
ERROR_AT_LOAD = "model load"          # set_eagle3_layers_to_capture raises, or the model has none
ERROR_AT_FORWARD = "target forward"   # the first target forward: CUDA-graph capture at startup, else the 1st request
ERROR_AT_DRAFT_FC = "draft fc"        # the target runs; the draft's fc receives the wrong width

# ----------------------------------------------------------------------------------------------------------------
# versions
# ----------------------------------------------------------------------------------------------------------------

# Every release on the registry from 0.5.8 through 0.5.23 (`pip index versions sglang`, 2026-12-03), oldest first.
KNOWN_VERSIONS: Tuple[str, ...] = (
    "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13",
    "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
    "0.5.22", "0.5.23",
)
OLDEST, NEWEST = KNOWN_VERSIONS[0], KNOWN_VERSIONS[-1]

# SpecForge 0.2.0 (the registry's newest) pins it: its METADATA says `Requires-Dist: sglang==0.5.14`, and its SGLang
# backend calls the target's own rule (specforge/offline_capture/sglang_backend/capture.py set_eagle3_capture_layers
# -> model.set_eagle3_layers_to_capture(layer_ids)).
SPECFORGE_SGLANG = "0.5.14"

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")
_KNOWN_RANGE = f"{OLDEST} .. {NEWEST}"


def _version_key(text: str) -> Optional[Tuple[int, int, int, int]]:
    """Sort key of a release version (N.N.N or N.N.N.postN; a .post sorts after its release), None if not one."""
    m = _VERSION_RE.match(text)
    if m is None:
        return None
    post = -1 if m.group(4) is None else int(m.group(4))
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), post


def _since(steps: Sequence[Tuple[str, object]], version: str) -> object:
    """The value of a step table (first version, value), oldest first, at ``version``."""
    key = _version_key(version)
    value = None
    for first, v in steps:
        if _version_key(first) <= key:
            value = v
    return value


# ----------------------------------------------------------------------------------------------------------------
# the step tables: (first release with the value, value), each read where its comment says
# ----------------------------------------------------------------------------------------------------------------

# sglang-X.dist-info/METADATA: Requires-Dist torch==..., transformers==...
_TORCH = (("0.5.8", "2.9.1"), ("0.5.11", "2.11.0"), ("0.5.18", "2.13.0"), ("0.5.22", "2.14.1"))
_TRANSFORMERS = (("0.5.8", "4.57.1"), ("0.5.10", "5.3.0"), ("0.5.11", "5.6.0"), ("0.5.13", "5.8.1"),
                 ("0.5.15", "5.12.1"), ("0.5.22", "5.19.0"))
# models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture (one source 0.5.8 - 0.5.12.post1, one
# 0.5.13 - 0.5.23).
_ID_RULE = (("0.5.8", ID_RULE_PLUS_ONE_ALWAYS), ("0.5.13", ID_RULE_PLUS_ONE_IF_FIRST_IS_1))
# models/deepseek_v2.py DeepseekV2Model.forward (and DeepseekV2DecoderLayer.forward from 0.5.14).
_VARIANT = (("0.5.8", VARIANT_LIST_IN_LOOP), ("0.5.14", VARIANT_LIST_INTO_LAYER), ("0.5.17", VARIANT_PACKER),
            ("0.5.21", VARIANT_PACKER_LAYER_BOUNDARY))
# layers/aux_hidden_states.py AuxHiddenStatePacker.finalize (no packer before 0.5.17).
_COUNT_CHECK = (("0.5.8", COUNT_CHECK_NONE), ("0.5.17", COUNT_CHECK_ASSERT), ("0.5.20", COUNT_CHECK_RAISE))
# arg_groups/fields/exec_.py enable_return_aux_hidden_states, arg_groups/validation_hook.py
# handle_aux_hidden_state_capture, model_runner_components/spec_aux_hidden_state.py
# _resolve_capture_only_aux_hidden_state: only 0.5.23 (no release before it has the flag).
_CAPTURE_ONLY = (("0.5.8", False), ("0.5.23", True))
# plugins/__init__.py load_plugins + plugins/hook_registry.py HookRegistry: from 0.5.11 (hook_registry.py is the
# same file 0.5.11 - 0.5.19; 0.5.20 only reformats one line).
_PLUGIN_REGISTRY = (("0.5.8", False), ("0.5.11", True))
# model_executor/cuda_graph_runner.py CudaGraphRunner.__init__ `set_eagle3_layers_to_capture()` before its capture,
# and model_executor/model_runner.py ModelRunner.initialize setting the ids after init_device_graphs: 0.5.8 -
# 0.5.10.post1. 0.5.11 ModelRunner.initialize calls init_aux_hidden_state_capture() before the graphs.
_GRAPHS_CAPTURE_DEFAULT = (("0.5.8", True), ("0.5.11", False))
# speculative/spec_info.py: EAGLEWorker (v1, speculative/eagle_worker.py) when overlap scheduling is off, through
# 0.5.12.post1; 0.5.13 removed eagle_worker.py and always returns EAGLEWorkerV2.
_EAGLE_WORKER_V1 = (("0.5.8", True), ("0.5.13", False))

# Target model types a release cannot serve with EAGLE-3 although the family's rule is modelled: model_type ->
# (first release that can, why the earlier ones cannot).
_MODEL_SUPPORT = {
    # models/qwen3_next.py: Qwen3NextForCausalLM has no set_eagle3_layers_to_capture in 0.5.8 / 0.5.8.post1, and
    # ModelRunner calls it unguarded.
    "qwen3_next": ("0.5.9", "AttributeError at model load: Qwen3NextForCausalLM has no set_eagle3_layers_to_capture "
                            "(models/qwen3_next.py) before 0.5.9"),
    # models/kimi_k25.py: absent in 0.5.8 / 0.5.8.post1; in 0.5.9 KimiK25ForConditionalGeneration has no
    # set_eagle3_layers_to_capture; 0.5.10 delegates it to its DeepseekV3 language_model.
    "kimi_k25": ("0.5.10", "KimiK25ForConditionalGeneration (models/kimi_k25.py) is absent before 0.5.9 and has no "
                           "set_eagle3_layers_to_capture in 0.5.9: AttributeError at model load"),
}


# ----------------------------------------------------------------------------------------------------------------
# hook points: where each dotted path the plugin hooks on 0.5.23 lives in each release, or its equivalent
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HookPoint:
    """One place the plugin attaches (``plugin_path``: its dotted path on 0.5.23, under ``sglang.srt.``; None for a
    row that exists only as an older equivalent) and, per range of releases, the dotted path that plays its part
    there (``eras``: (first release, path or None, note); a path ending in ``(name)`` means that function's
    parameter ``name``)."""

    name: str
    plugin_path: Optional[str]
    eras: Tuple[Tuple[str, Optional[str], str], ...]

    def path_in(self, version: str) -> Optional[str]:
        return _since([(first, path) for first, path, _ in self.eras], version)

    def note_in(self, version: str) -> str:
        return _since([(first, note) for first, _, note in self.eras], version)


_SPEC_AUX = "model_executor.model_runner_components.spec_aux_hidden_state"
_RUNNER = "model_executor.model_runner.ModelRunner"
_DSV2 = "models.deepseek_v2"
_PACKER = "layers.aux_hidden_states.AuxHiddenStatePacker"
_BATCH = "layers.layer_boundary.residual.batch"

HOOK_POINTS: Tuple[HookPoint, ...] = (
    HookPoint("resolve-ids", f"{_SPEC_AUX}._resolve_eagle_aux_hidden_state", (
        ("0.5.8", f"{_RUNNER}.__init__", "reads eagle_config['eagle_aux_hidden_state_layer_ids'] inline"),
        ("0.5.16", f"{_SPEC_AUX}._resolve_eagle_aux_hidden_state", ""))),
    HookPoint("draft-model-config", None, (
        ("0.5.8", None, "ModelRunner.__init__ builds the draft config with ModelConfig.from_server_args"),
        ("0.5.11", f"{_RUNNER}._build_model_config", "called by ModelRunner.__init__ with is_draft_model=True"),
        ("0.5.13", None, "ModelRunner.__init__ builds the draft config with ModelConfig.from_server_args"),
        ("0.5.14", f"{_RUNNER}._build_model_config", "called by ModelRunner.__init__ with is_draft_model=True"),
        ("0.5.16", None, "_resolve_eagle_aux_hidden_state builds it with ModelConfig.from_server_args"))),
    HookPoint("set-layers", f"{_DSV2}.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture", (
        ("0.5.8", f"{_DSV2}.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture", ""),)),
    HookPoint("set-layers-caller", None, (
        ("0.5.8", f"{_RUNNER}.initialize", "after init_device_graphs; CudaGraphRunner.__init__ first calls "
                                           "set_eagle3_layers_to_capture() with no ids"),
        ("0.5.11", f"{_RUNNER}.init_aux_hidden_state_capture", "called before init_device_graphs"),
        ("0.5.16", "model_executor.model_runner_components.attention_backend_setup.configure_aux_hidden_state_capture",
         "called before the graphs"))),
    HookPoint("model-forward", f"{_DSV2}.DeepseekV2Model.forward", (
        ("0.5.8", f"{_DSV2}.DeepseekV2Model.forward", ""),)),
    HookPoint("layer-capture-param", None, (
        ("0.5.8", None, "DeepseekV2Model.forward appends hidden_states + residual in its loop"),
        ("0.5.14", f"{_DSV2}.DeepseekV2DecoderLayer.forward(captured_last_layer_outputs)", ""))),
    HookPoint("capture-site", None, (
        ("0.5.8", f"{_DSV2}.DeepseekV2Model.forward", "aux_hidden_states.append(hidden_states + residual) in the "
                                                      "layer loop"),
        ("0.5.14", "layers.communicator.LayerCommunicator.prepare_attn_and_capture_last_layer_outputs",
         "captured_last_layer_outputs.append(residual)"),
        ("0.5.21", "layers.layer_boundary.stage.StageBoundary._prepare_attention",
         "captured_last_layer_outputs.capture(...)"),
        ("0.5.22", "layers.layer_boundary.stage.StageBoundary._prepare_attention", "capture_gathered.capture(...)"))),
    HookPoint("packer-init", f"{_PACKER}.__init__", (
        ("0.5.8", None, "no packer: a plain list"), ("0.5.17", f"{_PACKER}.__init__", ""))),
    HookPoint("packer-append", f"{_PACKER}.append", (
        ("0.5.8", None, "no packer: list.append"), ("0.5.17", f"{_PACKER}.append", ""),
        ("0.5.21", f"{_PACKER}.append", "reached through AuxHiddenStatePacker.capture"))),
    HookPoint("final-norm", f"{_BATCH}.final_norm", (
        ("0.5.8", None, "DeepseekV2Model.forward calls self.norm(hidden_states, residual)"),
        ("0.5.21", f"{_BATCH}.norm(capture_output)", "residual_batch.norm, after residual_batch.complete_output"),
        ("0.5.22", f"{_BATCH}.final_norm(capture)", ""))),
    HookPoint("complete-output", f"{_BATCH}.complete_output", (
        ("0.5.8", None, "no layer boundary"), ("0.5.21", f"{_BATCH}.complete_output", ""))),
    HookPoint("kimi-draft-forward", "models.kimi_k25_eagle3.Eagle3MLAModel.forward", (
        ("0.5.8", None, "no kimi_k25_eagle3 draft model"),
        ("0.5.12", "models.kimi_k25_eagle3.Eagle3MLAModel.forward", ""))),
    HookPoint("llama-draft-forward", "models.llama_eagle3.LlamaModel.forward", (
        ("0.5.8", "models.llama_eagle3.LlamaModel.forward", ""),)),
    HookPoint("draft-extend-decode", "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode", (
        ("0.5.8", "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode", ""),)),
    HookPoint("draft-extend-prefill", "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill", (
        ("0.5.8", "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill", ""),)),
    HookPoint("v1-draft-extend", None, (
        ("0.5.8", "speculative.eagle_worker.EAGLEWorker.forward_draft_extend",
         "v1 worker, chosen when overlap scheduling is off; also forward_draft_extend_after_decode"),
        ("0.5.13", None, "eagle_worker.py removed: EAGLEWorkerV2 always"))),
    HookPoint("load-model", f"{_RUNNER}.load_model", (("0.5.8", f"{_RUNNER}.load_model", ""),)),
    HookPoint("runner-forward", f"{_RUNNER}.forward", (("0.5.8", f"{_RUNNER}.forward", ""),)),
    HookPoint("decode-graph-gate", "model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph", (
        ("0.5.8", "model_executor.cuda_graph_runner.CudaGraphRunner.can_run", ""),
        ("0.5.14", "model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph", ""))),
    HookPoint("prefill-graph-gate",
              "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph", (
                  ("0.5.8", "model_executor.piecewise_cuda_graph_runner.PiecewiseCudaGraphRunner.can_run", ""),
                  ("0.5.14", "model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph",
                   ""))),
    HookPoint("cpu-graph-gate", "model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph", (
        ("0.5.8", "model_executor.cpu_graph_runner.CPUGraphRunner.can_run", ""),
        ("0.5.14", "model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph", ""))),
    HookPoint("capture-mode-flag", "model_executor.runner_utils.capture_mode.get_is_capture_mode", (
        ("0.5.8", "model_executor.cuda_graph_runner.get_is_capture_mode", ""),
        ("0.5.14", "model_executor.runner_utils.capture_mode.get_is_capture_mode", ""))),
    HookPoint("plugin-loader", "plugins.load_plugins", (
        ("0.5.8", None, "no sglang.srt.plugins"), ("0.5.11", "plugins.load_plugins", ""))),
    HookPoint("capture-only-resolve", f"{_SPEC_AUX}._resolve_capture_only_aux_hidden_state", (
        ("0.5.8", None, "no capture-only mode"), ("0.5.23", f"{_SPEC_AUX}._resolve_capture_only_aux_hidden_state",
                                                  ""))),
)
_HOOKS_BY_NAME = {h.name: h for h in HOOK_POINTS}


# ----------------------------------------------------------------------------------------------------------------
# the release record
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SGLangRelease:
    """One SGLang release as this project models it (build one with :func:`release`)."""

    version: str
    torch_pin: str
    transformers_pin: str
    id_rule: str                 # ID_RULE_*
    variant: str                 # VARIANT_*: the plugin adapter this release needs
    count_check: str             # COUNT_CHECK_*
    capture_only_mode: bool      # --enable-return-aux-hidden-states (+ --return-aux-hidden-state-layer-ids)
    plugin_registry: bool        # sglang.srt.plugins (HookRegistry, entry point group sglang.srt.plugins)
    graphs_capture_default_layers: bool
    eagle_worker_v1: bool        # speculative/eagle_worker.py EAGLEWorker, chosen when overlap scheduling is off

    def hook_path(self, name: str) -> Optional[str]:
        """The dotted path (``sglang.srt.`` + ...) of hook point ``name`` in this release, or None if it has none."""
        if name not in _HOOKS_BY_NAME:
            raise ValueError(f"unknown hook point {name!r}; known: {[h.name for h in HOOK_POINTS]}")
        path = _HOOKS_BY_NAME[name].path_in(self.version)
        return None if path is None else "sglang.srt." + path

    def hook_note(self, name: str) -> str:
        return _HOOKS_BY_NAME[name].note_in(self.version)

    def cite(self, topic: str) -> str:
        """Where the rule ``topic`` ("id-rule", "capture", "count-check", "read-ids", "capture-only",
        "default-layers") was read for this release: release, file and function."""
        first = _first_of(topic, self.version)
        where = {
            "id-rule": "models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
            "default-layers": "models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
            "capture": {
                VARIANT_LIST_IN_LOOP: "models/deepseek_v2.py DeepseekV2Model.forward",
                VARIANT_LIST_INTO_LAYER: "layers/communicator.py "
                                         "LayerCommunicator.prepare_attn_and_capture_last_layer_outputs",
                VARIANT_PACKER: "layers/aux_hidden_states.py AuxHiddenStatePacker",
                VARIANT_PACKER_LAYER_BOUNDARY: "layers/layer_boundary/stage.py StageBoundary._prepare_attention",
            }[self.variant],
            "count-check": ("layers/logits_processor.py LogitsProcessor._get_hidden_states_to_store (torch.cat "
                            "of the list, no count check)"
                            if self.count_check == COUNT_CHECK_NONE
                            else "layers/aux_hidden_states.py AuxHiddenStatePacker.finalize"),
            "read-ids": ("model_executor/model_runner.py ModelRunner.__init__"
                         if _version_key(self.version) < _version_key("0.5.16") else
                         "model_executor/model_runner_components/spec_aux_hidden_state.py "
                         "_resolve_eagle_aux_hidden_state"),
            "capture-only": ("model_executor/model_runner_components/spec_aux_hidden_state.py "
                             "_resolve_capture_only_aux_hidden_state, arg_groups/validation_hook.py "
                             "handle_aux_hidden_state_capture, layers/logits_processor.py "
                             "LogitsProcessor._check_aux_hidden_states"
                             if self.capture_only_mode else "arg_groups (no enable_return_aux_hidden_states field)"),
        }.get(topic)
        if where is None:
            raise ValueError(f"unknown topic {topic!r}; known: id-rule, default-layers, capture, count-check, "
                             "read-ids, capture-only")
        return f"SGLang {first} {where}" + ("" if first == self.version else f" (same in {self.version})")


# For cite(): the first release of the range whose source a rule was read in.
_TOPIC_TABLES = {"id-rule": _ID_RULE, "default-layers": (("0.5.8", 0),), "capture": _VARIANT,
                 "count-check": _COUNT_CHECK, "read-ids": (("0.5.8", 0), ("0.5.16", 1)),
                 "capture-only": _CAPTURE_ONLY}


def _first_of(topic: str, version: str) -> str:
    steps = _TOPIC_TABLES.get(topic, (("0.5.8", 0),))
    key = _version_key(version)
    first = OLDEST
    for v, _ in steps:
        if _version_key(v) <= key:
            first = v
    return first


def _make(version: str) -> SGLangRelease:
    return SGLangRelease(
        version=version, torch_pin=_since(_TORCH, version), transformers_pin=_since(_TRANSFORMERS, version),
        id_rule=_since(_ID_RULE, version), variant=_since(_VARIANT, version),
        count_check=_since(_COUNT_CHECK, version), capture_only_mode=_since(_CAPTURE_ONLY, version),
        plugin_registry=_since(_PLUGIN_REGISTRY, version),
        graphs_capture_default_layers=_since(_GRAPHS_CAPTURE_DEFAULT, version),
        eagle_worker_v1=_since(_EAGLE_WORKER_V1, version))


RELEASES: Tuple[SGLangRelease, ...] = tuple(_make(v) for v in KNOWN_VERSIONS)
_BY_VERSION: Dict[str, SGLangRelease] = {r.version: r for r in RELEASES}


def release(version: Union[str, SGLangRelease]) -> SGLangRelease:
    """The modelled release ``version`` ("0.5.12", "0.5.12.post1"). Anything else -- not a version, a version older
    or newer than the modelled range, or one inside it that was never released -- is a ValueError with one line
    naming the range."""
    if isinstance(version, SGLangRelease):
        return version
    text = version.strip() if isinstance(version, str) else version
    if not isinstance(text, str) or _version_key(text) is None:
        raise ValueError(f"expected an SGLang release version like 0.5.12 or 0.5.12.post1 (modelled: {_KNOWN_RANGE}), "
                         f"got {version!r}")
    if text in _BY_VERSION:
        return _BY_VERSION[text]
    key = _version_key(text)
    if key < _version_key(OLDEST):
        raise ValueError(f"SGLang {text} is older than the releases modelled here ({_KNOWN_RANGE}); "
                         f"known: {', '.join(KNOWN_VERSIONS)}")
    if key > _version_key(NEWEST):
        raise ValueError(f"SGLang {text} is newer than the releases modelled here ({_KNOWN_RANGE}): its internals "
                         f"were not read; known: {', '.join(KNOWN_VERSIONS)}")
    raise ValueError(f"SGLang {text} is not a release on the registry; releases modelled ({_KNOWN_RANGE}): "
                     f"{', '.join(KNOWN_VERSIONS)}")


def installed_sglang_version() -> Optional[str]:
    """The installed SGLang's version from its distribution metadata (never imports sglang), or None."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


_LOOK_UP = object()  # assumed_release's default: read the installed version


def assumed_release(version: Optional[str] = None, installed=_LOOK_UP) -> Tuple[SGLangRelease, str, Optional[str]]:
    """The release to model and why: ``version`` when given (ValueError if it is not a modelled release), else the
    installed SGLang when it is one, else the newest. Returns (release, reason, warning); ``warning`` is set when an
    installed SGLang is not a modelled release (e.g. a newer one), which then falls back to the newest.
    ``installed`` overrides the lookup (tests)."""
    if version is not None:
        return release(version), "given", None
    inst = installed_sglang_version() if installed is _LOOK_UP else installed
    if inst is None:
        return release(NEWEST), "no SGLang installed here: the newest modelled", None
    local = inst.split("+", 1)[0]
    try:
        r = release(local)
    except ValueError as e:
        return (release(NEWEST), f"the installed SGLang {inst} is not modelled: the newest modelled",
                f"the installed SGLang {inst} is not modelled ({e}); the report assumes {NEWEST}: pass "
                "--sglang-version for the release the server runs")
    why = "installed here" + (f" as {inst}" if local != inst else "")
    return r, why, None


# ----------------------------------------------------------------------------------------------------------------
# model families
# ----------------------------------------------------------------------------------------------------------------

# model_type -> family, the same in every modelled release. models/deepseek_v2.py serves DeepseekV2/V3/V32ForCausalLM
# (EntryClass, 0.5.8 - 0.5.23; kimi_k2 is a DeepseekV3ForCausalLM); models/kimi_k25.py
# KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture delegates to its DeepseekV3 language_model
# (0.5.10 on). qwen2_moe.py Qwen2MoeForCausalLM, qwen3_moe.py Qwen3MoeForCausalLM and qwen3_next.py
# Qwen3NextForCausalLM add +1 to every id (the same source 0.5.8 - 0.5.23; qwen3_next from 0.5.9).
_FAMILY_BY_MODEL_TYPE = {
    "deepseek_v2": FAMILY_DEEPSEEK_V2, "deepseek_v3": FAMILY_DEEPSEEK_V2, "deepseek_v32": FAMILY_DEEPSEEK_V2,
    "kimi_k2": FAMILY_DEEPSEEK_V2, "kimi_k25": FAMILY_DEEPSEEK_V2,
    "qwen2_moe": FAMILY_QWEN_MOE, "qwen3_moe": FAMILY_QWEN_MOE, "qwen3_next": FAMILY_QWEN_MOE,
}


def sglang_family(model_type: Optional[str]) -> Optional[str]:
    """The capture family of a target model_type ("deepseek_v2", "qwen_moe"), or None if not modelled."""
    return _FAMILY_BY_MODEL_TYPE.get(model_type or "")


def model_support_error(rel: Union[str, SGLangRelease], model_types: Sequence[Optional[str]]) -> Optional[str]:
    """Why release ``rel`` cannot serve EAGLE-3 for a target of these model types (its own and an outer
    multimodal one), or None."""
    r = release(rel)
    for mt in model_types:
        if mt in _MODEL_SUPPORT:
            first, why = _MODEL_SUPPORT[mt]
            if _version_key(r.version) < _version_key(first):
                return f"{why}; SGLang {first} and later can"
    return None


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise TapError(f"unknown SGLang model family {family!r}; known: {list(FAMILIES)}")


# ----------------------------------------------------------------------------------------------------------------
# the rules
# ----------------------------------------------------------------------------------------------------------------

def default_layers_to_capture(num_layers: int) -> List[int]:
    """What every modelled release stores when the draft config has no ids: ``[2, L // 2, L - 3]`` as LAYER-INPUT
    indices (= outputs of layers 1, L//2 - 1, L - 4). The same literal in models/deepseek_v2.py, qwen2_moe.py,
    qwen3_moe.py and qwen3_next.py ``set_eagle3_layers_to_capture`` of 0.5.8 through 0.5.23."""
    L = positive_int(num_layers, "num_layers")
    return [2, L // 2, L - 3]


def _conv(rel: SGLangRelease) -> str:
    return f"SGLang {rel.version} set_eagle3_layers_to_capture(ids) -> model.layers_to_capture"


def layers_to_capture(ids: Optional[Sequence[int]], num_layers: int, rel: Union[str, SGLangRelease] = NEWEST,
                      family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """What release ``rel``'s ``set_eagle3_layers_to_capture(ids)`` stores in ``model.layers_to_capture``.

    * deepseek_v2 (``models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``): None ->
      ``[2, L//2, L-3]``; 0.5.8 - 0.5.12.post1 ``[val + 1 for val in layer_ids]``; 0.5.13 - 0.5.23 ``[v + 1 for v
      in layer_ids]`` only ``if layer_ids and layer_ids[0] == 1``, else ``list(layer_ids)``.
    * qwen_moe (``qwen2_moe.py Qwen2MoeForCausalLM`` / ``qwen3_moe.py`` / ``qwen3_next.py``, 0.5.8 - 0.5.23): None
      -> ``[2, L//2, L-3]`` (no +1); otherwise ``[val + 1 for val in layer_ids]``.
    No validation: the point is to reproduce SGLang, mistakes included.
    """
    r = release(rel)
    _check_family(family)
    if ids is None:
        return default_layers_to_capture(num_layers)
    ids = [as_index(v, "draft id", _conv(r)) for v in ids]
    if family == FAMILY_DEEPSEEK_V2 and r.id_rule == ID_RULE_PLUS_ONE_IF_FIRST_IS_1:
        if ids and ids[0] == 1:
            return [v + 1 for v in ids]
        return list(ids)
    return [v + 1 for v in ids]


@dataclass(frozen=True)
class NativeCapture:
    """What stock SGLang captures for a draft's ids.

    ``stored``: ``model.layers_to_capture``; ``captured_inputs``: layer-input indices actually captured, in slot
    order (= layer order); ``dropped``: stored entries that never produce a capture (all of them when the model
    fails before capturing); ``error``: what SGLang then raises, if anything (None when the capture completes,
    even if it is the wrong one), and ``error_at`` when (ERROR_AT_*). ``graph``: on releases whose CUDA graphs were
    captured with the default layers (0.5.8 - 0.5.10.post1), what forwards replayed from those graphs capture
    when it differs from the eager forwards described here (None otherwise).
    """

    family: str
    ids: Optional[Tuple[int, ...]]
    num_layers: int
    hidden_size: int
    stored: Tuple[int, ...]
    captured_inputs: Tuple[int, ...]
    dropped: Tuple[int, ...]
    error: Optional[str]
    release: str = NEWEST
    error_at: Optional[str] = None
    graph: Optional["NativeCapture"] = None

    @property
    def captured_taps(self) -> Tuple[Tap, ...]:
        return tuple(EMBEDDING if i == 0 else LayerOutput(i - 1) for i in self.captured_inputs)

    @property
    def declared_count(self) -> int:
        """How many slots SGLang expects (its packer's K)."""
        return len(self.stored)

    @property
    def captured_features(self) -> int:
        return len(self.captured_inputs) * self.hidden_size

    def outcome(self) -> Tuple:
        """What a user of the server sees (for comparing releases): stored, captured, the error's kind and when,
        and the same of the graph-replayed forwards."""
        kind = None if self.error is None else self.error.split(":")[0]
        return (self.stored, self.captured_inputs, kind, self.error_at,
                None if self.graph is None else self.graph.outcome())


# The exact exception of `hidden_states + residual` with residual None (torch.Tensor.__add__), checked with torch.
_TYPE_ERROR_LAYER0 = "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'"


def native_capture(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                   rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2, *,
                   cuda_graphs: bool = True) -> NativeCapture:
    """What stock SGLang release ``rel`` stores, captures and raises for draft ids ``ids`` (pp=1, no two-batch
    overlap, whose layers from ``first_k_dense_replace`` on capture nothing in any release).

    This is the function the plugin and the doctor call: ``native_capture(ids, L, H, "0.5.12")``.

    deepseek_v2: ``DeepseekV2Model.forward`` loops ``i in range(L)`` and captures the input of layer i when
    ``i in self.layers_to_capture``; entries outside 0..L-1 never match and a repeated entry matches once.
    * list-in-loop (0.5.8 - 0.5.13.post1, ``DeepseekV2Model.forward``): ``aux_hidden_states.append(hidden_states +
      residual)`` before the layer runs; at i = 0 the residual is None: ``TypeError`` on the first forward. A short
      list goes on to ``LogitsProcessor`` (``torch.cat``): the draft's fc receives n*H features instead of K*H.
    * list-into-layer (0.5.14 - 0.5.16, ``LayerCommunicator.prepare_attn_and_capture_last_layer_outputs``): the
      residual after the input norm's fused add; at i = 0 ``prepare_attn`` sets ``residual = hidden_states``, the
      embedding. No count check.
    * packer (0.5.17 - 0.5.20) and packer+layer-boundary (0.5.21 - 0.5.23): the same slots into an
      ``AuxHiddenStatePacker(len(layers_to_capture))`` whose ``finalize()`` fails "captured n of K aux hidden
      states" when 0 < n < K (AssertionError 0.5.17 - 0.5.19, RuntimeError 0.5.20 on).
    With n = 0 every release returns the bare hidden states, which ``DeepseekV2ForCausalLM.forward`` then unpacks
    as (hidden_states, aux). ``cuda_graphs`` (the GPU default): on 0.5.8 - 0.5.10.post1 the graph-replayed
    forwards capture the default layers (``graph``).

    qwen_moe: ``Qwen2MoeModel.set_eagle3_layers_to_capture`` flags ``self.layers[i]`` for each stored i (and never
    clears a flag), so an entry outside -L..L-1 raises IndexError at model load and a negative one wraps to layer
    L+i; captures go to a plain list (no count check). On 0.5.8 - 0.5.10.post1 with CUDA graphs the default call
    comes first, so the eager forwards capture the default layers and the ids' layers together.
    """
    r = release(rel)
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    stored = layers_to_capture(ids, L, r, family)
    ids_t = None if ids is None else tuple(as_index(v, "draft id", _conv(r)) for v in ids)
    graph, extra = None, ()
    if cuda_graphs and r.graphs_capture_default_layers and ids is not None:
        # the graphs were captured after set_eagle3_layers_to_capture() with no ids; Qwen's layer flags from that
        # call stay set when the ids' flags are added
        graph = _capture(None, default_layers_to_capture(L), L, H, r, family, flagged_extra=())
        if family == FAMILY_QWEN_MOE:
            extra = tuple(default_layers_to_capture(L))
    out = _capture(ids_t, stored, L, H, r, family, flagged_extra=extra)
    if graph is not None and graph.outcome() == out.outcome():
        graph = None
    return NativeCapture(out.family, out.ids, L, H, out.stored, out.captured_inputs, out.dropped, out.error,
                         r.version, out.error_at, graph)


def _capture(ids_t, stored, L: int, H: int, r: SGLangRelease, family: str, *, flagged_extra) -> NativeCapture:
    stored = tuple(stored)
    if family == FAMILY_QWEN_MOE:
        bad = [i for i in stored if not -L <= i < L]
        if bad:
            return NativeCapture(family, ids_t, L, H, stored, (), stored,
                                 f"IndexError at model load: Qwen2MoeModel.set_eagle3_layers_to_capture indexes "
                                 f"self.layers[{bad[0]}] of a {L}-layer model", r.version, ERROR_AT_LOAD)
        flagged = {i % L for i in stored + tuple(flagged_extra)}
        captured = tuple(i for i in range(L) if i in flagged)
    else:
        if r.variant == VARIANT_LIST_IN_LOOP and 0 in stored:
            return NativeCapture(family, ids_t, L, H, stored, (), stored,
                                 f"{_TYPE_ERROR_LAYER0} (DeepseekV2Model.forward appends hidden_states + residual "
                                 "at layer input 0, where residual is still None)", r.version, ERROR_AT_FORWARD)
        captured = tuple(i for i in range(L) if i in stored)
    remaining = list(stored)
    for i in captured:
        if i in remaining:
            remaining.remove(i)
        elif i - L in remaining:
            remaining.remove(i - L)  # qwen: a wrapped negative entry was consumed
    n, k = len(captured), len(stored)
    error, at = None, None
    if family == FAMILY_DEEPSEEK_V2 and n == 0:
        error, at = ("no aux hidden states captured: DeepseekV2Model.forward returns bare hidden_states and "
                     "DeepseekV2ForCausalLM.forward unpacks them as (hidden_states, aux)"), ERROR_AT_FORWARD
    elif n != k:
        if family == FAMILY_DEEPSEEK_V2 and r.count_check == COUNT_CHECK_ASSERT:
            error, at = f"AssertionError: captured {n} of {k} aux hidden states", ERROR_AT_FORWARD
        elif family == FAMILY_DEEPSEEK_V2 and r.count_check == COUNT_CHECK_RAISE:
            error, at = f"RuntimeError: captured {n} of {k} aux hidden states", ERROR_AT_FORWARD
        else:
            error, at = (f"{n} of {k} aux hidden states captured: the draft fc receives {n}*{H} = {n * H} features "
                         f"instead of {k * H}"), ERROR_AT_DRAFT_FC
    return NativeCapture(family, ids_t, L, H, stored, captured, tuple(remaining), error, r.version, at)


def capture_only(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                 rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2) -> NativeCapture:
    """What ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3`` (+
    ``--return-aux-hidden-state-layer-ids ids``; None: the flag left out) captures on release ``rel``: requests
    with return_hidden_states receive the captured slots concatenated. Raises ValueError when the release has no
    such mode (all but 0.5.23).

    0.5.23: ``arg_groups/validation_hook.py handle_aux_hidden_state_capture`` rejects an empty, negative or
    repeated id list (ValueError at startup, pp_size must be 1); ``spec_aux_hidden_state.py
    _check_capture_layer_ids_in_range`` rejects ids >= num_hidden_layers; then the model's own
    ``set_eagle3_layers_to_capture(ids)`` applies (for DeepseekV2: +1 only if ids[0] == 1, so ``[1, ...]`` is shifted
    again), and ``LogitsProcessor._check_aux_hidden_states`` fails the first forward when the count differs
    (after the packer's own check).
    """
    r = release(rel)
    if not r.capture_only_mode:
        raise ValueError(f"SGLang {r.version} has no capture-only mode (--enable-return-aux-hidden-states is in "
                         f"{_first_with_capture_only()} on)")
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    if ids is not None:
        ids_t = tuple(as_index(v, "--return-aux-hidden-state-layer-ids", _conv(r)) for v in ids)
        why = None
        if not ids_t:
            why = "--return-aux-hidden-state-layer-ids must not be empty"
        elif any(i < 0 for i in ids_t):
            why = f"--return-aux-hidden-state-layer-ids must be non-negative, got {list(ids_t)}"
        elif len(set(ids_t)) != len(ids_t):
            why = f"--return-aux-hidden-state-layer-ids must not repeat a layer, got {list(ids_t)}"
        elif any(i >= L for i in ids_t):
            why = (f"--return-aux-hidden-state-layer-ids {[i for i in ids_t if i >= L]} out of range for a target "
                   f"with {L} layers")
        if why is not None:
            return NativeCapture(family, ids_t, L, H, (), (), (), f"ValueError at startup: {why}", r.version,
                                 ERROR_AT_LOAD)
    out = native_capture(ids, L, H, r, family, cuda_graphs=False)
    if ids is not None and (out.error_at == ERROR_AT_DRAFT_FC or out.error is None) \
            and len(out.captured_inputs) != len(ids):
        # LogitsProcessor._check_aux_hidden_states: the count named by the flag, at the first forward (there is no
        # draft whose fc could fail)
        return NativeCapture(family, out.ids, L, H, out.stored, out.captured_inputs, out.dropped,
                             f"ValueError: The model captured {len(out.captured_inputs)} aux hidden states, but "
                             f"--return-aux-hidden-state-layer-ids names {len(ids)} layers", r.version,
                             ERROR_AT_FORWARD)
    return out


def _first_with_capture_only() -> str:
    return next(r.version for r in RELEASES if r.capture_only_mode)


def ids_for(spec: TapSpec, rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """Ids to write in the draft config (``eagle_config.eagle_aux_hidden_state_layer_ids``) so that stock release
    ``rel`` captures exactly ``spec`` (without this project's plugin). Raises TapError when no id list can: the
    final boundary (layer input L, which the capture loop 0..L-1 never reaches); on DeepseekV2, the embedding on
    0.5.8 - 0.5.13.post1 (layer input 0 raises) and, from 0.5.13 on, LayerOutput(0) as first tap (layer input 1
    needs ids[0] == 1, which becomes 2). On 0.5.8 - 0.5.10.post1 the ids hold for eager forwards only: graph-
    replayed ones capture the default layers (see :func:`native_capture`).

    For deepseek_v2 from 0.5.13 on the ids returned are layer-input indices, not SpecForge ids: the draft side of
    SGLang only uses their count, but other tools reading the config would misread them.
    """
    r = release(rel)
    _check_family(family)
    L = spec.num_layers
    conv = _conv(r)
    if spec.includes_final_boundary:
        raise tap_error(f"the final boundary LayerOutput({L - 1}) would be layer-input index {L}, which SGLang "
                        f"{r.version}'s capture loop (0..{L - 1}) never reaches: no id list captures it", conv)
    inputs = spec.to_layer_inputs()
    if family == FAMILY_QWEN_MOE or r.id_rule == ID_RULE_PLUS_ONE_ALWAYS:
        ids = [i - 1 for i in inputs]
    elif inputs[0] == 1:
        raise tap_error(f"{spec.taps[0]!r} as first tap needs layers_to_capture to start with 1, but SGLang "
                        f"{r.version}'s DeepseekV2 shifts any ids starting with 1 to start with 2: no id list "
                        "captures it", conv)
    else:
        ids = list(inputs)
    if family == FAMILY_DEEPSEEK_V2 and r.variant == VARIANT_LIST_IN_LOOP and inputs[0] == 0:
        raise tap_error(f"the Embedding is layer-input index 0, where SGLang {r.version}'s DeepseekV2Model.forward "
                        f"raises ({_TYPE_ERROR_LAYER0}): no id list captures it", conv)
    got = native_capture(ids, L, spec.hidden_size, r, family, cuda_graphs=False)
    assert got.captured_taps == spec.taps and got.error is None, (ids, got)
    return ids


def capture_only_ids_for(spec: TapSpec, rel: Union[str, SGLangRelease] = NEWEST,
                         family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """``--return-aux-hidden-state-layer-ids`` that make release ``rel``'s capture-only mode capture exactly
    ``spec``. TapError when none can (the final boundary: ids must be < num_hidden_layers; on DeepseekV2,
    LayerOutput(0) first: 1 is shifted to 2; on Qwen MoE the Embedding: it would need -1, which is rejected);
    ValueError when the release has no capture-only mode."""
    r = release(rel)
    if not r.capture_only_mode:
        raise ValueError(f"SGLang {r.version} has no capture-only mode (--enable-return-aux-hidden-states is in "
                         f"{_first_with_capture_only()} on)")
    conv = f"SGLang {r.version} --return-aux-hidden-state-layer-ids"
    ids = ids_for(spec, r, family)
    if any(i < 0 for i in ids):
        raise tap_error(f"{spec.taps[0]!r} needs id {min(ids)}, and the flag takes non-negative ids only", conv)
    got = capture_only(ids, spec.num_layers, spec.hidden_size, r, family)
    assert got.captured_taps == spec.taps and got.error is None, (ids, got)
    return ids


# ----------------------------------------------------------------------------------------------------------------
# findings
# ----------------------------------------------------------------------------------------------------------------

def compare_native_capture(declared: TapSpec, native: NativeCapture, *, fix: Optional[str] = None) -> List[Finding]:
    """:func:`~eagle3_capture.findings.compare_taps` for what stock SGLang captures: first the stored entries it
    drops and the error it then raises, then the slot-by-slot differences, then (0.5.8 - 0.5.10.post1) the same for
    the forwards replayed from CUDA graphs. The default fix says which ids stock SGLang would need, or why none
    can."""
    if fix is None:
        fix = _stock_fix(declared, native)
    out = _compare(declared, native, fix, "")
    if native.graph is not None:
        gfix = (f"{fix}; on SGLang {native.release} the CUDA graphs were captured with the default layers: serve "
                "with --disable-cuda-graph or upgrade to 0.5.11 or later")
        out += [Finding(f.severity, "graph-" + f.code,
                        "forwards replayed from CUDA graphs (decode / target verify) capture the default layers "
                        f"{list(native.graph.stored)} instead: {f.message}", gfix)
                for f in _compare(declared, native.graph, gfix, "")]
    return out


def _compare(declared: TapSpec, native: NativeCapture, fix: str, prefix: str) -> List[Finding]:
    out: List[Finding] = []
    L = native.num_layers
    qwen = native.family == FAMILY_QWEN_MOE
    failed_first = native.error is not None and not native.captured_inputs and native.error_at != ERROR_AT_DRAFT_FC \
        and bool(native.dropped) and native.dropped == native.stored
    who = f"SGLang {native.release} ({native.family})"
    for i in native.dropped:
        if failed_first and -L <= i < L:
            continue  # in range, but nothing runs: the error below says it
        what = (f"{who} stores layer-input index {i} in layers_to_capture "
                f"(draft ids {list(native.ids) if native.ids is not None else 'absent: default'})")
        if qwen and not -L <= i < L:
            why = "out of range of self.layers: IndexError at model load"
        elif qwen or 0 <= i < L:
            why = "repeats an index already captured, which matches once"
        else:
            why = f"never matches a layer (capture loop runs over 0..{L - 1})"
        if i == L:
            out.append(Finding("error", "final-boundary-dropped",
                               f"{what}: it is the final boundary LayerOutput({L - 1}), which a capture at "
                               f"layer inputs (loop 0..{L - 1}) never reaches: {why}; dropped", fix))
        else:
            out.append(Finding("error", "dropped-tap", f"{what}: {why}; dropped", fix))
    if native.error:
        code = {ERROR_AT_LOAD: "startup-error", ERROR_AT_FORWARD: "capture-error"}.get(native.error_at,
                                                                                       "capture-error")
        out.append(Finding("error", code, f"{who} then fails ({native.error_at}): {native.error}", fix))
    if failed_first:
        return out  # nothing reaches the draft: slot-by-slot differences would only repeat the error
    return out + compare_taps(declared, native.captured_taps, fix=fix)


def _stock_fix(declared: TapSpec, native: NativeCapture) -> str:
    want = wanted_capture(declared)
    plugin = "use this project's SGLang plugin, which captures the declared taps exactly"
    try:
        ids = ids_for(declared, native.release, native.family)
    except TapError as e:
        return f"{want}: {plugin} (stock SGLang {native.release} cannot: {e})"
    return (f"{want}: {plugin}, or with stock SGLang {native.release} ({native.family}) set "
            f"eagle_config.eagle_aux_hidden_state_layer_ids to {ids}")


def check_release(declared: TapSpec, ids: Optional[Sequence[int]], rel: Union[str, SGLangRelease] = NEWEST,
                  family: str = FAMILY_DEEPSEEK_V2, *, cuda_graphs: bool = True) -> List[Finding]:
    """Findings for serving a draft trained on ``declared`` with stock release ``rel`` given draft-config ``ids``."""
    native = native_capture(ids, declared.num_layers, declared.hidden_size, rel, family, cuda_graphs=cuda_graphs)
    return compare_native_capture(declared, native)


# ----------------------------------------------------------------------------------------------------------------
# across releases
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReleaseSpan:
    """Consecutive releases on which the same ids give the same outcome (``native``: that of the first one)."""

    first: str
    last: str
    native: NativeCapture

    @property
    def versions(self) -> Tuple[str, ...]:
        i, j = KNOWN_VERSIONS.index(self.first), KNOWN_VERSIONS.index(self.last)
        return KNOWN_VERSIONS[i:j + 1]

    def label(self) -> str:
        return self.first if self.first == self.last else f"{self.first} .. {self.last}"

    def contains(self, version: str) -> bool:
        return version in self.versions


def release_outlook(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                    family: str = FAMILY_DEEPSEEK_V2, model_types: Sequence[Optional[str]] = (), *,
                    cuda_graphs: bool = True) -> List[ReleaseSpan]:
    """The outcome of the same draft ids on every modelled release, grouped into spans of consecutive releases
    with the same outcome (stored, captured, error kind and when; releases that cannot load the model at all get
    their own spans): what changes if the user upgrades or downgrades SGLang."""
    spans: List[ReleaseSpan] = []
    key_prev = None
    for r in RELEASES:
        why = model_support_error(r, model_types)
        if why is not None:
            nat = NativeCapture(family, None if ids is None else tuple(ids), num_layers, hidden_size, (), (), (),
                                why, r.version, ERROR_AT_LOAD)
            key = ("unsupported", why)
        else:
            nat = native_capture(ids, num_layers, hidden_size, r, family, cuda_graphs=cuda_graphs)
            key = nat.outcome()
        if spans and key == key_prev:
            spans[-1] = ReleaseSpan(spans[-1].first, r.version, spans[-1].native)
        else:
            spans.append(ReleaseSpan(r.version, r.version, nat))
        key_prev = key
    return spans
