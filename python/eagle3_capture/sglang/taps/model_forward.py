"""Around ``DeepseekV2Model.forward``: per forward, the captures SGLang's own loop cannot make on the installed
release, in the order it would have made them.

* The final boundary ``LayerOutput(L-1)`` (layer input L, the residual stream before the final norm), which
  SGLang's capture loop over layers 0..L-1 never reaches. Where it comes from depends on the release
  (installed/internals.py): the final norm's own capture callback where the residual lives in the batch's stream
  (``residual_batch.final_norm(capture=)`` on 0.5.22+, ``residual_batch.norm(capture_output=)`` on 0.5.21), which
  receives the updated residual ``hidden + residual`` computed by the norm's fused add; else the last decoder
  layer's output ``hidden + residual`` (0.5.12-0.5.20), which is the same value: that layer never defers its
  all-reduce into the final norm, and torch's bf16/fp16 add rounds the fp32 sum once, like the fused add.
  In a packer release the value is appended to the forward's ``AuxHiddenStatePacker`` as its last slot (the
  packer is sized for every declared slot, and its own count check ``finalize`` then holds); in a list release
  it is appended to the list the forward returns.
* Layer input 0 on the list-in-loop adapter (0.5.12), whose loop computes ``hidden_states + residual`` with
  residual None there and raises: the first decoder layer's input (the embedding output, or the input embeddings
  SGLang was handed) is captured instead, copied because later layers update that very tensor in place as the
  residual, and put first in the list; SGLang's loop runs with the list minus index 0.
* The doctor's residual stream (taps/stream.py): ``layers_to_capture`` widened for that one forward.

The fast path -- a model whose taps need none of this, and no doctor request -- is one contextvar read and two
attribute reads before SGLang's forward.
"""
from __future__ import annotations

import contextvars
from typing import Callable, List, Optional, Tuple

from ..installed import internals
from ..installed.hook_chain import hook_path_in_place
from ..settings import switches
from . import stream
from .declaration import config_of

# Attribute set on the DeepseekV2Model instance by the taps hook (read here, by served.py and by tests).
SPEC_ATTR = "_eagle3_capture_spec"


class _Scope:
    """One model forward's extra captures: what is wanted, where it goes, what arrived."""

    __slots__ = ("forward_batch", "num_layers", "first", "final", "uses_packer", "packer", "first_layer",
                 "last_layer", "first_value", "final_value", "final_done")

    def __init__(self, forward_batch, num_layers: int, first: bool, final: bool, model):
        self.forward_batch = forward_batch
        self.num_layers = num_layers
        self.first, self.final = first, final
        self.uses_packer = internals.current().uses_packer
        self.packer = None                      # the forward's AuxHiddenStatePacker (packer releases)
        layers = getattr(model, "layers", None)
        start, end = getattr(model, "start_layer", 0), getattr(model, "end_layer", num_layers)
        self.first_layer = layers[0] if first and layers is not None and start == 0 else None
        self.last_layer = layers[num_layers - 1] if final and layers is not None and end == num_layers else None
        self.first_value = None
        self.final_value = None
        self.final_done = False


_scope: contextvars.ContextVar[Optional[_Scope]] = contextvars.ContextVar("eagle3_capture_forward_scope",
                                                                          default=None)
_final_of = (None, False)  # (the last spec asked about, whether it declares the final boundary)


def declares_final(spec) -> bool:
    """``spec.includes_final_boundary`` (False for None), remembered for the last spec asked about (a TapSpec is
    immutable; the model forward asks at every forward)."""
    global _final_of
    last = _final_of
    if last[0] is spec:
        return last[1]
    final = spec is not None and spec.includes_final_boundary
    _final_of = (spec, final)
    return final


_list_in_loop: Optional[bool] = None  # the installed release's adapter is list-in-loop (read once)


def _is_list_in_loop() -> bool:
    global _list_in_loop
    if _list_in_loop is None:
        _list_in_loop = internals.current().adapter == internals.LIST_IN_LOOP
    return _list_in_loop


def _first_needed(served) -> bool:
    """Whether this plugin captures layer input 0 of the served list itself: on list-in-loop, with the taps hook
    on (with it off, SGLang's own rule and its own failure stand)."""
    return bool(served) and served[0] == 0 and _is_list_in_loop() and switches.enabled(switches.TAPS)


