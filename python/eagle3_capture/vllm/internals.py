"""What the installed vLLM offers the plugin, found by looking (feature detection), once per process.

The adapter is picked by what the code *has*, never by the version string alone; the version must also be one the
release table (vllm_releases/) lists, else the plugin refuses (a release it was not read against may have moved the
capture without changing a name). ``aux-list`` (every release read, 0.32.0 - 0.34.0): ``DeepseekV2Model.forward``
takes ``inputs_embeds`` (the embedding is then not recomputed), appends ``hidden_states + residual`` to a list before
layer idx for idx in ``self.aux_hidden_state_layers``, and appends the final output before the norm when
``self.end_layer`` is among them.

Importing this module does not import vLLM; :func:`detect` does.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Dict, Optional

from ..vllm_releases import ADAPTER_AUX_LIST, installed_vllm_version, supported_range, vllm_release

DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
MODEL_FORWARD_PATH = f"{DEEPSEEK}.DeepseekV2Model.forward"
SET_AUX_LAYERS_PATH = f"{DEEPSEEK}.DeepseekV2ForCausalLM.set_aux_hidden_state_layers"
CURRENT_CONFIG_PATH = "vllm.config.get_current_vllm_config_or_none"

# What the aux-list adapter needs to find in DeepseekV2Model.forward's source, and why.
_FORWARD_NEEDS = {
    "self.aux_hidden_state_layers": "the ids it captures",
    "hidden_states + residual": "the capture of a layer input",
    "self.end_layer in self.aux_hidden_state_layers": "the final boundary (layer input L)",
    "inputs_embeds": "an embedding handed in (the plugin's embedding tap)",
}


@dataclass(frozen=True)
class Internals:
    version: str                 # the installed version, build tag kept (0.32.0+cpu)
    release: Optional[str]       # its row in the release table, None if not listed
    adapter: Optional[str]
    missing: Dict[str, str]      # what was looked for and not found

    def describe(self) -> str:
        return f"vLLM {self.version} (adapter {self.adapter or 'none'})"

    @property
    def refusal(self) -> Optional[str]:
        if self.release is None:
            return (f"eagle3_capture: refusing to serve on vLLM {self.version}: not a release the plugin was read "
                    f"against ({supported_range()}); EAGLE3_CAPTURE_DISABLE=all (or VLLM_PLUGINS without "
                    "eagle3_capture) serves stock vLLM")
        if self.adapter is None:
            found = "; ".join(f"{k}: {v}" for k, v in self.missing.items())
            return (f"eagle3_capture: refusing to serve on vLLM {self.version}: its internals match none of the "
                    f"plugin's adapters ({found}); EAGLE3_CAPTURE_DISABLE=all serves stock vLLM")
        return None


def resolve(path: str):
    import importlib

    mod, _, attr = path.rpartition(".")
    owner_path, owner = mod, None
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError):
        owner_path, _, owner = mod.rpartition(".")
    try:
        return getattr(getattr(importlib.import_module(owner_path), owner), attr)
    except (ImportError, AttributeError) as e:
        raise LookupError(f"{path} not found ({type(e).__name__}: {e})") from None


def detect() -> Internals:
    version = installed_vllm_version() or "unknown"
    try:
        release = vllm_release(version.split("+", 1)[0]).version
    except ValueError:
        release = None
    missing: Dict[str, str] = {}
    for path in (SET_AUX_LAYERS_PATH, CURRENT_CONFIG_PATH):
        try:
            resolve(path)
        except LookupError as e:
            missing[path] = str(e)
    try:
        forward = resolve(MODEL_FORWARD_PATH)
        src = inspect.getsource(forward)
        for needle, why in _FORWARD_NEEDS.items():
            if needle not in src:
                missing[MODEL_FORWARD_PATH] = f"no `{needle}` ({why})"
                break
    except (LookupError, OSError, TypeError) as e:
        missing[MODEL_FORWARD_PATH] = str(e)
    adapter = None if missing else ADAPTER_AUX_LIST
    return Internals(version, release, adapter, missing)


__all__ = ["Internals", "detect", "resolve", "MODEL_FORWARD_PATH", "SET_AUX_LAYERS_PATH", "CURRENT_CONFIG_PATH"]
