"""Target-side hooks: the DeepseekV2 family (DeepseekV2/V3/V32ForCausalLM, Kimi-K2.5's language model, and the
other subclasses of SGLang 0.5.23's ``DeepseekV2ForCausalLM``) captures exactly the taps the draft declares.

Hook points (AROUND hooks through SGLang's HookRegistry) and why these:

* ``spec_aux_hidden_state._resolve_eagle_aux_hidden_state`` (switch ``taps``): the only place the target process
  reads the draft config. The hook calls it unchanged, then reads the same draft config with
  :func:`eagle3_capture.configs.read_draft_config` and keeps the declaration (ids, where they were found, their
  convention key ``eagle_config.eagle_aux_hidden_state_convention``) for the next hook. It changes nothing SGLang
  sees, and never raises here: a problem is kept and raised by the DeepseekV2 hook, so other target families are
  untouched.
* ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (switch ``taps``): the ids become a canonical
  :class:`~eagle3_capture.spec.TapSpec` (draft ids by default; the declared convention when the draft config
  states one), then SGLang's layer-input indices: ``Embedding`` -> 0, ``LayerOutput(k)`` -> k+1, and the final
  boundary ``LayerOutput(L-1)`` -> L, which SGLang's capture loop (0..L-1) never reaches; the hooks below capture
  it. Ids the spec rejects raise :class:`~eagle3_capture.spec.TapError` here, i.e. at model load.
* Final boundary (switch ``final_boundary``; also installed with the dump, for the doctor's stream):
  ``DeepseekV2Model.forward`` opens a per-forward scope when its model
  declared the final boundary; in that scope the ``AuxHiddenStatePacker`` the forward creates is remembered
  (``AuxHiddenStatePacker.__init__``), and ``layer_boundary.residual.batch.final_norm`` is given SGLang's own
  ``capture=`` callback, which receives the updated residual ``hidden + residual`` computed by the final norm's
  fused add (the value before the norm) and appends it to that packer as the last slot. For an idle batch (no
  final norm), ``residual_batch.complete_output`` supplies the (zero-row) value. The packer's own count check
  (``finalize``) then holds with K = len(taps).
"""
from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .. import configs as _configs
from ..sglang_rules import sglang_0523_native_capture
from ..spec import DRAFT_IDS, TapError, TapSpec
from . import stream, switches
from .declaration import DraftDeclaration, current_declaration, set_declaration
from .hook_chain import hook_in_place, hook_path_in_place
from .switches import logger

# Dotted paths of the hooked SGLang 0.5.23 attributes.
RESOLVE_AUX_IDS_PATH = ("sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state."
                        "_resolve_eagle_aux_hidden_state")
SET_LAYERS_TO_CAPTURE_PATH = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
MODEL_FORWARD_PATH = "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward"
PACKER_INIT_PATH = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker.__init__"
FINAL_NORM_PATH = "sglang.srt.layers.layer_boundary.residual.batch.final_norm"
COMPLETE_OUTPUT_PATH = "sglang.srt.layers.layer_boundary.residual.batch.complete_output"

# Attribute set on the DeepseekV2Model instance by the taps hook (read by the forward hook and by tests).
SPEC_ATTR = "_eagle3_capture_spec"


# ----------------------------------------------------------------------------------------------------------------
# The draft's declaration, as read where SGLang reads the draft config
# ----------------------------------------------------------------------------------------------------------------

