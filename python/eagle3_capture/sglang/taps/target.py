"""Target-side taps: the DeepseekV2 family (DeepseekV2/V3/V32ForCausalLM, Kimi-K2.5's language model, and the
other subclasses of SGLang's ``DeepseekV2ForCausalLM``) captures exactly the taps the draft declares, on every
release the plugin serves (the release table's range, sglang_releases.SUPPORTED_RANGE).

Hook points (AROUND hooks through SGLang's HookRegistry, switch ``taps``) and why these:

* Where the target process reads the draft config: ``spec_aux_hidden_state._resolve_eagle_aux_hidden_state``
  (0.5.22+, which keeps the draft's ModelConfig), else ``ModelRunner._build_model_config(..., is_draft_model=True)``
  (0.5.12, 0.5.14, 0.5.15) or ``ModelConfig.from_server_args(..., is_draft_model=True)`` (0.5.13, where
  ``ModelRunner.__init__`` builds the draft's config, and 0.5.16 - 0.5.21, where the resolver builds and drops it);
  ``eagle_config`` is read right after. The hook calls SGLang
  unchanged, then reads the same draft config with :func:`eagle3_capture.configs.read_draft_config` and keeps the
  declaration (ids, where they were found, their convention key ``eagle_config.eagle_aux_hidden_state_convention``)
  for the next hook. It changes nothing SGLang sees, and never raises here: a problem is kept and raised by the
  DeepseekV2 hook, so other target families are untouched.
* ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (every release): the ids become a canonical
  :class:`~eagle3_capture.spec.TapSpec` (draft ids by default; the declared convention when the draft config
  states one), then SGLang's layer-input indices: ``Embedding`` -> 0, ``LayerOutput(k)`` -> k+1, and the final
  boundary ``LayerOutput(L-1)`` -> L, which SGLang's capture loop (0..L-1) never reaches. What SGLang's loop cannot
  capture on the installed release -- the final boundary everywhere, layer input 0 on 0.5.12 -- is captured around
  the model forward (taps/model_forward.py); this hook refuses, at model load, a declaration whose hooks there are not
  in place. Ids the spec rejects raise :class:`~eagle3_capture.spec.TapError` here too.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from ... import configs as _configs
from ...sglang_releases import native_capture
from ...spec import DRAFT_IDS, TapError, TapSpec
from ..installed import internals
from ..installed.hook_chain import hook_in_place
from ..settings import switches
from . import model_forward
from .declaration import DraftDeclaration, current_declaration, remember_config, set_declaration
from .model_forward import SPEC_ATTR

# Dotted paths of the hooked SGLang attributes (installed/internals.py has them all).
RESOLVE_AUX_IDS_PATH = internals.RESOLVE_AUX_IDS_PATH
BUILD_MODEL_CONFIG_PATH = internals.BUILD_MODEL_CONFIG_PATH
FROM_SERVER_ARGS_PATH = internals.FROM_SERVER_ARGS_PATH
SET_LAYERS_TO_CAPTURE_PATH = internals.SET_LAYERS_TO_CAPTURE_PATH


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


def _keep_declaration(sglang_ids, hf_config, source) -> None:
    """Read the draft config as the project reads it, beside SGLang's `sglang_ids`, and keep it for the taps hook."""
    sglang_ids = None if sglang_ids is None else list(sglang_ids)
    try:
        draft = _configs.read_draft_config(_config_dict(hf_config))
        decl = DraftDeclaration(sglang_ids, draft, None, str(source))
    except Exception as e:  # kept, raised by the DeepseekV2 hook (other families stay untouched)
        decl = DraftDeclaration(sglang_ids, None, f"{type(e).__name__}: {e}", str(source))
    set_declaration(decl)


def resolve_eagle_aux_hidden_state_hook(original, *args, **kwargs):
    """AROUND ``_resolve_eagle_aux_hidden_state`` (0.5.22+, where it keeps ``config.draft_model_config``): run it, then
    keep the draft config's declaration."""
    result = original(*args, **kwargs)
    config = kwargs.get("config", args[0] if args else None)
    try:
        if config is None or not getattr(config, "eagle_use_aux_hidden_state", False):
            return result
        draft_model_config = getattr(config, "draft_model_config", None)
        if draft_model_config is None:
            return result
        source = getattr(draft_model_config, "model_path", None) or "draft config"
        _keep_declaration(config.eagle_aux_hidden_state_layer_ids, getattr(draft_model_config, "hf_config", None),
                          source)
    except Exception:  # never break SGLang's own resolution for a reporting side effect
        switches.logger.exception("eagle3_capture: reading the draft config's tap declaration failed")
    return result


def build_model_config_hook(original, self, *args, **kwargs):
    """AROUND ``ModelRunner._build_model_config(server_args, model_path, model_revision, is_draft_model)`` (0.5.12,
    0.5.14, 0.5.15)."""
    result = original(self, *args, **kwargs)
    if kwargs.get("is_draft_model", args[3] if len(args) > 3 else False):
        _keep_model_config_declaration(result, kwargs.get("model_path", args[1] if len(args) > 1 else None))
    return result


def from_server_args_hook(original, server_args, *args, **kwargs):
    """AROUND the staticmethod ``ModelConfig.from_server_args(server_args, model_path, model_revision,
    is_draft_model)`` (0.5.13, whose ``ModelRunner.__init__`` calls it for the draft directly; 0.5.16 - 0.5.21,
    whose ``_resolve_eagle_aux_hidden_state`` calls it and keeps only the ids)."""
    result = original(server_args, *args, **kwargs)
    if kwargs.get("is_draft_model", args[2] if len(args) > 2 else False):
        _keep_model_config_declaration(result, kwargs.get("model_path", args[0] if args else None))
    return result


