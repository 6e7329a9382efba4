"""Where the installed SGLang keeps what the plugin hooks, found by looking, once per process.

SGLang's capture code moved four times between 0.5.12 and 0.5.23 (docs/sglang_releases.md has the table). The
plugin picks its adapter by what the installed release *has* -- modules, functions and their parameters -- never
by the version string alone, so an unreleased build or a patched release gets the adapter its code matches, or a
refusal naming what is missing:

====================  ==========================================================================================
adapter               what DeepseekV2Model does (releases read)
====================  ==========================================================================================
list-in-loop          its layer loop appends ``hidden_states + residual`` to a Python list before layer i in
                      ``layers_to_capture``; layer input 0 raises there (residual is None) (0.5.12)
list-into-layer       the list is handed into each capturing layer, whose communicator appends the gathered
                      residual (``captured_last_layer_outputs``) (0.5.14, 0.5.16)
packer                an ``AuxHiddenStatePacker`` (one packed [T, K*H] buffer) handed into the layers; the
                      residual passes from layer to layer (0.5.18, 0.5.20)
packer+layer-boundary the packer, with the residual kept in the batch's residual stream and the final norm in
                      ``layers/layer_boundary/residual/batch.py`` (0.5.21: ``norm(capture_output=)``; 0.5.22,
                      0.5.23: ``final_norm(capture=)``)
====================  ==========================================================================================

Where the final boundary ``LayerOutput(L-1)`` (before the final norm) comes from: the final norm's capture callback
where the residual lives in the batch's stream (``final-norm``, ``residual-norm``), else the last decoder layer's
output ``hidden + residual`` (``last-layer``: that layer never defers its all-reduce into the norm,
``should_fuse_mlp_allreduce_with_next_layer`` is False for the last layer in every release read).

Importing this module does not import SGLang; :func:`detect` does (the modules SGLang's HookRegistry imports anyway
to apply the hooks).
"""
from __future__ import annotations

import inspect
import pkgutil
import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ... import draft_layouts
from ... import sglang_releases as releases
from ...release_table import version_key

# The adapters and the supported range are the release table's (sglang_releases/catalogue.py), read here.
LIST_IN_LOOP = releases.VARIANT_LIST_IN_LOOP
LIST_INTO_LAYER = releases.VARIANT_LIST_INTO_LAYER
PACKER = releases.VARIANT_PACKER
PACKER_LAYER_BOUNDARY = releases.VARIANT_PACKER_LAYER_BOUNDARY
ADAPTERS = releases.VARIANTS

# where the final boundary's value comes from
FINAL_NORM = "final-norm"          # residual_batch.final_norm(capture=)
RESIDUAL_NORM = "residual-norm"    # residual_batch.norm(capture_output=)
LAST_LAYER = "last-layer"          # the last DeepseekV2DecoderLayer's (hidden, residual) output

# The releases this plugin was read against and tested on, as (major, minor, patch) (docs/sglang_releases.md).
OLDEST, NEWEST = (version_key(v)[:3] for v in (releases.supported()[0], releases.supported()[-1]))

# Dotted paths, one name per SGLang attribute the plugin may hook or read.
DEEPSEEK = "sglang.srt.models.deepseek_v2"
MODEL_FORWARD_PATH = f"{DEEPSEEK}.DeepseekV2Model.forward"
DECODER_LAYER_FORWARD_PATH = f"{DEEPSEEK}.DeepseekV2DecoderLayer.forward"
SET_LAYERS_TO_CAPTURE_PATH = f"{DEEPSEEK}.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
PACKER_CLASS = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker"
PACKER_INIT_PATH = f"{PACKER_CLASS}.__init__"
PACKER_APPEND_PATH = f"{PACKER_CLASS}.append"
RESIDUAL_BATCH = "sglang.srt.layers.layer_boundary.residual.batch"
FINAL_NORM_PATH = f"{RESIDUAL_BATCH}.final_norm"
RESIDUAL_NORM_PATH = f"{RESIDUAL_BATCH}.norm"
COMPLETE_OUTPUT_PATH = f"{RESIDUAL_BATCH}.complete_output"
# where the target process reads the draft config: 0.5.16+ / 0.5.12, 0.5.14, 0.5.15 / 0.5.13
RESOLVE_AUX_IDS_PATH = ("sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state."
                        "_resolve_eagle_aux_hidden_state")
