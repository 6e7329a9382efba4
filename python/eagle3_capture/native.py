"""Loads the compiled extension `eagle3_capture._C` and says what it was built with."""
from __future__ import annotations

import json
from functools import lru_cache


@lru_cache(maxsize=None)
def load():
    """Imports `_C`, which registers torch.ops.eagle3_capture.*; raises ImportError saying how to build it."""
    import torch  # noqa: F401  (the ops library links against torch; it must be loaded first)

    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "eagle3_capture._C is not built or does not load "
            f"({e}). Build it with `pip install --no-build-isolation -e .` in the repository "
            "(or `make test`, which does that in .venv)."
        ) from e
    return _C


def build_info() -> dict:
    """What the extension was built with: backends, CUDA archs, CUDA and torch versions (build and runtime)."""
    import torch

    info = json.loads(load().build_info())
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(";") if a]
    info["torch_runtime_version"] = torch.__version__
    info["cuda_runtime_available"] = bool(torch.cuda.is_available())
    if torch.cuda.is_available():
        info["devices"] = [
            f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count())
        ]
    return info
