"""Import stand-in for the CuTe DSL's ``cutlass`` (scripts/gpu_sglang/standins): SGLang imports it at module level, e.g.
layers/dual_gemm.py -> kernels/ops/gemm/cutedsl_dual_gemm.py for the Llama draft's MLP, which selects the dual
GEMM only for 16-bit weights (never in this float32 run). Every name is import-only (calling one raises, bare
decorators pass the function through)."""
import e3_standin_stubs as _stubs

STANDIN = True
_stubs.install_finder(__name__)
__getattr__ = _stubs.module_getattr(__name__)