def _keep_model_config_declaration(result, model_path) -> None:
    """For a draft's ModelConfig: keep its declaration with the ids SGLang's ``ModelRunner.__init__`` reads from it
    next, ``eagle_config["eagle_aux_hidden_state_layer_ids"]``, None when that read fails (its bare ``except``)."""
    try:
        hf_config = getattr(result, "hf_config", None)
        eagle_config = getattr(hf_config, "eagle_config", None)
        if isinstance(eagle_config, dict) and not eagle_config.get("use_aux_hidden_state", True):
            return
        try:
            sglang_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
        except Exception:
            sglang_ids = None
        source = getattr(result, "model_path", None) or model_path or "draft config"
        _keep_declaration(sglang_ids, hf_config, source)
    except Exception:  # never break SGLang's own config build for a reporting side effect
        switches.logger.exception("eagle3_capture: reading the draft config's tap declaration failed")


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


def _capture_problem(model, spec: TapSpec) -> Optional[str]:
    """None if every tap of `spec` SGLang's loop cannot reach on this release can be captured by this plugin's
    hooks here, else why not (raised at model load: a declared tap is never dropped or served wrong)."""
    rel = internals.current()
    needs = []
    if spec.includes_final_boundary:
        if not switches.enabled(switches.FINAL_BOUNDARY):
            return (f"the final boundary {spec.final_boundary!r}: its capture hook is turned off "
                    f"({switches.ENV_DISABLE} includes '{switches.FINAL_BOUNDARY}')")
        hooks = model_forward.final_boundary_hooks(rel)
        if hooks is None:
            return (f"the final boundary {spec.final_boundary!r}: {rel.describe()} offers no place to take it "
                    f"({rel.missing.get('final_boundary', 'unknown internals')})")
        needs.append((f"the final boundary {spec.final_boundary!r}", hooks))
    if 0 in spec.to_layer_inputs(allow_final_boundary=True) and model_forward.first_layer_hooks(rel):
        needs.append(("layer input 0 (the embedding output; SGLang's own loop raises on it here)",
                      model_forward.first_layer_hooks(rel)))
    inner = getattr(model, "model", None)
    for what, hooks in needs:
        if inner is None:
            return f"{what}: the model has no .model to hook"
        if not hook_in_place(type(inner), "forward", model_forward.model_forward_hook):
            return (f"{what}: {type(inner).__name__}.forward does not run through this plugin's "
                    "DeepseekV2Model.forward hook (not applied, or overridden by a subclass)")
        missing = model_forward.not_in_place(hooks)
        if missing:
            return f"{what}: on {rel.describe()} the hook on {missing[0]} is not in place"
    return None


def set_eagle3_layers_to_capture_hook(original, self, layer_ids: Optional[Sequence[int]] = None):
    """AROUND ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``: ids through the tap spec."""
    L, H = int(self.config.num_hidden_layers), int(self.config.hidden_size)
    cls = type(self).__name__
    remember_config(self)  # 0.5.12's DeepseekV2Model has no config: the forward hooks read it from here
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
    why = _capture_problem(self, spec)
    if why is not None:
        raise TapError(f"eagle3_capture: {cls}: a tap the draft declares cannot be captured: {why}; declared taps "
                       f"{list(spec.taps)} from {source}")
    original(self, layer_ids)  # SGLang's own flags and PP rule; its layers_to_capture is replaced below
    if not self.pp_group.is_last_rank:
        return
    stored = spec.to_layer_inputs(allow_final_boundary=True)
    self.capture_aux_hidden_states = True
    self.model.layers_to_capture = stored
    setattr(self.model, SPEC_ATTR, spec)
    _record(ResolvedTaps(cls, spec, stored, ids, convention, source, _native_note(spec, layer_ids)))


def _native_note(spec: TapSpec, sglang_ids) -> str:
    """What the installed stock SGLang release would have captured for the ids it passes (the sglang_releases package's
    model of that release; a release it does not model says so)."""
    version = internals.current().version
    try:
        nat = native_capture(None if sglang_ids is None else list(sglang_ids), spec.num_layers, spec.hidden_size,
                             version)
    except TapError as e:
        return f"stock SGLang {version}: {e}"
    except ValueError as e:  # a release the model does not know (e.g. newer than the newest read)
        return f"stock SGLang {version} is not modelled ({e})"
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
    switches.announce("info", f"eagle3_capture: {internals.current().describe()}: {describe_resolution(r)}; "
                              f"{_hook_status_text()}")


def describe_resolution(r: ResolvedTaps) -> str:
    L = r.spec.num_layers
    stored = ", ".join(f"{i} (final boundary, before the final norm)" if i == L else str(i)
                       for i in r.layers_to_capture)
    ids = "" if r.ids is None else f" {r.ids} read as {r.convention}"
    return (f"{r.model_class}: {r.spec.describe()} -> layers_to_capture [{stored}]; from {r.source}{ids}; "
            f"{r.native_note}")


__all__ = [
    "RESOLVE_AUX_IDS_PATH", "BUILD_MODEL_CONFIG_PATH", "FROM_SERVER_ARGS_PATH", "SET_LAYERS_TO_CAPTURE_PATH", "SPEC_ATTR",
    "report_hook_status_with", "DraftDeclaration", "current_declaration", "set_declaration", "ResolvedTaps",
    "resolved_taps", "resolve_eagle_aux_hidden_state_hook", "build_model_config_hook", "from_server_args_hook",
    "set_eagle3_layers_to_capture_hook", "describe_resolution",
]
