"""Import stand-in for ``flashinfer`` (scripts/gpu_sglang/standins): SGLang 0.5.12 imports from it unguarded on
CUDA (layers/sampler.py: flashinfer.sampling; models/deepseek_v2.py: flashinfer.gemm's 7168 x 256 router GEMM;
layers/attention/vision.py: flashinfer.prefill), none of which a greedy DeepseekV3 target with 2-8 routed experts
and the triton backend calls. Every name is import-only (calling one raises, naming it), except
``flashinfer.fused_moe``, which raises ImportError (its own file): 0.5.12's topk.py tries it and, when it imports,
routes every DeepSeek router through it; without it SGLang takes sgl_kernel's moe_fused_gate (native.py). The
servers run with SGLANG_IS_FLASHINFER_AVAILABLE=false, so nothing chooses a flashinfer backend. Never part of
eagle3-capture."""
import e3_standin_stubs as _stubs

STANDIN = True
__version__ = "0.0.0+e3standin"
_stubs.install_finder(__name__)
__getattr__ = _stubs.module_getattr(__name__)
