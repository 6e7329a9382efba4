"""Test-only stand-ins that SGLang releases older than 0.5.23 need on a CPU-only host (0.5.12, 0.5.20), beside the
0.5.23 ones in ``__init__.py``. Each is feature-detected (what the installed SGLang has, never its version string),
so on 0.5.23 none of them applies. docs/sglang_cpu_releases.md lists every blocker they answer.

* Speculative tree kernels (0.5.12: ``sglang/srt/speculative/eagle_utils.py``; there is no ``sglang.kernels``
  package yet, and no Triton fallback). ``build_tree_kernel_efficient`` calls ``sgl_build_tree_kernel_efficient``,
  a name the module imports from ``sgl_kernel`` only on CUDA/HIP/MUSA: on a CPU host the name is undefined
  (NameError at the first draft). ``verify_tree_greedy_func`` has branches for CUDA/HIP/MUSA and NPU only: on a CPU
  host it returns its outputs untouched, i.e. it silently accepts nothing and predicts garbage. The torch-native
  functions below compute what sgl_kernel's CUDA kernels compute (the semantics as written out in 0.5.23's Triton
  versions, ``sglang/kernels/ops/speculative/spec_tree.py``), one request at a time in Python: a few draft tokens
  per request, so the cost is negligible next to the interpreted Triton attention.
"""
from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("e3_sglang_cpu")

def has_kernels_package() -> bool:
    """SGLang 0.5.23's layout: the speculative kernels live in ``sglang.kernels.ops.speculative`` (spec_tree,
    cache_locs); 0.5.12 has no ``sglang.kernels``."""
    if importlib.util.find_spec("sglang.kernels") is None:
        return False
    return all(importlib.util.find_spec(f"sglang.kernels.ops.speculative.{m}") is not None
               for m in ("spec_tree", "cache_locs"))


