"""Test-only SGLang 0.5.23 plugin: what its real serving loop needs to run on a machine with no GPU.

Active only with ``E3_SGLANG_CPU_STANDINS=1`` (the engine tests set it; ``TRITON_INTERPRET=1`` must be set too, so
SGLang's Triton kernels run in Triton's interpreter on CPU tensors). Each stand-in answers one thing that stops
SGLang's loop on a CPU-only host:

* ``vllm._custom_ops``: ``RotaryEmbedding.__init__`` imports it when there is no GPU; it is never called in the
  forward, so an empty module (whose function raises if it ever is) suffices.
* ``get_rope_cpu`` asserts a deepseek-yarn ``rope_scaling``; for ``rope_scaling is None`` SGLang's own ``get_rope``
  builds the plain rotary embedding (an AROUND hook through SGLang's HookRegistry).
* ``kernels/ops/speculative/spec_tree.py`` and ``cache_locs.py`` have no branch for a CPU host without
  ``sgl_kernel`` (tree build, greedy verify; the verify's KV write locations, which a chain gets elsewhere but a
  tree (eagle-topk > 1) gets from ``assign_extend_cache_locs*``, whose fall-through returns None): their XPU
  branches call SGLang's own Triton kernels, which then run interpreted.

* Older releases (0.5.12, 0.5.20) need more, each feature-detected so that none applies on 0.5.23: see releases.py
  (torch versions of the tree kernels that 0.5.12 only has in sgl_kernel, its verify's KV locations, the draft's
  ``torch.cuda.synchronize()``, ``record_stream`` on CPU tensors in the overlap scheduler; 0.5.20's eagle_utils
  routed to SGLang's Triton tree kernels).

* At ``tp_size`` > 1, SGLang's group coordinators default to PyNccl (and the custom all-reduce), which need a GPU;
  ``init_model_parallel_group`` gets them switched off, leaving gloo's torch.distributed collectives.

Nothing here changes what SGLang computes on the paths the tests exercise; it only lets them run, except the one
fault a test asks for: ``E3_SGLANG_CPU_SHIFT_CAPTURE=1`` moves every capture one layer later at the target's first
forward (a capture wired wrong at run time, for the plugin's self-test to find); ``E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER=N``
(N >= 1) moves it at the N-th served target forward (``ModelRunner.forward`` of the target's runner) instead, so that
the start-up self-test passes and a re-check while serving fails.

``E3_SGLANG_RESHAPE_TARGET=<gain>[:<seed>]`` (reshape.py, on a GPU too, without the stand-ins): a dummy-weight
target gets weights whose layers differ, right after its load.

A test witness, changing nothing: ``E3_SGLANG_CPU_RECORD_DRAFT=<dir>`` saves what the EAGLE-3 Llama draft was fed
(``spec_info.hidden_states``, the packed target slots before its fc) at each draft forward that takes them, so a
test can compare the plugin's dump with what the served draft really got.
"""
from __future__ import annotations

import logging
import os
import sys
import types

ENV = "E3_SGLANG_CPU_STANDINS"
logger = logging.getLogger("e3_sglang_cpu")


def stub_vllm() -> None:
    """Only ``vllm._custom_ops`` is stood in for, and only where no real one is importable. A ``vllm`` that is
    already imported without it (a namespace package a folder named vllm on sys.path makes) keeps its name and gets
    the stand-in attribute: skipping the stand-in there is what left SGLang's RotaryEmbedding failing to import."""
    if "vllm._custom_ops" in sys.modules:
        return
    vllm = sys.modules.get("vllm")
    if vllm is None:
        try:
            import vllm._custom_ops  # noqa: F401  (a real vLLM: nothing to stand in for)
            return
        except ImportError:  # no vllm, or one without _custom_ops (kept if the attempt imported it)
            vllm = sys.modules.get("vllm") or types.ModuleType("vllm")
    ops = types.ModuleType("vllm._custom_ops")

    def rotary_embedding(*args, **kwargs):
        raise RuntimeError("vllm._custom_ops.rotary_embedding is a CPU-test stand-in and must not be called")

    ops.rotary_embedding = rotary_embedding
    vllm._custom_ops = ops
    sys.modules["vllm"] = vllm
    sys.modules["vllm._custom_ops"] = ops


def get_rope_cpu_hook(original, head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                      dtype=None, partial_rotary_factor=1.0, device=None):
    if rope_scaling is None:
        from sglang.srt.layers.rotary_embedding import factory

        return factory.get_rope(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                                partial_rotary_factor)
    return original(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                    partial_rotary_factor, device)


def shift_capture_hook(original, self, *args, **kwargs):
    """AROUND ``DeepseekV2Model.forward`` (fault injection): layers_to_capture [i, ...] -> [i + 1, ...], once."""
    if not getattr(self, "_e3_shifted", False) and getattr(self, "layers_to_capture", None):
        self.layers_to_capture = [i + 1 for i in self.layers_to_capture]
        self._e3_shifted = True
        logger.warning("e3_sglang_cpu: capture shifted on purpose: layers_to_capture %s", self.layers_to_capture)
    return original(self, *args, **kwargs)


SHIFT_AFTER_ENV = "E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER"
_target_forwards = [0]


def shift_after(environ=None) -> int:
    """The served target forward at which the capture moves (E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER); raises ValueError
    on anything but a whole number >= 1 (a test asking for a fault must get that fault)."""
    raw = (os.environ if environ is None else environ).get(SHIFT_AFTER_ENV, "")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{SHIFT_AFTER_ENV}={raw!r}: expected the served target forward (1, 2, ...) at which the "
                         "capture moves one layer later")
    return int(raw)


