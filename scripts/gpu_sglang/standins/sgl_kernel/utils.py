"""Import stand-in for ``sgl_kernel.utils`` (scripts/gpu_sglang/standins): ``is_arch_support_pdl`` is real (the triton
attention backend calls it); other names are import-only."""
import e3_standin_stubs as _stubs

from .native import is_arch_support_pdl  # noqa: F401

__getattr__ = _stubs.module_getattr(__name__)
