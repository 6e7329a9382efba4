"""The target side in vLLM: the DeepseekV2 family (DeepseekV2/V3ForCausalLM and their subclasses, Kimi-K2 / K2.5's
language model) captures exactly the taps the draft declares (declaration.py), in order.

Two hooks, each a wrapper installed on the class by plugin.py (vLLM has no hook registry; the originals are kept in
:data:`ORIGINALS` and in each wrapper's ``__wrapped__``):

* ``DeepseekV2ForCausalLM.set_aux_hidden_state_layers(layers)``, called once per target at model load by vLLM's
  model runner with the ids it read from the draft config (or its default). The hook reads the draft config from
  the current vLLM config (the runner loads the model inside ``set_current_vllm_config``) as the active runner
  reads it, turns it into taps (declaration.py), and stores vLLM's own layer-input indices for every tap but the
  embedding; a declaration it cannot serve raises one line there, which stops the engine at load.
* ``DeepseekV2Model.forward``: for a target whose taps begin with the embedding, the embedding is computed first
  (``embed_input_ids``, exactly what vLLM's forward would compute) and handed in as ``inputs_embeds``, so the layer
  loop starts from the same tensor, and put first in the returned aux list. vLLM's loop captures the rest: its own
  ``hidden_states + residual`` before each listed layer and after the last (the final boundary). A model without
  the embedding tap runs vLLM's forward untouched.

Why vLLM's own copies stay: the runner concatenates the returned list itself (``torch.cat(aux_hidden_states,
dim=-1)`` in ``v1/worker/gpu_model_runner.py``), so there is no packed buffer the project's capture op could write
into; each tap is one add that vLLM already does.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, List, Optional

from ..vllm_releases import vllm_release
from . import internals
from .declaration import Declaration, DeclarationError, describe, read_declaration

logger = logging.getLogger("vllm.eagle3_capture")  # under vLLM's logger: its handler and format

EMBED_ATTR = "_eagle3_capture_embedding"   # on a DeepseekV2Model: take the embedding as the first tap
ORIGINALS: Dict[str, Callable] = {}
_resolved: List[Declaration] = []
_status: Callable[[], str] = lambda: "hooks: not registered"


def resolved() -> List[Declaration]:
    """Every declaration served in this process, oldest first."""
    return list(_resolved)


def report_status_with(fn: Callable[[], str]) -> None:
    global _status
    _status = fn


def _draft_config_dict(hf_config) -> dict:
    to_dict = getattr(hf_config, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(hf_config))


def _active_runner(vllm_config, release: str) -> str:
    from ..vllm_releases import RUNNER_V1, RUNNER_V2

    v2 = getattr(vllm_config, "use_v2_model_runner", None)
    if v2 is None:
        return vllm_release(release).default_runner
    return RUNNER_V2 if v2 else RUNNER_V1


def declaration_for(model, vllm_config, rel: internals.Internals) -> Declaration:
    """The declaration for target ``model`` (a DeepseekV2ForCausalLM) in this engine, or DeclarationError."""
    cls = type(model).__name__
    spec_cfg = getattr(vllm_config, "speculative_config", None)
    draft_model_config = getattr(spec_cfg, "draft_model_config", None)
    if draft_model_config is None:
        raise DeclarationError(f"{cls}: vLLM asks for aux hidden states but the engine has no draft model config")
    cfg = model.config
    runner = _active_runner(vllm_config, rel.release)
    decl = read_declaration(_draft_config_dict(draft_model_config.hf_config), runner, int(cfg.num_hidden_layers),
                            int(cfg.hidden_size), rel.version)
    if decl.spec.includes_embedding:
        pp = getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)
        if pp != 1:
            raise DeclarationError(f"{cls}: the embedding tap with pipeline parallelism ({pp} stages) is not served "
                                   "(DeepseekV2Model passes no aux hidden states between stages)")
        forward = getattr(type(model.model), "forward", None)
        if getattr(forward, "__wrapped__", None) is not ORIGINALS.get(internals.MODEL_FORWARD_PATH):
            raise DeclarationError(f"{cls}: {type(model.model).__name__}.forward does not run through the plugin's "
                                   "DeepseekV2Model.forward hook (overridden by a subclass, or not attached): the "
                                   "embedding tap cannot be taken")
    return decl


def set_aux_hidden_state_layers_hook(original, self, layers):
    """AROUND ``DeepseekV2ForCausalLM.set_aux_hidden_state_layers``: the declared taps instead of the raw ids."""
    from vllm.config import get_current_vllm_config_or_none

    rel = internals.detect()
    vcfg = get_current_vllm_config_or_none()
    who = f"eagle3_capture: refusing to serve on {rel.describe()}"
    if vcfg is None:
        raise RuntimeError(f"{who}: {type(self).__name__}.set_aux_hidden_state_layers ran outside vLLM's "
                           "set_current_vllm_config, so the draft config cannot be read")
    try:
        decl = declaration_for(self, vcfg, rel)
    except DeclarationError as e:
        raise RuntimeError(f"{who}: {e}") from None
    original(self, decl.aux_layers)
    setattr(self.model, EMBED_ATTR, decl.spec.includes_embedding)
    _resolved.append(decl)
    logger.info("eagle3_capture: %s, %s: %s; %s", rel.describe(), type(self).__name__, describe(decl), _status())


def model_forward_hook(original, self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                       *args, **kwargs):
    """AROUND ``DeepseekV2Model.forward``: the embedding first, when declared."""
    if not getattr(self, EMBED_ATTR, False):
        return original(self, input_ids, positions, intermediate_tensors, inputs_embeds, *args, **kwargs)
    if inputs_embeds is None:
        inputs_embeds = self.embed_input_ids(input_ids)
    out = original(self, input_ids, positions, intermediate_tensors, inputs_embeds, *args, **kwargs)
    if isinstance(out, tuple):
        hidden_states, aux = out
        return hidden_states, [inputs_embeds, *aux]
    return out, [inputs_embeds]


def wrap(path: str, original: Callable, hook: Callable) -> Callable:
    """A function that calls ``hook(original, *args)``, looking like the original (name, signature: vLLM's
    compile decorator inspects the forward's signature); ``__wrapped__`` is the original."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(ORIGINALS[path], *args, **kwargs)

    wrapper._eagle3_capture_hook = hook
    return wrapper


HOOKS = ((internals.SET_AUX_LAYERS_PATH, set_aux_hidden_state_layers_hook),
         (internals.MODEL_FORWARD_PATH, model_forward_hook))


def in_place(path: str) -> Optional[str]:
    """None if the hook on ``path`` is the attribute vLLM resolves now, else why not."""
    from .internals import resolve

    try:
        attr = resolve(path)
    except LookupError as e:
        return str(e)
    hook = dict(HOOKS)[path]
    if getattr(attr, "_eagle3_capture_hook", None) is not hook:
        return f"{path} is not the plugin's wrapper (replaced after the plugin loaded?)"
    return None


__all__ = ["EMBED_ATTR", "ORIGINALS", "HOOKS", "resolved", "declaration_for", "set_aux_hidden_state_layers_hook",
           "model_forward_hook", "wrap", "in_place", "report_status_with", "logger"]