def shift_capture_after_hook(original, self, *args, **kwargs):
    """AROUND ``ModelRunner.forward`` (fault injection): at the N-th forward of the target's runner, layers_to_capture
    [i, ...] -> [i + 1, ...] on its DeepseekV2Model, once, before that forward runs."""
    if not getattr(self, "is_draft_worker", False):
        _target_forwards[0] += 1
        inner = getattr(getattr(self, "model", None), "model", None)
        if (_target_forwards[0] == shift_after() and getattr(inner, "layers_to_capture", None)
                and not getattr(inner, "_e3_shifted", False)):
            inner.layers_to_capture = [i + 1 for i in inner.layers_to_capture]
            inner._e3_shifted = True
            logger.warning("e3_sglang_cpu: capture shifted on purpose at served target forward %d: "
                           "layers_to_capture %s", _target_forwards[0], inner.layers_to_capture)
    return original(self, *args, **kwargs)


_recorded = [0]
RECORD_MAX = 400


def record_draft_input_hook(original, self, input_ids, positions, forward_batch, *args, **kwargs):
    """AROUND ``llama_eagle3.LlamaModel.forward`` (witness): save the target slots the draft is fed."""
    import torch

    hs = getattr(getattr(forward_batch, "spec_info", None), "hidden_states", None)
    fc = getattr(self, "fc", None)
    d = os.environ.get("E3_SGLANG_CPU_RECORD_DRAFT")
    if (d and _recorded[0] < RECORD_MAX and isinstance(hs, torch.Tensor) and hs.dim() == 2
            and fc is not None and hs.shape[-1] == getattr(fc, "in_features", -1)):
        os.makedirs(d, exist_ok=True)
        mode = getattr(forward_batch, "forward_mode", None)
        rids = getattr(forward_batch, "rids", None)
        torch.save({"hidden_states": hs.detach().clone(), "forward_mode": getattr(mode, "name", str(mode)),
                    "rids": None if rids is None else [str(r) for r in rids],
                    "input_ids": input_ids.detach().clone() if isinstance(input_ids, torch.Tensor) else None},
                   os.path.join(d, f"draft_fed_pid{os.getpid()}_{_recorded[0]:05d}.pt"))
        _recorded[0] += 1
    return original(self, input_ids, positions, forward_batch, *args, **kwargs)


def init_model_parallel_group_hook(original, *args, **kwargs):
    from .releases import model_parallel_group_off_switches

    # the switches' names differ between releases (releases.py): pass only those this release's signature has
    kwargs.update(model_parallel_group_off_switches(original))
    return original(*args, **kwargs)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .reshape import ENV as RESHAPE_ENV

    if os.environ.get(RESHAPE_ENV):  # GPU runs too (reshape.py): independent of the CPU stand-ins
        from .reshape import register_reshape

        register_reshape(HookRegistry, HookType)
    if os.environ.get(ENV) != "1":
        return

    stub_vllm()
    HookRegistry.register("sglang.srt.layers.rotary_embedding.factory.get_rope_cpu", get_rope_cpu_hook,
                          HookType.AROUND)
    HookRegistry.register("sglang.srt.distributed.parallel_state.init_model_parallel_group",
                          init_model_parallel_group_hook, HookType.AROUND)
    from .releases import (has_kernels_package, register_cpu_record_stream_free, register_cuda_synchronize_free,
                           register_extend_cache_locs_without_kernels, register_no_pin_without_cuda,
                           register_spec_tree_without_kernels, route_eagle_utils_to_triton)

    if has_kernels_package():
        import sglang.kernels.ops.speculative.cache_locs as cache_locs
        import sglang.kernels.ops.speculative.spec_tree as spec_tree

        spec_tree._is_xpu = True
        cache_locs._is_xpu = True
        route_eagle_utils_to_triton()  # 0.5.16-0.5.22: the tree kernels' branch is still chosen in eagle_utils
    elif not (register_spec_tree_without_kernels(HookRegistry, HookType)  # an older release's layout (releases.py)
              and register_extend_cache_locs_without_kernels(HookRegistry, HookType)):
        logger.warning("e3_sglang_cpu: this SGLang has neither the 0.5.23 nor the 0.5.12 layout of the speculative "
                       "tree kernels; no CPU stand-in for them")
    # 0.5.12 only (feature-detected, releases.py): torch.cuda.synchronize in the draft's set_embed, record_stream on
    # CPU tensors in the overlap scheduler
    register_cuda_synchronize_free(HookRegistry, HookType)
    register_cpu_record_stream_free(HookRegistry, HookType)
    register_no_pin_without_cuda(HookRegistry, HookType)  # 0.5.12: input logprobs' pinned index tensors
    if os.environ.get("E3_SGLANG_CPU_RECORD_DRAFT"):
        HookRegistry.register("sglang.srt.models.llama_eagle3.LlamaModel.forward", record_draft_input_hook,
                              HookType.AROUND)
    if os.environ.get("E3_SGLANG_CPU_SHIFT_CAPTURE") == "1":
        HookRegistry.register("sglang.srt.models.deepseek_v2.DeepseekV2Model.forward", shift_capture_hook,
                              HookType.AROUND)
    if os.environ.get(SHIFT_AFTER_ENV) is not None:
        shift_after()  # a malformed value stops the test's server here, at plugin load
        HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.forward", shift_capture_after_hook,
                              HookType.AROUND)
    logger.warning("e3_sglang_cpu: CPU test stand-ins active (pid %d)", os.getpid())
