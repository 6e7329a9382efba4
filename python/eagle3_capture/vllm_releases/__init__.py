"""The vLLM releases this project knows, one table (versions.py): for each, its model runners and the one it picks
for EAGLE-3, how its DeepseekV2 family captures aux hidden states (the plugin's adapter), and where the facts were
read. vllm_rules.py (stock vLLM's reading of a draft config, for ``doctor check --engine vllm``) and the vLLM plugin
(eagle3_capture.vllm) both index this table; neither keeps a list of its own.

Pure Python (no torch, no vLLM import)."""
from __future__ import annotations

from .versions import (ADAPTER_AUX_LIST, ADAPTERS, RUNNER_V1, RUNNER_V2, RUNNERS, VLLM_KNOWN_VERSIONS, VLLM_NEWEST,
                       VLLM_OLDEST, VLLM_RELEASES, VLLMRelease, installed_vllm_version, supported_range, vllm_release)

__all__ = ["ADAPTER_AUX_LIST", "ADAPTERS", "RUNNER_V1", "RUNNER_V2", "RUNNERS", "VLLMRelease", "VLLM_RELEASES",
           "VLLM_KNOWN_VERSIONS", "VLLM_OLDEST", "VLLM_NEWEST", "vllm_release", "installed_vllm_version",
           "supported_range"]
