"""The import-only ``sgl_kernel`` stand-in, for an SGLang release that imports sgl_kernel whatever the device.

0.5.12's ``mem_cache/memory_pool_host.py`` runs ``from sgl_kernel.kvcacheio import ...`` unless NPU/XPU/MPS (0.5.14
on guard it), and it is reached from ``speculative/eagle_worker_v2.py`` through ``managers/scheduler.py``. On a CPU
host without sglang-kernel those modules (which the plugin hooks) cannot even be imported, as they can on every GPU
server. scripts/gpu_sglang/standins/sgl_kernel resolves every name and raises when one is called; nothing on the
tested paths calls one.

Only sgl_kernel and the stub machinery it imports go into the folder, never the GPU kit's other stand-ins (its
IPython would shadow the installed one). Used by the model-level harness, the release smoke's servers and
scripts/plugin_releases_table.py, so that all three see a release as a GPU server does.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STANDINS = os.path.join(_REPO, "scripts", "gpu_sglang", "standins")
NAMES = ("sgl_kernel", "e3_standin_stubs.py")


def needed() -> bool:
    """True when no sgl_kernel is installed and the installed SGLang's memory_pool_host import fails on it."""
    if importlib.util.find_spec("sgl_kernel") is not None:
        return False
    try:
        importlib.import_module("sglang.srt.mem_cache.memory_pool_host")
    except ModuleNotFoundError as e:
        return (e.name or "").split(".")[0] == "sgl_kernel"
    return False


def make_folder(folder: str) -> str:
    """`folder` (created) holding links to the stand-in and its stubs only; returns it."""
    os.makedirs(folder, exist_ok=True)
    for name in NAMES:
        link = os.path.join(folder, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(STANDINS, name), link)
    return folder


def install() -> None:
    """Where :func:`needed`, the stand-in in a temporary folder (removed at exit), last on sys.path."""
    import atexit
    import shutil
    import sys
    import tempfile

    if not needed():
        return
    d = make_folder(tempfile.mkdtemp(prefix="e3-sgl-kernel-standin-"))
    atexit.register(shutil.rmtree, d, True)
    sys.path.append(d)
    importlib.invalidate_caches()