BUILD_MODEL_CONFIG_PATH = "sglang.srt.model_executor.model_runner.ModelRunner._build_model_config"
FROM_SERVER_ARGS_PATH = "sglang.srt.configs.model_config.ModelConfig.from_server_args"  # 0.5.13
RUNNER_FORWARD_PATH = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
LOAD_MODEL_PATH = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
# SGLang's warm-up / capture-pass flag: 0.5.14+ / 0.5.12
CAPTURE_MODE_PATHS = ("sglang.srt.model_executor.runner_utils.capture_mode.get_is_capture_mode",
                      "sglang.srt.model_executor.cuda_graph_runner.get_is_capture_mode")
# Where SGLang decides graph or eager per batch: 0.5.14+ (can_run_graph) / 0.5.12 (can_run)
GRAPH_GATE_PATHS = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph",
    "sglang.srt.model_executor.cpu_graph_runner.CPUGraphRunner.can_run_graph",
    "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.can_run",
    "sglang.srt.model_executor.piecewise_cuda_graph_runner.PiecewiseCudaGraphRunner.can_run",
    "sglang.srt.model_executor.breakable_cuda_graph_runner.BreakableCudaGraphRunner.can_run",
    "sglang.srt.model_executor.cpu_graph_runner.CPUGraphRunner.can_run",
)
# SGLang's weight-update and reload entry points in the scheduler process (the self-test re-checks after each):
# 0.5.13+ SchedulerWeightUpdaterManager (end_weight_update from 0.5.21: a bucketed distributed update ends there) /
# 0.5.12 the scheduler's SchedulerUpdateWeightsMixin. resume_memory_occupation puts released weights back.
_SCHED_WEIGHTS = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_MIXIN_WEIGHTS = "sglang.srt.managers.scheduler_update_weights_mixin.SchedulerUpdateWeightsMixin"
WEIGHT_UPDATE_METHODS = ("update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed",
                         "update_weights_from_ipc", "end_weight_update", "resume_memory_occupation")
WEIGHT_UPDATE_PATHS = tuple(f"{cls}.{m}" for cls in (_SCHED_WEIGHTS, _MIXIN_WEIGHTS) for m in WEIGHT_UPDATE_METHODS)
# Where the scheduler admits a new request into its queues (every release read, 0.5.12-0.5.23): the self-test's
# refusal (raise mode) finishes a request there with SGLang's own Req.set_finish_with_abort.
ADMISSION_PATH = "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue"
REQ_ABORT_PATH = "sglang.srt.managers.schedule_batch.Req.set_finish_with_abort"
# The group the embedding all-reduces over (the self-test agrees on its verdict there): TP, or attention TP with
# DP attention (0.5.16+ parallel_state.get_attn_tp_group / 0.5.12-0.5.15 dp_attention.get_attention_tp_group)
TP_GROUP_PATHS = ("sglang.srt.distributed.parallel_state.get_tp_group",)
ATTN_TP_GROUP_PATHS = ("sglang.srt.distributed.parallel_state.get_attn_tp_group",
                       "sglang.srt.layers.dp_attention.get_attention_tp_group")
# the draft models' forwards (the draft layouts' table, draft_layouts.py)
MLA_DRAFT_FORWARD_PATH = draft_layouts.MLA.sglang_forward
LLAMA_DRAFT_FORWARD_PATH = draft_layouts.LLAMA.sglang_forward
# Where SGLang builds a request's spec_correct_drafts_histogram, once per verify (every release read)
ACCEPTANCE_HISTOGRAM_PATH = "sglang.srt.managers.schedule_batch.Req.update_spec_correct_drafts_histogram"
DRAFT_EXTEND_PATHS = ("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode",
                      "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill")


@dataclass(frozen=True)
class Internals:
    """What the installed SGLang offers the plugin. ``adapter`` is None when its DeepseekV2 capture matches none of
    the four known shapes; ``missing`` says, per thing looked for, why it was not found."""

    version: str
    adapter: Optional[str]
    final_boundary: Optional[str]
    declaration_path: Optional[str]
    packer_slot: bool                      # AuxHiddenStatePacker.slot(): where the fused write attaches
    capture_mode_path: Optional[str]
    graph_gate_paths: Tuple[str, ...]
    draft_extend_paths: Tuple[str, ...]
    mla_fc_sharded: bool                   # Eagle3MLAModel's fc is column-parallel + _fc_gatherer (0.5.18+)
    missing: Dict[str, str] = field(default_factory=dict)
    acceptance_path: Optional[str] = None  # ACCEPTANCE_HISTOGRAM_PATH where it exists (the acceptance hook)
    weight_update_paths: Tuple[str, ...] = ()  # of WEIGHT_UPDATE_PATHS, those the release has
    admission_path: Optional[str] = None       # ADMISSION_PATH where the release has it and Req's abort

    @property
    def in_range(self) -> bool:
        v = version_tuple(self.version)
        return v is not None and OLDEST <= v[:3] <= NEWEST

    def describe(self) -> str:
        return f"SGLang {self.version} (adapter {self.adapter or 'none'})"

    @property
    def uses_packer(self) -> bool:
        return self.adapter in (PACKER, PACKER_LAYER_BOUNDARY)


