"""Import stand-in for sglang-kernel's ``sgl_kernel`` (scripts/gpu_sglang/standins): the torch implementations in
native.py for what SGLang 0.5.23 calls on the tested CUDA path, and an import-only name (calling it raises) for
everything else it imports, from this package or any submodule of it. Never part of eagle3-capture."""
import e3_standin_stubs as _stubs

from .native import EXPORTS as _EXPORTS
from .native import *  # noqa: F401,F403  (the implemented functions, by their sgl_kernel names)
from .native import top_k_renorm_prob, top_k_renorm_probs, top_p_renorm_prob, top_p_renorm_probs  # noqa: F401

__version__ = "0.0.0+e3standin"  # SGLang's version check is skipped (SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1)
__all__ = list(_EXPORTS)
STANDIN = True

def _define_ops():
    """sgl_kernel's torch op namespace for the ops SGLang names at import (native.OPS), on every backend."""
    import torch

    from . import native

    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, schema in native.OPS.items():
        lib.define(name + schema)
        fn = getattr(native, name)
        lib.impl(name, lambda *a, _fn=fn: list(_fn(*a)), "CompositeExplicitAutograd")
    return lib


_LIB = _define_ops()  # kept alive: the ops live as long as the library object
_stubs.install_finder(__name__)
__getattr__ = _stubs.module_getattr(__name__)