def _config_dict(hf_config) -> dict:
    if hf_config is None:
        return {}
    if isinstance(hf_config, dict):
        return dict(hf_config)
    to_dict = getattr(hf_config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return dict(vars(hf_config))


def resolve_eagle_aux_hidden_state_hook(original, *args, **kwargs):
    """AROUND ``_resolve_eagle_aux_hidden_state``: run it, then keep the draft config's declaration."""
    result = original(*args, **kwargs)
    config = kwargs.get("config", args[0] if args else None)
    try:
        if config is None or not getattr(config, "eagle_use_aux_hidden_state", False):
            return result
        draft_model_config = getattr(config, "draft_model_config", None)
        if draft_model_config is None:
            return result
        source = getattr(draft_model_config, "model_path", None) or "draft config"
        sglang_ids = config.eagle_aux_hidden_state_layer_ids
        sglang_ids = None if sglang_ids is None else list(sglang_ids)
        try:
            draft = _configs.read_draft_config(_config_dict(getattr(draft_model_config, "hf_config", None)))
            decl = DraftDeclaration(sglang_ids, draft, None, str(source))
        except Exception as e:  # kept, raised by the DeepseekV2 hook (other families stay untouched)
            decl = DraftDeclaration(sglang_ids, None, f"{type(e).__name__}: {e}", str(source))
        set_declaration(decl)
    except Exception:  # never break SGLang's own resolution for a reporting side effect
        logger.exception("eagle3_capture: reading the draft config's tap declaration failed")
    return result


# ----------------------------------------------------------------------------------------------------------------
# set_eagle3_layers_to_capture
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ResolvedTaps:
    """The taps one target model captures, and how they were derived (for the log line and for tests)."""

    model_class: str
    spec: TapSpec
    layers_to_capture: List[int]
    ids: Optional[List[int]]
    convention: str
    source: str
    native_note: str


_resolved_lock = threading.Lock()
_resolved: List[ResolvedTaps] = []


def resolved_taps() -> List[ResolvedTaps]:
    """Every resolution done in this process, oldest first."""
    with _resolved_lock:
        return list(_resolved)


def _target_config(model) -> _configs.TargetConfig:
    cfg = model.config
    return _configs.read_target_config({
        "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
        "model_type": getattr(cfg, "model_type", None),
        "architectures": list(getattr(cfg, "architectures", None) or []),
    })


def _ids_and_convention(layer_ids, model, L: int, H: int):
    """(spec, ids, convention, source) for the ids SGLang passes, using the draft's declaration when it is
    about these ids. Raises TapError/ValueError (at model load) for anything the spec rejects."""
    decl = current_declaration()
    cls = type(model).__name__
    given = None if layer_ids is None else list(layer_ids)
    if decl is not None and (given is None or given == decl.sglang_ids):
        if decl.error is not None:
            raise ValueError(f"eagle3_capture: {cls}: the draft config {decl.source} could not be read: "
                             f"{decl.error}")
        draft = decl.draft
        if draft.layer_ids is not None:
            where = (_configs.SRC_EAGLE_CONFIG if draft.layer_ids_source == _configs.SRC_EAGLE_CONFIG
                     else f"top-level {_configs.SRC_TOP_LEVEL} (SGLang's target reads only "
                          f"{_configs.SRC_EAGLE_CONFIG})")
            try:
                spec = _configs.draft_taps(draft, _target_config(model))
            except (TapError, ValueError) as e:
                raise type(e)(f"eagle3_capture: {cls} cannot capture the taps the draft declares: {e}") from None
            return spec, list(draft.layer_ids), draft.convention, f"{decl.source}: {where}"
    if given is None:
        return None, None, DRAFT_IDS, "no ids in the draft config: SGLang's default layer inputs"
    try:
        spec = TapSpec.from_draft_ids(given, L, H)
    except TapError as e:
        raise TapError(f"eagle3_capture: {cls} ({L} layers, H={H}) cannot capture draft ids {given} "
                       f"(passed to set_eagle3_layers_to_capture, read as {DRAFT_IDS}): {e}") from None
    return spec, given, DRAFT_IDS, "ids passed to set_eagle3_layers_to_capture (no draft config declaration)"


def _final_boundary_supported(model) -> Optional[str]:
    """None if this model's final boundary can be captured, else why not."""
    if not switches.enabled(switches.FINAL_BOUNDARY):
        return f"its capture hook is turned off ({switches.ENV_DISABLE} includes '{switches.FINAL_BOUNDARY}')"
    inner = getattr(model, "model", None)
    if inner is None:
        return "the model has no .model to hook"
    if not hook_in_place(type(inner), "forward", model_forward_hook):
        return (f"{type(inner).__name__}.forward does not run through this plugin's DeepseekV2Model.forward "
                "hook (not applied, or overridden by a subclass)")
    for path, fn in ((PACKER_INIT_PATH, packer_init_hook), (FINAL_NORM_PATH, final_norm_hook)):
        if not hook_path_in_place(path, fn):
            return f"the hook on {path} is not in place"
    return None


def set_eagle3_layers_to_capture_hook(original, self, layer_ids: Optional[Sequence[int]] = None):
    """AROUND ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``: ids through the tap spec."""
    L, H = int(self.config.num_hidden_layers), int(self.config.hidden_size)
    cls = type(self).__name__
    spec, ids, convention, source = _ids_and_convention(layer_ids, self, L, H)
    if spec is None:  # no ids anywhere: SGLang's default, [2, L//2, L-3] layer inputs
        original(self, None)
        if not self.pp_group.is_last_rank:
            return
        stored = list(self.model.layers_to_capture)
        try:
            spec = TapSpec.from_layer_inputs(stored, L, H)
        except TapError as e:  # only for toy depths (L < 6), where SGLang's default repeats a layer
            raise TapError(f"eagle3_capture: {cls}: SGLang's default layers_to_capture {stored} for {L} layers "
                           f"is not a valid tap set: {e}; declare the taps in the draft config") from None
        setattr(self.model, SPEC_ATTR, spec)
        _record(ResolvedTaps(cls, spec, stored, None, convention, source, "same as stock SGLang"))
        return
    if spec.includes_final_boundary:
        why = _final_boundary_supported(self)
        if why is not None:
            raise TapError(f"eagle3_capture: {cls}: the draft declares the final boundary "
                           f"{spec.final_boundary!r} (draft id {L - 1}), which cannot be captured: {why}; "
                           f"declared taps {list(spec.taps)} from {source}")
    original(self, layer_ids)  # SGLang's own flags and PP rule; its layers_to_capture is replaced below
    if not self.pp_group.is_last_rank:
        return
    stored = spec.to_layer_inputs(allow_final_boundary=True)
    self.capture_aux_hidden_states = True
    self.model.layers_to_capture = stored
    setattr(self.model, SPEC_ATTR, spec)
    _record(ResolvedTaps(cls, spec, stored, ids, convention, source, _native_note(spec, layer_ids)))


def _native_note(spec: TapSpec, sglang_ids) -> str:
    """What stock SGLang 0.5.23 would have captured for the ids it passes."""
    try:
        nat = sglang_0523_native_capture(None if sglang_ids is None else list(sglang_ids),
                                         spec.num_layers, spec.hidden_size)
    except TapError as e:
        return f"stock SGLang: {e}"
    if nat.captured_taps == spec.taps and not nat.error:
        return "same as stock SGLang"
    txt = f"stock SGLang would store {list(nat.stored)} and capture {list(nat.captured_taps)}"
    return txt + (f", then fail: {nat.error}" if nat.error else "")


# The "hooks: ..." part of the startup line (which hook groups are really in place), handed down by the entry
# point's register(), which owns the hook table; these hooks run only once register() has installed them.
_hook_status_text: Callable[[], str] = lambda: "hooks: not registered"


def report_hook_status_with(status_text: Callable[[], str]) -> None:
    """Set the function that gives the startup line's hook status (called by plugin.register())."""
    global _hook_status_text
    _hook_status_text = status_text


def _record(r: ResolvedTaps) -> None:
    """Keep a resolution and log the startup line: model class, taps in every convention, layers_to_capture,
    hooks."""
    with _resolved_lock:
        _resolved.append(r)
    switches.announce("info", f"eagle3_capture: {describe_resolution(r)}; {_hook_status_text()}")


def describe_resolution(r: ResolvedTaps) -> str:
    L = r.spec.num_layers
    stored = ", ".join(f"{i} (final boundary, before the final norm)" if i == L else str(i)
                       for i in r.layers_to_capture)
    ids = "" if r.ids is None else f" {r.ids} read as {r.convention}"
    return (f"{r.model_class}: {r.spec.describe()} -> layers_to_capture [{stored}]; from {r.source}{ids}; "
            f"{r.native_note}")


# ----------------------------------------------------------------------------------------------------------------
# Final boundary: LayerOutput(L-1), captured from the final norm's fused add
# ----------------------------------------------------------------------------------------------------------------

class _FinalScope:
    __slots__ = ("forward_batch", "packer", "done", "num_layers")

    def __init__(self, forward_batch, num_layers: int):
        self.forward_batch = forward_batch
        self.packer = None
        self.done = False
        self.num_layers = num_layers


_scope: contextvars.ContextVar[Optional[_FinalScope]] = contextvars.ContextVar("eagle3_capture_final_scope",
                                                                                default=None)


def model_forward_hook(original, self, input_ids, positions, forward_batch, *args, **kwargs):
    """AROUND ``DeepseekV2Model.forward``: a final-boundary scope when this model declared that tap, and, in a
    forward that holds one of the doctor's requests, the residual stream at more layer inputs (stream.py: the
    capture is widened for that forward, the served slots returned exactly as without it). The self-test and the
    dump run around the model runner's forward instead (served.py), so they see served forwards, replayed from a
    CUDA graph or not, and never SGLang's warm-up or capture passes."""
    spec = getattr(self, SPEC_ATTR, None)
    req = stream.take()
    if req is None and not _declares_final(spec):  # every forward of a model without the final boundary
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    last = self.pp_group.is_last_rank
    want_final = _declares_final(spec) and last and switches.enabled(switches.FINAL_BOUNDARY)
    if req is not None and last:
        L = int(self.config.num_hidden_layers)
        served = self.layers_to_capture
        union = stream.widen(req, served, L)
        if union is not None:
            self.layers_to_capture = union
            try:
                out = _forward(original, self, input_ids, positions, forward_batch, args, kwargs,
                               want_final or L in union, L)
            finally:
                self.layers_to_capture = served
            return stream.split(req, out, int(self.config.hidden_size))
    if not want_final:
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    return _forward(original, self, input_ids, positions, forward_batch, args, kwargs, True, spec.num_layers)


_final_of = (None, False)  # (the last spec asked about, whether it declares the final boundary)


def _declares_final(spec) -> bool:
    """``spec.includes_final_boundary`` (False for None), remembered for the last spec asked about (a TapSpec is
    immutable; the model forward asks at every forward)."""
    global _final_of
    last = _final_of
    if last[0] is spec:
        return last[1]
    final = spec is not None and spec.includes_final_boundary
    _final_of = (spec, final)
    return final


def _forward(original, self, input_ids, positions, forward_batch, args, kwargs, final: bool, num_layers: int):
    """The model forward, in a final-boundary scope when `final` (the final norm's residual becomes the last slot
    of the forward's packer)."""
    if not final:
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    scope = _FinalScope(forward_batch, num_layers)
    token = _scope.set(scope)
    try:
        out = original(self, input_ids, positions, forward_batch, *args, **kwargs)
    finally:
        _scope.reset(token)
    if scope.packer is not None and not scope.done:
        raise RuntimeError(f"eagle3_capture: the final boundary LayerOutput({num_layers - 1}) was not captured in "
                           f"this forward (mode {getattr(forward_batch, 'forward_mode', None)}): "
                           "the final norm did not run through residual_batch.final_norm")
    return out


def packer_init_hook(original, self, *args, **kwargs):
    """AROUND ``AuxHiddenStatePacker.__init__``: remember the forward's packer in a final-boundary scope."""
    original(self, *args, **kwargs)
    scope = _scope.get()
    if scope is not None and scope.packer is None:
        scope.packer = self


def _capture_final(scope: _FinalScope, value) -> None:
    try:
        scope.packer.capture(value)
    except (RuntimeError, ValueError) as e:
        shape = tuple(value.shape) if hasattr(value, "shape") else type(value).__name__
        raise RuntimeError(
            f"eagle3_capture: capturing the final boundary LayerOutput({scope.num_layers - 1}) failed: the final "
            f"norm's residual is {shape}, which does not fit the aux buffer of the layer-input captures (rows "
            "scattered across attention-TP ranks at the final norm, e.g. DP attention, are not supported): "
            f"{e}") from e
    scope.done = True


def final_norm_hook(original, hidden_states, forward_batch, layernorm, capture=None, **kwargs):
    """AROUND ``residual_batch.final_norm``: add the final-boundary capture to SGLang's own capture callback."""
    scope = _scope.get()
    if scope is None or scope.packer is None or scope.done or forward_batch is not scope.forward_batch:
        return original(hidden_states, forward_batch, layernorm, capture, **kwargs)
    inner = capture

    def capture_final_boundary(value, *cargs, **ckwargs):
        _capture_final(scope, value)
        if inner is not None:
            return inner(value, *cargs, **ckwargs)
        return None

    return original(hidden_states, forward_batch, layernorm, capture_final_boundary, **kwargs)


def complete_output_hook(original, hidden_states, forward_batch, *args, **kwargs):
    """AROUND ``residual_batch.complete_output``: an idle batch skips the final norm; capture its (empty)
    output so the packer still holds K slots."""
    out = original(hidden_states, forward_batch, *args, **kwargs)
    scope = _scope.get()
    if (scope is not None and scope.packer is not None and not scope.done and forward_batch is scope.forward_batch
            and forward_batch.forward_mode.is_idle()):
        _capture_final(scope, out)
    return out


__all__ = [
    "RESOLVE_AUX_IDS_PATH", "SET_LAYERS_TO_CAPTURE_PATH", "MODEL_FORWARD_PATH", "PACKER_INIT_PATH", "FINAL_NORM_PATH",
    "COMPLETE_OUTPUT_PATH", "SPEC_ATTR", "report_hook_status_with", "DraftDeclaration", "current_declaration",
    "set_declaration", "ResolvedTaps", "resolved_taps",
    "resolve_eagle_aux_hidden_state_hook", "set_eagle3_layers_to_capture_hook", "model_forward_hook",
    "packer_init_hook", "final_norm_hook", "complete_output_hook", "describe_resolution",
]
