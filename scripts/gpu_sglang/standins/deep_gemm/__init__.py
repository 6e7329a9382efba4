"""Import stand-in for DeepGEMM's ``deep_gemm`` (scripts/gpu_sglang/standins): SGLang 0.5.20 imports it unguarded on
CUDA (layers/attention/dsa_backend.py, reached from models/deepseek_v2.py through the MLA forward methods); a bf16
target never calls it (its GEMMs are fp8). Every name is import-only (calling one raises, naming it). The servers
run with SGLANG_ENABLE_JIT_DEEPGEMM=false, so SGLang's DeepGEMM switch stays off although the import succeeds.
Never part of eagle3-capture."""
import e3_standin_stubs as _stubs

STANDIN = True
__version__ = "0.0.0+e3standin"
_stubs.install_finder(__name__)
__getattr__ = _stubs.module_getattr(__name__)