def model_forward_hook(original, self, input_ids, positions, forward_batch, *args, **kwargs):
    """AROUND ``DeepseekV2Model.forward``."""
    spec = getattr(self, SPEC_ATTR, None)
    req = stream.take()
    served = self.layers_to_capture
    if req is None and not declares_final(spec) and not _first_needed(served):
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    if not self.pp_group.is_last_rank:  # SGLang captures on the last pipeline stage only
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    cfg = config_of(self)
    L = int(cfg.num_hidden_layers)
    run = served
    if req is not None:
        union = stream.widen(req, served, L)
        if union is not None:
            run = union
    first = bool(run) and run[0] == 0 and _is_list_in_loop() and (run is not served or _first_needed(served))
    final = L in run
    if not first and not final and run is served:
        return original(self, input_ids, positions, forward_batch, *args, **kwargs)
    scope = _Scope(forward_batch, L, first, final, self)
    loop_list = run[1:] if first else run
    token = _scope.set(scope)
    if loop_list is not served:
        self.layers_to_capture = loop_list
    try:
        out = original(self, input_ids, positions, forward_batch, *args, **kwargs)
    finally:
        _scope.reset(token)
        if loop_list is not served:
            self.layers_to_capture = served
    out = _complete(scope, out, forward_batch)
    if req is not None and run is not served:
        out = stream.split(req, out, int(cfg.hidden_size))
    return out


def _complete(scope: _Scope, out, forward_batch):
    """The forward's output with the extra captures in place (list releases), or checked (packer releases)."""
    mode = getattr(forward_batch, "forward_mode", None)
    if scope.first and scope.first_value is None:
        raise RuntimeError("eagle3_capture: layer input 0 (the embedding output) was not captured in this forward "
                           f"(mode {mode}): the first decoder layer did not run here (pipeline parallelism puts "
                           "it on another stage, or the layers ran outside DeepseekV2DecoderLayer.forward)")
    if scope.final and not scope.final_done and scope.final_value is None:
        raise RuntimeError(f"eagle3_capture: the final boundary LayerOutput({scope.num_layers - 1}) was not "
                           f"captured in this forward (mode {mode}): "
                           f"{_FINAL_SOURCES.get(internals.current().final_boundary, 'no source of it was found')}")
    if scope.uses_packer:
        return out  # the packer holds every slot (layer input 0 is SGLang's own capture on packer releases)
    if not scope.first and scope.final_value is None:
        return out
    hidden, aux = (out[0], list(out[1])) if isinstance(out, tuple) and len(out) == 2 else (out, [])
    if scope.first:
        aux.insert(0, scope.first_value)
    if scope.final_value is not None:
        aux.append(scope.final_value)
    return hidden, aux


_FINAL_SOURCES = {
    internals.FINAL_NORM: "the final norm did not run through residual_batch.final_norm",
    internals.RESIDUAL_NORM: "the final norm did not run through residual_batch.norm",
    internals.LAST_LAYER: ("the last decoder layer did not run through DeepseekV2DecoderLayer.forward (two-batch "
                           "overlap runs layers as stages; taps there are never captured)"),
}


def _deliver_final(scope: _Scope, value) -> None:
    """The final boundary's value: last slot of the packer, or kept for the list the forward returns."""
    if not scope.uses_packer:
        scope.final_value = value
        return
    if scope.packer is None:
        raise RuntimeError(f"eagle3_capture: the final boundary LayerOutput({scope.num_layers - 1}) arrived before "
                           "the forward's AuxHiddenStatePacker was seen (its __init__ hook is not in place)")
    try:
        scope.packer.append(value)
    except (RuntimeError, ValueError) as e:
        shape = tuple(value.shape) if hasattr(value, "shape") else type(value).__name__
        raise RuntimeError(
            f"eagle3_capture: capturing the final boundary LayerOutput({scope.num_layers - 1}) failed: its value "
            f"is {shape}, which does not fit the aux buffer of the layer-input captures (rows scattered across "
            f"attention-TP ranks at the final norm, e.g. DP attention, are not supported): {e}") from e
    scope.final_done = True


def packer_init_hook(original, self, *args, **kwargs):
    """AROUND ``AuxHiddenStatePacker.__init__``: remember the forward's packer in a scope."""
    original(self, *args, **kwargs)
    scope = _scope.get()
    if scope is not None and scope.packer is None:
        scope.packer = self


def _wants_final(scope: Optional[_Scope], forward_batch) -> bool:
    return (scope is not None and scope.final and not scope.final_done and scope.packer is not None
            and forward_batch is scope.forward_batch)


def _with_final_capture(scope: _Scope, inner):
    """A capture callback for the final norm that takes the final boundary, then calls SGLang's own (if any)."""
    def capture_final_boundary(value, *cargs, **ckwargs):
        _deliver_final(scope, value)
        if inner is not None:
            return inner(value, *cargs, **ckwargs)
        return None

    return capture_final_boundary