def version_tuple(version: str) -> Optional[Tuple[int, ...]]:
    """(major, minor, patch[, post]) of an SGLang version string, or None for one that is not X.Y.Z[.postN][...]."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", version or "")
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def range_text() -> str:
    return releases.SUPPORTED_RANGE


def resolve(path: str):
    """The object a dotted path names, or None (module missing, attribute missing, or the import failing)."""
    try:
        return pkgutil.resolve_name(path)
    except Exception:
        return None


def _params(fn) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _unwrapped(fn):
    """The function under HookRegistry wrappers (detection may run after hooks were applied, e.g. in tests)."""
    seen = 0
    while hasattr(fn, "__wrapped__") and seen < 64:
        fn = fn.__wrapped__
        seen += 1
    return fn


def _capture_adapter(missing: Dict[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """(adapter, final-boundary source) for the installed DeepseekV2Model, from its forward and its layers'."""
    model_forward = resolve(MODEL_FORWARD_PATH)
    layer_forward = resolve(DECODER_LAYER_FORWARD_PATH)
    if model_forward is None or layer_forward is None:
        missing["deepseek_v2"] = (f"{MODEL_FORWARD_PATH} or {DECODER_LAYER_FORWARD_PATH} does not exist "
                                  "(the DeepseekV2 model code moved)")
        return None, None
    model_forward, layer_forward = _unwrapped(model_forward), _unwrapped(layer_forward)
    layer_params = _params(layer_forward)
    into_layer = "captured_last_layer_outputs" in layer_params
    residual_between_layers = "residual" in layer_params
    src = _source(model_forward)
    packer = resolve(PACKER_CLASS) is not None and "AuxHiddenStatePacker(" in src
    if not into_layer:
        # 0.5.12: `aux_hidden_states.append(hidden_states + residual)` inside the layer loop
        if re.search(r"aux_hidden_states\.append\(\s*hidden_states\s*\+\s*residual\s*\)", src) and not packer:
            return LIST_IN_LOOP, LAST_LAYER
        missing["capture"] = ("DeepseekV2Model.forward neither hands a capture list into its layers "
                              "(captured_last_layer_outputs) nor appends hidden_states + residual in its loop")
        return None, None
    if not packer:
        return LIST_INTO_LAYER, (LAST_LAYER if residual_between_layers else None)
    if residual_between_layers:
        return PACKER, LAST_LAYER
    final_norm = resolve(FINAL_NORM_PATH)
    if final_norm is not None and "capture" in _params(_unwrapped(final_norm)):
        return PACKER_LAYER_BOUNDARY, FINAL_NORM
    norm = resolve(RESIDUAL_NORM_PATH)
    if norm is not None and "capture_output" in _params(_unwrapped(norm)):
        return PACKER_LAYER_BOUNDARY, RESIDUAL_NORM
    missing["final_boundary"] = (f"the residual lives in the batch's stream but neither {FINAL_NORM_PATH}(capture=) "
                                 f"nor {RESIDUAL_NORM_PATH}(capture_output=) exists")
    return PACKER_LAYER_BOUNDARY, None


