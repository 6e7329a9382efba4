"""The import-only stand-ins for what an SGLang release imports whatever the device, where a GPU server has it
installed and this CPU machine does not:

- ``sgl_kernel``: 0.5.12's ``mem_cache/memory_pool_host.py`` runs ``from sgl_kernel.kvcacheio import ...`` unless
  NPU/XPU/MPS (0.5.14 on guard it), and it is reached from ``speculative/eagle_worker_v2.py`` through
  ``managers/scheduler.py``: on a CPU host without sglang-kernel those modules (which the plugin hooks) cannot even
  be imported.
- the CuTe DSL's ``cutlass``: 0.5.15's ``models/deepseek_v2.py`` imports ``layers/attention/dsa/dsa_indexer.py``,
  which imports ``jit_kernel/dsa/cutedsl_paged_mqa_logits.py``, which runs ``import cutlass`` (0.5.16 guards it).

scripts/gpu_sglang/standins holds both: every name resolves, and calling one raises; nothing on the tested paths
calls one. Only the stand-ins a release needs (and the stub machinery they import) go into the folder, never the
GPU kit's others (its IPython would shadow the installed one), and the folder goes last on the path: an installed
module always wins. Used by the model-level harness, the release smoke's servers, scripts/plugin_releases_table.py
and tests/sglang_release_dirs.py's import check, so that all of them see a release as a GPU server does.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import List, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STANDINS = os.path.join(_REPO, "scripts", "gpu_sglang", "standins")
STUBS = "e3_standin_stubs.py"
# each stand-in and the import of the release that fails without it (checked in this order: the second probe runs
# with the first stand-in in place)
PROBES = (("sgl_kernel", "sglang.srt.mem_cache.memory_pool_host"), ("cutlass", "sglang.srt.models.deepseek_v2"))
MODULES = tuple(m for m, _ in PROBES)


def needed_modules() -> List[str]:
    """The stand-ins the installed SGLang needs: each module that is not installed and on which the release's probe
    import fails (imports the probed SGLang modules into this process; the stand-ins found are put on sys.path
    as they are found, so that the next probe gets past them)."""
    found: List[str] = []
    for module, probe in PROBES:
        if importlib.util.find_spec(module) is not None:
            continue
        try:
            importlib.import_module(probe)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] != module:
                raise
            found.append(module)
            _append(make_folder(_session_folder(), found))
    return found


def needed() -> bool:
    """True when the installed SGLang needs a stand-in to import (see needed_modules)."""
    return bool(needed_modules())


def make_folder(folder: str, modules: Sequence[str] = MODULES) -> str:
    """`folder` (created) holding links to these stand-ins and their stubs only; returns it."""
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        raise ValueError(f"no import-only stand-in for {unknown}: known {list(MODULES)}")
    os.makedirs(folder, exist_ok=True)
    for name in (*modules, STUBS):
        link, target = os.path.join(folder, name), os.path.join(STANDINS, name)
        # a folder kept between runs may hold a link into another checkout's stand-ins: point it at this one's
        if not os.path.lexists(link) or os.readlink(link) != target:
            tmp = f"{link}.{os.getpid()}.tmp"
            os.symlink(target, tmp)
            os.replace(tmp, link)  # atomic: a server starting beside this one sees the old link or the new
    return folder


_FOLDER: List[str] = []


def _session_folder() -> str:
    """This process's folder of stand-ins (one, removed at exit)."""
    if not _FOLDER:
        import atexit
        import shutil
        import tempfile

        _FOLDER.append(tempfile.mkdtemp(prefix="e3-import-standins-"))
        atexit.register(shutil.rmtree, _FOLDER[0], True)
    return _FOLDER[0]


def _append(folder: str) -> None:
    if folder not in sys.path:
        sys.path.append(folder)
    importlib.invalidate_caches()


def install() -> List[str]:
    """Put the stand-ins the installed SGLang needs last on sys.path (in a folder removed at exit); returns their
    names (none where the release imports without them)."""
    return needed_modules()