def final_norm_hook(original, hidden_states, forward_batch, layernorm, capture=None, **kwargs):
    """AROUND ``residual_batch.final_norm`` (0.5.22+): the final boundary from the norm's capture callback."""
    scope = _scope.get()
    if not _wants_final(scope, forward_batch):
        return original(hidden_states, forward_batch, layernorm, capture, **kwargs)
    return original(hidden_states, forward_batch, layernorm, _with_final_capture(scope, capture), **kwargs)


def residual_norm_hook(original, hidden_states, forward_batch, layernorm, capture_output=None, **kwargs):
    """AROUND ``residual_batch.norm`` (0.5.21): the same through its ``capture_output`` callback."""
    scope = _scope.get()
    if not _wants_final(scope, forward_batch):
        return original(hidden_states, forward_batch, layernorm, capture_output, **kwargs)
    return original(hidden_states, forward_batch, layernorm, _with_final_capture(scope, capture_output), **kwargs)


def complete_output_hook(original, hidden_states, forward_batch, *args, **kwargs):
    """AROUND ``residual_batch.complete_output``: an idle batch skips the final norm; capture its (empty)
    output so the packer still holds every slot."""
    out = original(hidden_states, forward_batch, *args, **kwargs)
    scope = _scope.get()
    if _wants_final(scope, forward_batch) and forward_batch.forward_mode.is_idle():
        _deliver_final(scope, out)
    return out


def decoder_layer_hook(original, self, *args, **kwargs):
    """AROUND ``DeepseekV2DecoderLayer.forward`` (list-in-loop, and the releases whose final boundary is the last
    layer's output): layer input 0 from the first layer's arguments, the final boundary from the last layer's
    output. Every other layer call, and every call outside a scope, goes straight to SGLang."""
    scope = _scope.get()
    if scope is None or (self is not scope.first_layer and self is not scope.last_layer):
        return original(self, *args, **kwargs)
    if self is scope.first_layer and scope.first_value is None:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[1]
        residual = kwargs["residual"] if "residual" in kwargs else (args[3] if len(args) > 3 else None)
        scope.first_value = hidden.clone() if residual is None else hidden + residual
    out = original(self, *args, **kwargs)
    if self is scope.last_layer and not scope.final_done and scope.final_value is None:
        _deliver_final(scope, out[0] + out[1])  # (hidden_states, residual, ...): the layer's output
    return out


# ----------------------------------------------------------------------------------------------------------------
# Which of these hooks a release needs (the entry point installs them; the taps hook checks them at model load)
# ----------------------------------------------------------------------------------------------------------------

Hooks = List[Tuple[str, Callable]]
_MODEL = [(internals.MODEL_FORWARD_PATH, model_forward_hook)]
_LAYER = [(internals.DECODER_LAYER_FORWARD_PATH, decoder_layer_hook)]
_PACKER = [(internals.PACKER_INIT_PATH, packer_init_hook)]


def final_boundary_hooks(i: internals.Internals) -> Optional[Hooks]:
    """The hooks that capture the final boundary on the release `i` describes; None where no source of it was
    found (i.missing says why)."""
    if i.final_boundary == internals.FINAL_NORM:
        return _MODEL + _PACKER + [(internals.FINAL_NORM_PATH, final_norm_hook),
                                   (internals.COMPLETE_OUTPUT_PATH, complete_output_hook)]
    if i.final_boundary == internals.RESIDUAL_NORM:
        return _MODEL + _PACKER + [(internals.RESIDUAL_NORM_PATH, residual_norm_hook),
                                   (internals.COMPLETE_OUTPUT_PATH, complete_output_hook)]
    if i.final_boundary == internals.LAST_LAYER:
        return _MODEL + (_PACKER if i.uses_packer else []) + _LAYER
    return None


def first_layer_hooks(i: internals.Internals) -> Hooks:
    """The hooks that capture layer input 0 where SGLang's loop cannot (list-in-loop); none elsewhere."""
    return _MODEL + _LAYER if i.adapter == internals.LIST_IN_LOOP else []


def not_in_place(hooks: Hooks) -> List[str]:
    """The dotted paths among `hooks` whose hook SGLang's HookRegistry did not put in place."""
    return [path for path, fn in hooks if not hook_path_in_place(path, fn)]


__all__ = ["SPEC_ATTR", "declares_final", "model_forward_hook", "packer_init_hook", "final_norm_hook",
           "residual_norm_hook", "complete_output_hook", "decoder_layer_hook", "final_boundary_hooks",
           "first_layer_hooks", "not_in_place", "Hooks"]
