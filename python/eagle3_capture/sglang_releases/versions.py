"""The SGLang releases this project models (every one on the registry from 0.5.8 through 0.5.23) and how their
versions sort: the one list every other part of the model indexes."""
from __future__ import annotations

from typing import Tuple

from ..release_table import since, span_text, version_key

ENGINE = "SGLang"

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

KNOWN_RANGE = span_text(KNOWN_VERSIONS, " .. ")

__all__ = ["ENGINE", "KNOWN_VERSIONS", "OLDEST", "NEWEST", "SPECFORGE_SGLANG", "KNOWN_RANGE", "version_key", "since"]
