"""The SGLang releases this project models (every one on the registry from 0.5.8 through 0.5.23) and how their
versions sort: the one list every other part of the model indexes."""
from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple

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

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")
KNOWN_RANGE = f"{OLDEST} .. {NEWEST}"


def version_key(text: str) -> Optional[Tuple[int, int, int, int]]:
    """Sort key of a release version (N.N.N or N.N.N.postN; a .post sorts after its release), None if not one."""
    m = _VERSION_RE.match(text)
    if m is None:
        return None
    post = -1 if m.group(4) is None else int(m.group(4))
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), post


def since(steps: Sequence[Tuple[str, object]], version: str) -> object:
    """The value of a step table (first version, value), oldest first, at ``version``."""
    key = version_key(version)
    value = None
    for first, v in steps:
        if version_key(first) <= key:
            value = v
    return value