def _native():
    """scripts/gpu_sglang/standins/sgl_kernel/native.py (torch only), where the tree kernels' torch versions live:
    the GPU programs' sgl_kernel stand-in serves them to 0.5.12's CUDA path, this plugin to its CPU path."""
    from .sgl_kernel_standin import STANDINS

    spec = importlib.util.spec_from_file_location("e3_sgl_kernel_native", f"{STANDINS}/sgl_kernel/native.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_NATIVE = _native()
build_tree_kernel_efficient_torch = _NATIVE.build_tree_kernel_efficient
verify_tree_greedy_torch = _NATIVE.verify_tree_greedy


def verify_tree_greedy_func_hook(original, predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                 retrieve_next_token, retrieve_next_sibling, target_predict, topk=-1):
    """AROUND 0.5.12's ``eagle_utils.verify_tree_greedy_func``: on a CPU tensor (which the original leaves
    untouched) run the torch-native kernel; anything else goes to SGLang's own function."""
    if predicts.device.type != "cpu":
        return original(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                        retrieve_next_sibling, target_predict, topk)
    verify_tree_greedy_torch(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                             retrieve_next_token, retrieve_next_sibling, target_predict)
    return predicts, accept_index, accept_token_num


def register_spec_tree_without_kernels(HookRegistry, HookType) -> bool:
    """The 0.5.12 layout (no ``sglang.kernels``; tree build and greedy verify in ``srt/speculative/eagle_utils.py``
    with CUDA/NPU branches only): fill in the torch-native kernels. False when that layout is not there."""
    if has_kernels_package():
        return False
    try:
        import sglang.srt.speculative.eagle_utils as eagle_utils
    except ImportError:
        return False
    if not hasattr(eagle_utils, "verify_tree_greedy_func"):
        return False
    if not hasattr(eagle_utils, "sgl_build_tree_kernel_efficient"):  # imported there only on CUDA/HIP/MUSA
        eagle_utils.sgl_build_tree_kernel_efficient = build_tree_kernel_efficient_torch
    HookRegistry.register("sglang.srt.speculative.eagle_utils.verify_tree_greedy_func",
                          verify_tree_greedy_func_hook, HookType.AROUND)
    return True


def route_eagle_utils_to_triton() -> bool:
    """The 0.5.16-0.5.22 layout: ``sglang.kernels.ops.speculative.spec_tree`` holds the Triton tree kernels, but
    ``srt/speculative/eagle_utils.py`` still chooses the branch itself: ``build_tree_kernel_efficient`` and
    ``verify_tree_greedy_func`` call sgl_kernel on CUDA/HIP/MUSA, its CPU engine's kernels with
    ``SGLANG_USE_CPU_ENGINE``, SGLang's own Triton versions (``sgl_build_tree_kernel_triton``,
    ``verify_tree_greedy_triton``) on XPU, and on this host neither (NameError on
    ``sgl_build_tree_kernel_efficient`` at the first draft; the verify would return its outputs untouched). With the
    module's ``_is_xpu`` set they take the Triton branch, interpreted, as 0.5.23's spec_tree is routed. Its one other
    use there picks the greedy verify for greedy, CPU, HIP or XPU batches, which a greedy batch takes anyway.
    False when that layout is not there (0.5.23 has neither function in eagle_utils)."""
    try:
        import sglang.srt.speculative.eagle_utils as eagle_utils
    except ImportError:
        return False
    if not all(hasattr(eagle_utils, n) for n in ("_is_xpu", "sgl_build_tree_kernel_triton",
                                                  "verify_tree_greedy_triton")):
        return False
    eagle_utils._is_xpu = True
    return True


def assign_extend_cache_locs_func_hook(original, *args, **kwargs):
    """AROUND 0.5.12's ``eagle_info_v2.assign_extend_cache_locs_func`` (the verify's KV write locations, used by
    EAGLEWorkerV2 for a chain too). Its CUDA/HIP/MUSA branch launches SGLang's own Triton kernel
    ``assign_extend_cache_locs``; there is an NPU branch and nothing else, so on a CPU host it returns None and the
    verify forward then writes the KV cache at ``kv_buffer[None]`` (a shape error). For the call only, the module's
    ``_is_cuda`` reads True, so that Triton branch runs (interpreted, TRITON_INTERPRET=1) on the CPU tensors -- as
    0.5.23's ``cache_locs`` gets routed to its Triton kernels through ``_is_xpu``."""
    import sglang.srt.speculative.eagle_info_v2 as eagle_info_v2

    device = kwargs.get("device", args[6] if len(args) > 6 else None)
    if str(device).split(":")[0] != "cpu":
        return original(*args, **kwargs)
    saved = eagle_info_v2._is_cuda
    eagle_info_v2._is_cuda = True
    try:
        return original(*args, **kwargs)
    finally:
        eagle_info_v2._is_cuda = saved


def register_extend_cache_locs_without_kernels(HookRegistry, HookType) -> bool:
    """The 0.5.12 layout: ``assign_extend_cache_locs_func`` in ``srt/speculative/eagle_info_v2.py``, choosing its
    branch by the module's ``_is_cuda``. False when that layout is not there."""
    if has_kernels_package():
        return False
    try:
        import sglang.srt.speculative.eagle_info_v2 as eagle_info_v2
    except ImportError:
        return False
    if not (hasattr(eagle_info_v2, "assign_extend_cache_locs_func") and hasattr(eagle_info_v2, "_is_cuda")
            and hasattr(eagle_info_v2, "assign_extend_cache_locs")):
        return False
    HookRegistry.register("sglang.srt.speculative.eagle_info_v2.assign_extend_cache_locs_func",
                          assign_extend_cache_locs_func_hook, HookType.AROUND)
    return True


def model_parallel_group_off_switches(original) -> dict:
    """The GPU-communicator switches of ``init_model_parallel_group`` under the names the installed release uses
    (0.5.23 ``use_mscclpp``, 0.5.12 ``use_mscclpp_allreduce``), all off: only those its signature accepts."""
    import inspect

    names = ("use_pynccl", "use_custom_allreduce", "use_mscclpp", "use_mscclpp_allreduce",
             "use_torch_symm_mem_allreduce")
    params = inspect.signature(inspect.unwrap(original)).parameters
    return {n: False for n in names if n in params}


# ------------------------------------------------------------------------------------------------------------------
# torch.cuda.synchronize() on a host without CUDA
# ------------------------------------------------------------------------------------------------------------------

# (dotted path, why): methods that call torch.cuda.synchronize() whatever the device (0.5.12; 0.5.23 calls
# current_platform.synchronize() there). With no NVIDIA driver, torch's lazy CUDA init raises.
CUDA_SYNC_METHODS = (
    # the EAGLE-3 draft (LlamaForCausalLMEagle3 inherits it) takes the target's embedding at draft-worker init
    "sglang.srt.models.llama.LlamaForCausalLM.set_embed",
    "sglang.srt.models.llama.LlamaForCausalLM.set_embed_and_head",
)


class _NoCudaSynchronize:
    """While SGLang's own method runs on a host without CUDA: torch.cuda.synchronize is a no-op (there is no CUDA
    work to wait for); restored afterwards."""

    def __enter__(self):
        import torch

        self._saved = torch.cuda.synchronize
        torch.cuda.synchronize = lambda device=None: None
        return self

    def __exit__(self, *exc):
        import torch

        torch.cuda.synchronize = self._saved
        return False


def cuda_synchronize_free_hook(original, *args, **kwargs):
    """AROUND a method of CUDA_SYNC_METHODS: SGLang's own method, its CUDA synchronize skipped when torch has no
    CUDA device (on a CUDA host it runs untouched)."""
    import torch

    if torch.cuda.is_available():
        return original(*args, **kwargs)
    with _NoCudaSynchronize():
        return original(*args, **kwargs)


def register_cuda_synchronize_free(HookRegistry, HookType) -> list:
    """Hook every method of CUDA_SYNC_METHODS whose source calls torch.cuda.synchronize (feature-detected: on 0.5.23
    none does). The dotted paths hooked."""
    import importlib
    import inspect

    hooked = []
    for path in CUDA_SYNC_METHODS:
        mod_name, cls_name, meth = path.rsplit(".", 2)
        try:
            fn = getattr(getattr(importlib.import_module(mod_name), cls_name), meth)
            src = inspect.getsource(fn)
        except (ImportError, AttributeError, OSError, TypeError):
            continue
        if "torch.cuda.synchronize()" in src:
            HookRegistry.register(path, cuda_synchronize_free_hook, HookType.AROUND)
            hooked.append(path)
    return hooked


# ------------------------------------------------------------------------------------------------------------------
# Tensor.record_stream on CPU tensors (the overlap scheduler)
# ------------------------------------------------------------------------------------------------------------------

# 0.5.12's overlap scheduler calls ``tensor.record_stream(current_stream())`` on CPU tensors, where torch raises
# "unknown parameter type": in ``managers/overlap_utils.py: FutureMap.resolve_future`` on every batch and in
# ``speculative/eagle_worker_v2.py: EAGLEWorkerV2.verify``, both inside ``Scheduler.run_batch``. 0.5.23 guards those
# calls with ``if indices.device.type != "cpu"`` (its comment: "CPU has no cross-stream reuse hazard (and
# record_stream rejects CPU tensors)"): skipping them on CPU is SGLang's own later behaviour.
# (hooked method, the method whose unguarded record_stream call says the release needs it)
RECORD_STREAM_METHODS = (("sglang.srt.managers.scheduler.Scheduler.run_batch",
                          "sglang.srt.managers.overlap_utils.FutureMap.resolve_future"),)


class _CpuRecordStreamFree:
    """While SGLang's own method runs: ``Tensor.record_stream`` is skipped for CPU tensors, kept for the rest."""

    def __enter__(self):
        import torch

        self._saved = torch.Tensor.record_stream
        saved = self._saved

        def record_stream(t, stream):
            if t.device.type == "cpu":
                return None
            return saved(t, stream)

        torch.Tensor.record_stream = record_stream
        return self

    def __exit__(self, *exc):
        import torch

        torch.Tensor.record_stream = self._saved
        return False


def cpu_record_stream_free_hook(original, *args, **kwargs):
    """AROUND a method of RECORD_STREAM_METHODS: SGLang's own method, record_stream on CPU tensors skipped."""
    with _CpuRecordStreamFree():
        return original(*args, **kwargs)


def register_cpu_record_stream_free(HookRegistry, HookType) -> list:
    """Hook each method of RECORD_STREAM_METHODS when its witness calls record_stream without the CPU guard 0.5.23
    has (feature-detected from the witness's source). The dotted paths hooked."""
    import importlib
    import inspect

    hooked = []
    for path, witness in RECORD_STREAM_METHODS:
        mod_name, cls_name, meth = witness.rsplit(".", 2)
        try:
            src = inspect.getsource(getattr(getattr(importlib.import_module(mod_name), cls_name), meth))
        except (ImportError, AttributeError, OSError, TypeError):
            continue
        if "record_stream(" in src and '!= "cpu"' not in src:
            HookRegistry.register(path, cpu_record_stream_free_hook, HookType.AROUND)
            hooked.append(path)
    return hooked


# ------------------------------------------------------------------------------------------------------------------
# pinned host memory on a host without CUDA (input logprobs)
# ------------------------------------------------------------------------------------------------------------------

# 0.5.12's ``LogitsProcessor`` (``_get_pruned_states``, ``_expand_metadata_for_logprobs``, inside its ``forward``)
# builds index tensors with ``torch.tensor(..., pin_memory=True)`` when a request asks for input logprobs (the
# doctor's teacher-forced pass does); torch needs a CUDA driver to pin ("Found no NVIDIA driver"), and the scheduler
# dies. 0.5.23 passes ``pin_memory=is_pin_memory_available()`` there: not pinning on such a host is SGLang's own
# later behaviour. (hooked method, the module whose source says the release pins unconditionally)
PIN_MEMORY_METHODS = (("sglang.srt.layers.logits_processor.LogitsProcessor.forward",
                       "sglang.srt.layers.logits_processor"),)


class _NoPinWithoutCuda:
    """While SGLang's own method runs on a host without CUDA: ``torch.tensor`` ignores ``pin_memory``."""

    def __enter__(self):
        import torch

        self._saved = saved = torch.tensor

        def tensor(*args, pin_memory=False, **kwargs):
            return saved(*args, **kwargs)

        torch.tensor = tensor
        return self

    def __exit__(self, *exc):
        import torch

        torch.tensor = self._saved
        return False


def no_pin_without_cuda_hook(original, *args, **kwargs):
    """AROUND a method of PIN_MEMORY_METHODS: SGLang's own method; without CUDA nothing is pinned."""
    import torch

    if torch.cuda.is_available():
        return original(*args, **kwargs)
    with _NoPinWithoutCuda():
        return original(*args, **kwargs)


def register_no_pin_without_cuda(HookRegistry, HookType) -> list:
    """Hook each method of PIN_MEMORY_METHODS whose module pins unconditionally (``pin_memory=True``; 0.5.23 asks
    ``is_pin_memory_available()``). The dotted paths hooked."""
    import importlib
    import inspect

    hooked = []
    for path, witness in PIN_MEMORY_METHODS:
        try:
            src = inspect.getsource(importlib.import_module(witness))
        except (ImportError, OSError, TypeError):
            continue
        if "pin_memory=True" in src:
            HookRegistry.register(path, no_pin_without_cuda_hook, HookType.AROUND)
            hooked.append(path)
    return hooked
