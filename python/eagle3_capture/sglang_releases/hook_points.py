"""Where each dotted path the plugin hooks on SGLang 0.5.23 lives in every modelled release, or what plays its part
there (read in each release's wheel; docs/sglang_releases.md prints them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .versions import since

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
        return since([(first, path) for first, path, _ in self.eras], version)

    def note_in(self, version: str) -> str:
        return since([(first, note) for first, _, note in self.eras], version)


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
    HookPoint("acceptance-histogram", "managers.schedule_batch.Req.update_spec_correct_drafts_histogram", (
        ("0.5.8", None, "no per-request histogram of correct drafts"),
        ("0.5.12", "managers.schedule_batch.Req.update_spec_correct_drafts_histogram",
         "once per request and verify, where the response's spec_correct_drafts_histogram is built"))),
)
_HOOKS_BY_NAME = {h.name: h for h in HOOK_POINTS}


def hook_point(name: str) -> HookPoint:
    """The hook point called ``name`` (ValueError naming the known ones otherwise)."""
    if name not in _HOOKS_BY_NAME:
        raise ValueError(f"unknown hook point {name!r}; known: {[h.name for h in HOOK_POINTS]}")
    return _HOOKS_BY_NAME[name]

