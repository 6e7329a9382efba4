"""Import stand-in for ``flash_mla`` (scripts/gpu_sglang/standins): SGLang imports it through eagle_worker_v2 ->
flashmla_backend -> kernels/ops/attention/flash_mla_interface.py; the triton backend never calls it. Every name
is import-only (calling one raises)."""
import e3_standin_stubs as _stubs

STANDIN = True
_stubs.install_finder(__name__)
__getattr__ = _stubs.module_getattr(__name__)