def detect() -> Internals:
    """Look at the installed SGLang (imports its model and runner modules)."""
    import sglang

    version = str(getattr(sglang, "__version__", "unknown"))
    missing: Dict[str, str] = {}
    adapter, final = _capture_adapter(missing)
    resolver = resolve(RESOLVE_AUX_IDS_PATH)
    if resolver is not None and "config.draft_model_config =" in _source(_unwrapped(resolver)):
        declaration = RESOLVE_AUX_IDS_PATH  # 0.5.22+: it keeps the draft's ModelConfig on the config it returns
    elif resolver is not None and "is_draft_model" in _params(resolve(FROM_SERVER_ARGS_PATH) or (lambda: None)):
        declaration = FROM_SERVER_ARGS_PATH  # 0.5.16-0.5.21: it builds the draft's ModelConfig and drops it
    elif "is_draft_model" in _params(resolve(BUILD_MODEL_CONFIG_PATH) or (lambda: None)):
        declaration = BUILD_MODEL_CONFIG_PATH
    elif "is_draft_model" in _params(resolve(FROM_SERVER_ARGS_PATH) or (lambda: None)):
        declaration = FROM_SERVER_ARGS_PATH  # ModelRunner.__init__ builds the draft's ModelConfig directly
    else:
        declaration = None
        missing["declaration"] = (f"none of {RESOLVE_AUX_IDS_PATH}, {BUILD_MODEL_CONFIG_PATH}(is_draft_model=), "
                                  f"{FROM_SERVER_ARGS_PATH}(is_draft_model=) exists: where the target reads the draft "
                                  "config is unknown")
    packer_cls = resolve(PACKER_CLASS)
    packer_slot = adapter in (PACKER, PACKER_LAYER_BOUNDARY) and callable(getattr(packer_cls, "slot", None))
    capture_mode = next((p for p in CAPTURE_MODE_PATHS if resolve(p) is not None), None)
    if capture_mode is None:
        missing["capture_mode"] = f"no get_is_capture_mode in {' or '.join(p.rsplit('.', 1)[0] for p in CAPTURE_MODE_PATHS)}"
    gates = tuple(p for p in GRAPH_GATE_PATHS if resolve(p) is not None)
    extends = tuple(p for p in DRAFT_EXTEND_PATHS if resolve(p) is not None)
    mla = resolve(MLA_DRAFT_FORWARD_PATH.rsplit(".", 1)[0])
    mla_fc_sharded = mla is not None and draft_layouts.MLA.gather_attr in _source(_unwrapped(mla.__init__))
    for path in (SET_LAYERS_TO_CAPTURE_PATH, RUNNER_FORWARD_PATH, LOAD_MODEL_PATH):
        if resolve(path) is None:
            missing[path.rsplit(".", 2)[-2] + "." + path.rsplit(".", 1)[1]] = f"{path} does not exist"
    acceptance = ACCEPTANCE_HISTOGRAM_PATH if callable(resolve(ACCEPTANCE_HISTOGRAM_PATH)) else None
    if acceptance is None:
        missing["acceptance"] = (f"{ACCEPTANCE_HISTOGRAM_PATH} does not exist: no place where SGLang counts a "
                                 "request's correct drafts per verify")
    weight_updates = tuple(p for p in WEIGHT_UPDATE_PATHS if callable(resolve(p)))
    admission = ADMISSION_PATH if callable(resolve(ADMISSION_PATH)) and callable(resolve(REQ_ABORT_PATH)) else None
    if admission is None:
        missing["admission"] = (f"{ADMISSION_PATH} or {REQ_ABORT_PATH} does not exist: a self-test failing while "
                                "serving can only be logged")
    return Internals(version, adapter, final, declaration, packer_slot, capture_mode, gates, extends,
                     mla_fc_sharded, missing, acceptance, weight_updates, admission)


_detected: Optional[Internals] = None


def current() -> Internals:
    """The installed SGLang's internals, detected at the first call in this process."""
    global _detected
    if _detected is None:
        _detected = detect()
    return _detected


def reset() -> None:
    """Detect again at the next :func:`current` (tests that swap SGLang's attributes)."""
    global _detected
    _detected = None


def installed_version() -> Optional[str]:
    """The installed SGLang's version without importing it (None when not installed)."""
    return releases.installed_sglang_version()


__all__ = [
    "ADAPTERS", "LIST_IN_LOOP", "LIST_INTO_LAYER", "PACKER", "PACKER_LAYER_BOUNDARY", "FINAL_NORM", "RESIDUAL_NORM",
    "LAST_LAYER", "OLDEST", "NEWEST", "Internals", "detect", "current", "reset", "version_tuple", "range_text",
    "resolve", "installed_version", "MODEL_FORWARD_PATH", "DECODER_LAYER_FORWARD_PATH", "SET_LAYERS_TO_CAPTURE_PATH",
    "PACKER_INIT_PATH", "PACKER_APPEND_PATH", "FINAL_NORM_PATH", "RESIDUAL_NORM_PATH", "COMPLETE_OUTPUT_PATH",
    "RESOLVE_AUX_IDS_PATH", "BUILD_MODEL_CONFIG_PATH", "FROM_SERVER_ARGS_PATH", "RUNNER_FORWARD_PATH", "LOAD_MODEL_PATH", "CAPTURE_MODE_PATHS",
    "GRAPH_GATE_PATHS", "ACCEPTANCE_HISTOGRAM_PATH", "WEIGHT_UPDATE_METHODS", "WEIGHT_UPDATE_PATHS", "ADMISSION_PATH", "REQ_ABORT_PATH",
    "TP_GROUP_PATHS", "ATTN_TP_GROUP_PATHS", "MLA_DRAFT_FORWARD_PATH", "LLAMA_DRAFT_FORWARD_PATH", "DRAFT_EXTEND_PATHS",
]
