"""Import SGLang 0.5.23's modules on the CUDA serving path with the compiled-package stand-ins, on a machine
without a GPU (scripts/gpu_sglang): torch is told a Hopper GPU is present, so every ``if _is_cuda:``
import block runs as it would on the H200, and the stand-ins must answer each name those blocks import. Nothing
is computed on a GPU: this checks the import graph only (what the path *calls* is native.py's and its tests').
``--in-release``: leave out the modules the installed release has no file for (an older release's layout;
reported as "absent"), and import the rest.

    python scripts/gpu_sglang/import_check.py [--in-release] [MODULE ...]

Prints one JSON object: per module "ok" or the error, the stand-in names that were called during the imports
(must be none), and which stand-in modules were loaded. Exit status 0 when every module imported and no
import-only name was called, 1 otherwise.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# the modules an Engine with an EAGLE-3 DeepseekV3 target, a Llama EAGLE-3 draft and the triton attention backend
# imports on the way to its first forward (entry point, scheduler, runners, models, kernels' Python wrappers)
MODULES = [
    "sglang", "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.model_executor.model_runner", "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
    "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner", "sglang.srt.speculative.eagle_utils",
    "sglang.srt.models.deepseek_v2", "sglang.srt.models.llama_eagle3", "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation", "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.flashattention_backend", "sglang.srt.layers.attention.flashmla_backend",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "sglang.srt.layers.sampler",
    "sglang.srt.layers.logits_processor", "sglang.srt.mem_cache.memory_pool",
    "sglang.kernels.ops.speculative.spec_tree", "sglang.kernels.ops.gemm.cutedsl_dual_gemm",
    # python -m sglang.launch_server: the HTTP server and its OpenAI routes, which import more than the Engine
    # does (soundfile through openai/serving_transcription -> audio_chunking)
    "sglang.launch_server", "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.openai.serving_transcription",
]
STANDIN_ROOTS = ("sgl_kernel", "flash_mla", "flashinfer", "deep_gemm", "cutlass", "IPython", "soundfile")


def pretend_hopper() -> None:
    """torch answers as on one H200 (capability 9.0): SGLang's is_cuda() and its capability checks."""
    import torch

    class _Props:
        name = "NVIDIA H200"
        total_memory = 143 * 2**30
        multi_processor_count = 132
        major, minor = 9, 0
        L2_cache_size = 60 * 2**20

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: _Props()
    torch.cuda.get_device_name = lambda *a, **k: _Props.name
    if torch.version.cuda is None:
        torch.version.cuda = "13.0"


def in_release(module: str) -> bool:
    """Whether the installed sglang has a file for ``module`` (read from its folder, nothing imported)."""
    import importlib.util

    root = os.path.dirname(importlib.util.find_spec("sglang").origin)
    rel = os.path.join(root, *module.split(".")[1:])
    return os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py"))


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    only_present = "--in-release" in args
    mods = [a for a in args if a != "--in-release"] or MODULES
    sys.path.insert(0, os.path.join(HERE, "standins"))
    sys.path.insert(1, HERE)
    from compare import CUDA_ENV  # the servers' environment on the GPU machine

    os.environ.update(CUDA_ENV)
    pretend_hopper()
    import e3_standin_stubs

    report = {"modules": {}}
    for m in mods:
        if only_present and not in_release(m):
            report["modules"][m] = "absent"
            continue
        try:
            importlib.import_module(m)
            report["modules"][m] = "ok"
        except BaseException as e:  # every failure is the finding
            report["modules"][m] = f"{type(e).__name__}: {e} | {traceback.format_exc(limit=-3)[-800:]}"
    report["called_import_only_names"] = dict(e3_standin_stubs.CALLED)
    report["standin_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in STANDIN_ROOTS)
    report["sglang"] = getattr(sys.modules.get("sglang"), "__version__", None)
    ok = (all(v in ("ok", "absent") for v in report["modules"].values()) and not report["called_import_only_names"]
          and any(v == "ok" for v in report["modules"].values()))
    report["ok"] = ok
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
