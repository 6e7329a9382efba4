"""Run SGLang's real DeepseekV3 model code on a CPU, for the plugin tests, on any release from 0.5.12 to 0.5.23.

A single-process gloo parallel state, SGLang's ForwardBatch (through the attention test kit the wheel ships from
0.5.14, built from SGLang's pools and batch class on 0.5.12), SGLang's ModelRunner.forward, and the few workarounds
a CPU-only machine needs. Nothing here imitates an SGLang class: the model, its layers, the packer, the attention
backend and the batch are SGLang's own; this module only wires them.

Releases differ in how that wiring is done. Each difference is one helper, chosen by what the installed SGLang has
(a module, an attribute, a parameter of a signature), never by its version string, with a comment naming where the
difference is in which release. A test whose subject a release lacks skips with :func:`skip_missing_feature`.

Used in-process by the tests (after `setup_process()`); what needs a fresh process runs through scenarios.py.
"""
from __future__ import annotations

import os
from typing import List, Optional

# The MoE grouped top-k is torch.compile'd in SGLang; on CPU compiling it is slow and useless.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402

_SETUP_DONE = False
# the first set-up failure's text: a later call raises it again instead of retrying (a retry would die on "tensor
# model parallel group is already initialized" and hide the cause behind one error per test)
_SETUP_FAILED: List[str] = []
_PUBLISHED = {}  # what setup_process published: {"server_args": ServerArgs}


def free_port() -> int:
    """A TCP port for the gloo rendezvous, from this pytest-xdist worker's range (tests/free_ports.py; found by its
    path, because the scenario and replica subprocesses import this module without tests/ on sys.path; they inherit
    the worker's PYTEST_XDIST_WORKER, so they draw from its range too)."""
    import importlib.util
    import sys

    module = sys.modules.get("free_ports")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "free_ports.py")
        spec = importlib.util.spec_from_file_location("free_ports", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["free_ports"] = module
    return module.free_port()


def setup_process(world_size: int = 1, rank: int = 0, port: Optional[int] = None) -> None:
    """Once per process: gloo parallel state (tp = world_size, pp = ep = 1) and a published ServerArgs. For
    world_size > 1, every rank's process calls it with the same `port`. Each step that differs between SGLang
    releases is one helper below, chosen by what the installed SGLang has."""
    global _SETUP_DONE
    if _SETUP_DONE:
        return
    if _SETUP_FAILED:  # SGLang's parallel state is half made and cannot be made again in this process: say why once
        raise RuntimeError(f"harness: set-up failed earlier in this process: {_SETUP_FAILED[0]}")
    try:
        _setup(world_size, rank, port)
    except BaseException as e:
        _SETUP_FAILED.append(f"{type(e).__name__}: {e}")
        raise
    _SETUP_DONE = True


def _setup(world_size: int, rank: int, port: Optional[int]) -> None:
    if not torch.cuda.is_available():  # SGLang's rotary embedding imports vllm only where there is no GPU
        from e3_sglang_cpu import stub_vllm  # the test-only CPU stand-ins (tests/sglang_cpu_plugin)

        stub_vllm()
        _sgl_kernel_import_standin()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    from sglang.srt.distributed import parallel_state
    from sglang.srt.server_args import ServerArgs

    parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank, backend="gloo")
    server_args = _server_args(ServerArgs, world_size)
    _publish_server_args(server_args, rank)
    _PUBLISHED["server_args"] = server_args
    if world_size == 1:
        _initialize_model_parallel(parallel_state, world_size)
    else:
        # CPU-only workaround for world > 1: SGLang's group coordinators default to PyNccl and the custom
        # all-reduce, which need a GPU; over gloo, plain torch.distributed collectives are what is left.
        import functools
        from unittest import mock

        from e3_sglang_cpu import init_model_parallel_group_hook

        no_gpu_comms = functools.partial(init_model_parallel_group_hook, parallel_state.init_model_parallel_group)
        with mock.patch.object(parallel_state, "init_model_parallel_group", no_gpu_comms):
            _initialize_model_parallel(parallel_state, world_size)
    _initialize_dp_attention(server_args)
    _route_torch_native_to_mla()


def _sgl_kernel_import_standin() -> None:
    """Where the release imports sgl_kernel whatever the device and none is installed, make it importable with the
    import-only stand-in (e3_sglang_cpu.sgl_kernel_standin), last on sys.path, as the serving smoke does."""
    from e3_sglang_cpu import sgl_kernel_standin

    sgl_kernel_standin.install()


def _server_args(ServerArgs, world_size: int):
    """SGLang's ServerArgs for a "dummy" model (its __post_init__ then stops before resolving anything) with the
    torch_native attention backend.

    Name the backend in `prefill_attention_backend` / `decode_attention_backend` too where ServerArgs takes them: the dummy path leaves them None, and 0.5.12's `DeepseekV2AttentionMLA.
    dispatch_attn_forward_method` (models/deepseek_v2.py) picks its handler by exactly those two (later releases ask
    the attention backend object or the runtime context)."""
    import inspect

    kw = dict(model_path="dummy", tp_size=world_size, pp_size=1, ep_size=1, attention_backend="torch_native")
    fields = inspect.signature(ServerArgs).parameters  # a dataclass up to 0.5.18, a msgspec Struct after
    for name in ("prefill_attention_backend", "decode_attention_backend"):
        if name in fields:
            kw[name] = "torch_native"
    return ServerArgs(**kw)


def _publish_server_args(server_args, rank: int) -> None:
    """Make `server_args` the process's ServerArgs, as the release's own scheduler does.

    - 0.5.21 on (runtime_context.py: `publish(..., ranks=SpawnRanks)`): publish with this rank's placement, which
      later rank reads require.
    - 0.5.18, 0.5.20 (runtime_context.py: `publish(server_args, *, role, hf_config)`, no ranks): publish.
    - 0.5.12-0.5.16 (no `runtime_context.publish`; model_runner.py calls
      `server_args.set_global_server_args_for_scheduler`, which 0.5.16 forwards to its runtime context)."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("sglang.srt.runtime_context") is not None:
        from sglang.srt import runtime_context

        if hasattr(runtime_context, "reset_context"):  # from 0.5.16: a context left by an earlier publish
            runtime_context.reset_context()
        if hasattr(runtime_context, "publish"):
            kw = {}
            if "ranks" in inspect.signature(runtime_context.publish).parameters:
                kw["ranks"] = runtime_context.SpawnRanks(world_rank=rank)
            runtime_context.publish(server_args, role="test", **kw)
            return
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(server_args)


def _initialize_model_parallel(parallel_state, world_size: int) -> None:
    """SGLang's model-parallel groups over gloo.

    - 0.5.21 on (parallel_state.py: `initialize_model_parallel(backend, ...)` reads the widths from
      `runtime_context.get_parallel()`; disaggregation/encoder/server.py stamps the world first): the world group
      stamped permanently, then the groups at the published widths.
    - 0.5.12-0.5.20 (`initialize_model_parallel(tensor_model_parallel_size=..., ...)`, as
      distributed/bootstrap.py or model_runner.py call it): the widths as arguments."""
    import inspect

    params = inspect.signature(parallel_state.initialize_model_parallel).parameters
    if "tensor_model_parallel_size" in params:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size, backend="gloo")
        return
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")


def _initialize_dp_attention(server_args) -> None:
    """Attention data-parallel state (dp size 1 here).

    - 0.5.12-0.5.20 (layers/dp_attention.py: `initialize_dp_attention(server_args, model_config)` sets module
      globals the layers assert on, e.g. `get_attention_dp_size`: "dp attention not initialized!"): called as the
      release's model runner calls it, with a real ModelConfig of the tiny target (read from a saved config.json).
    - 0.5.21 on: the attention DP widths are the runtime context's parallel values published above; nothing to do
      (layers/dp_attention.py: `initialize_dp_attention(server_args)` only sets flags the CPU path never reads)."""
    import inspect

    from sglang.srt.layers import dp_attention

    if "model_config" not in inspect.signature(dp_attention.initialize_dp_attention).parameters:
        return
    from sglang.srt.configs.model_config import ModelConfig

    model_config = ModelConfig.from_server_args(server_args, model_path=tiny_config_dir())
    with _device_named_cpu(server_args, dp_attention) as args:
        dp_attention.initialize_dp_attention(args, model_config)


def _device_named_cpu(server_args, dp_attention):
    """For one call that hands the device to torch.device (the DP-gathered buffer's metadata, unused at dp size 1):
    a "dummy" model path stops ServerArgs.__post_init__ before it resolves `device`, so it is None. Name the CPU for
    that call only; the published args keep None, so the layers keep choosing the paths they choose on a GPU host
    (a "cpu" device would route every rope to get_rope_cpu). Chosen by where the release's dp_attention reads the
    device:

    - 0.5.18 on (layers/dp_attention.py imports `get_device` and reads `get_device().device`): that runtime-context
      leaf overridden in scope; the args are handed on untouched (from 0.5.19 ServerArgs is read-only once
      resolved: assigning `device` raises "server_args.device assigned after resolution").
    - 0.5.12-0.5.16 (it reads `server_args.device`): a copy of the args with device "cpu"."""
    import contextlib
    import copy

    @contextlib.contextmanager
    def scope():
        if hasattr(dp_attention, "get_device"):
            with dp_attention.get_device().override(device="cpu"):
                yield server_args
            return
        args = copy.copy(server_args)
        args.device = "cpu"
        yield args

    return scope()


_TINY_DIR = None


def tiny_config_dir() -> str:
    """A directory holding the tiny target's config.json (once per process; removed at exit)."""
    global _TINY_DIR
    if _TINY_DIR is None:
        import atexit
        import shutil
        import tempfile

        d = tempfile.mkdtemp(prefix="e3-tiny-target-")
        atexit.register(shutil.rmtree, d, True)
        tiny_config().save_pretrained(d)
        from transformers import GenerationConfig  # ModelConfig looks for one and logs its absence

        GenerationConfig().save_pretrained(d)
        _TINY_DIR = d
    return _TINY_DIR


def _route_torch_native_to_mla() -> None:
    """torch_native has no DeepSeek handler in any release (models/deepseek_common/attention_backend_handler.py,
    0.5.12-0.5.23: `AttentionBackendRegistry.get_handler` falls back to triton's), and would take an MHA path that
    cannot read the MLA cache: register it as MLA. Where a release has no registry, fail with which one."""
    import importlib.util

    if importlib.util.find_spec("sglang.srt.models.deepseek_common.attention_backend_handler") is None:
        raise RuntimeError("harness: this SGLang has no models/deepseek_common/attention_backend_handler.py "
                           "(AttentionBackendRegistry): the torch_native -> MLA routing needs a new helper")
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    AttentionBackendRegistry.register("torch_native", lambda attn, fb: AttnForwardMethod.MLA)


PROMPT = [5, 17, 33, 2, 99, 100, 7]
DECODE_TOKEN = 42


# ----------------------------------------------------------------------------------------------------------------
# A tiny DeepseekV3: transformers reference and SGLang's model, same weights
# ----------------------------------------------------------------------------------------------------------------

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
    first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
    # fields transformers 5.19's DeepseekV3Config lacks and SGLang reads
    moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid",
)


def tiny_config(**overrides):
    from transformers import DeepseekV3Config

    kw = dict(TINY)
    kw.update(overrides)
    cfg = DeepseekV3Config(**kw)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    cfg.dtype = torch.float32
    return cfg


def build_hf(cfg, seed: int = 0):
    """The transformers DeepseekV3 with seeded, non-trivial weights (norm weights and router bias included)."""
    from transformers import DeepseekV3ForCausalLM as HFDeepseekV3

    torch.manual_seed(seed)
    model = HFDeepseekV3(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.01 * torch.randn(b.shape, generator=g))
    return model


def build_sglang(cfg, hf_model, device: str = "cpu"):
    """SGLang's own DeepseekV3ForCausalLM for `cfg`, loaded through its load_weights from the HF model's checkpoint
    (built on `device`, as SGLang's loader builds a model: parameters created there, weights copied in)."""
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    setup_process()
    torch.manual_seed(1234)
    with _default_dtype(torch.float32), torch.device(device):
        model = _construct_model(DeepseekV3ForCausalLM, cfg).eval()
    model.load_weights(checkpoint_weights(hf_model))
    model.post_load_weights()
    return model


def checkpoint_weights(hf_model):
    """(name, tensor) as the HF model's checkpoint holds them: what `save_pretrained` writes, read back.

    Not `state_dict()`: transformers 5 keeps the routed experts fused in memory (`mlp.experts.gate_up_proj`,
    [E, 2I, H]) and splits them into per-expert tensors only when it saves, as DeepSeek / Kimi checkpoints hold
    them. SGLang 0.5.12's DeepseekV2 `load_weights` knows only the per-expert names (it skips the fused ones with
    "... not found in params_dict", leaving the experts uninitialised); 0.5.23's takes both. The checkpoint layout
    is what every release's loader reads from disk."""
    import shutil
    import tempfile

    from safetensors.torch import load_file

    from transformers.utils import logging as hf_logging

    d = tempfile.mkdtemp(prefix="e3-tiny-ckpt-")
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar, in every test's output
    try:
        hf_model.save_pretrained(d)
        weights = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                weights.update(load_file(os.path.join(d, f)))
    finally:
        if bar:
            hf_logging.enable_progress_bar()
        shutil.rmtree(d, ignore_errors=True)
    return list(weights.items())


def _construct_model(model_class, cfg):
    """`model_class(cfg)` the way the release's own loader instantiates a model (model_loader/loader.py:
    `_initialize_model`), which decides the shared-experts layout first:

    - 0.5.23 (`layers/moe/utils.py: resolve_shared_experts_config`): the layout resolved, the model built inside
      `get_model().override(shared_experts=...)`, and kept on the model (the model runner's forward reads it).
    - 0.5.18-0.5.22 (`layers/moe/utils.py: install_shared_experts_fusion_decision`): the decision installed into
      the runtime flags before the model is built.
    - 0.5.12-0.5.16: neither; the model class decides by itself."""
    from sglang.srt.layers.moe import utils as moe_utils

    if hasattr(moe_utils, "resolve_shared_experts_config"):
        from sglang.srt.runtime_context import get_model

        shared = moe_utils.resolve_shared_experts_config(model_class, cfg, None)
        with get_model().override(shared_experts=shared):
            model = model_class(cfg)
        model.shared_experts_config = shared
        return model
    if hasattr(moe_utils, "install_shared_experts_fusion_decision"):
        moe_utils.install_shared_experts_fusion_decision(model_class, cfg, None)
    return model_class(cfg)


# ----------------------------------------------------------------------------------------------------------------
# SGLang forward: prefill (extend) then decode steps, through the attention test kit's runner and batch
# ----------------------------------------------------------------------------------------------------------------

def _attention_kit(attention: str):
    """SGLang's attention test kit module for `attention` ("mla" or "mha"), or None where the release ships none.

    The kit (sglang/test/kits/attention_unittest/attention_methods/{mla,dense}_attention.py: a mock ModelRunner
    subclass with SGLang's pools, the backend table, `_make_forward_batch`) ships from 0.5.14 on; 0.5.12's wheel has
    no sglang/test/kits/attention_unittest, and the batch is then built from SGLang's classes directly
    (:meth:`SglangRunner._init_pools`)."""
    import importlib

    if not _attention_kit_shipped(attention):
        return None
    name = {"mla": "mla_attention", "mha": "dense_attention"}[attention]
    return importlib.import_module(f"sglang.test.kits.attention_unittest.attention_methods.{name}")


def _attention_kit_shipped(attention: str) -> bool:
    """Whether the release ships the kit for `attention` (without importing it: importing it changes state)."""
    import importlib.util

    name = {"mla": "mla_attention", "mha": "dense_attention"}[attention]
    try:
        return importlib.util.find_spec(f"sglang.test.kits.attention_unittest.attention_methods.{name}") is not None
    except ModuleNotFoundError:  # a parent package is missing (0.5.12: no sglang/test/kits/attention_unittest)
        return False


def _forward_context(backend):
    """The context SGLang's model code finds the attention backend in.

    - 0.5.14 on (model_executor/forward_context.py): `forward_context(ForwardContext(attn_backend=...))`.
    - 0.5.12 (no forward_context module): RadixAttention reads `forward_batch.attn_backend` (layers/
      radix_attention.py), which the batch carries (:meth:`SglangRunner._make_batch`); no context."""
    import contextlib
    import importlib.util

    if importlib.util.find_spec("sglang.srt.model_executor.forward_context") is None:
        return contextlib.nullcontext()
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    return forward_context(ForwardContext(attn_backend=backend))


class SglangRunner:
    """SGLang's KV pools and torch_native attention backend for one sequence (the attention test kit's mock model
    runner where the release ships the kit: MLA for DeepseekV2-family models, MHA for Llama-family drafts; SGLang's
    pools and backend built directly where it does not); runs extend, then decode steps."""

    def __init__(self, cfg, max_context_len: int = 64, attention: str = "mla", device: str = "cpu"):
        setup_process()
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if attention not in ("mla", "mha"):
            raise ValueError(f"attention must be 'mla' or 'mha', got {attention!r}")
        self.cfg = cfg
        self.device = device
        self.attention = attention
        self.max_context_len = max_context_len
        self.seq_len = 0
        from sglang.srt.distributed import parallel_state

        if parallel_state.get_tensor_model_parallel_world_size() > 1 and _attention_kit_shipped(attention):
            # mla_attention.py / dense_attention.py enter get_parallel().override(attn_tp_size=1) when imported,
            # for good: at TP > 1 that is a wrong layout (0.5.21 on refuse it: "parallel topology is
            # inconsistent"). Only the kit-free path (0.5.12 here) runs a TP > 1 forward.
            raise NotImplementedError(
                f"SglangRunner at TP > 1 on SGLang {sglang_release()}: its attention test kit pins attn_tp_size=1 "
                "when imported; build the TP forward from SGLang's pools without the kit")
        self.kit = _attention_kit(attention)
        if self.kit is None:
            self._init_pools()
            return
        kit = self.kit
        if attention == "mla":
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

            mc = kit.TinyMLAModelConfig(num_heads=cfg.num_attention_heads, kv_lora_rank=cfg.kv_lora_rank,
                                        qk_rope_head_dim=cfg.qk_rope_head_dim, hidden_size=cfg.hidden_size,
                                        context_len=max_context_len)
            self.runner = kit.MockMLAModelRunner(case=self._case(ForwardMode.EXTEND, 1), model_config=mc,
                                                 dtype=torch.float32, device=device, max_context_len=max_context_len,
                                                 kv_lora_rank=cfg.kv_lora_rank,
                                                 qk_rope_head_dim=cfg.qk_rope_head_dim)
            # The kit's pool has one layer; the model has num_hidden_layers.
            self.runner.token_to_kv_pool = MLATokenToKVPool(
                size=max_context_len + 2, page_size=1, dtype=torch.float32, kv_lora_rank=cfg.kv_lora_rank,
                qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=cfg.num_hidden_layers, device=device,
                enable_memory_saver=False)
        else:
            head_dim = self._head_dim()
            assert cfg.num_hidden_layers == 1, "the dense kit's KV pool has one layer"
            mc = kit.TinyModelConfig(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                                     head_dim=head_dim, hidden_size=cfg.hidden_size, context_len=max_context_len)
            self.runner = kit.MockModelRunner(case=self._case(ForwardMode.EXTEND, 1), model_config=mc,
                                              dtype=torch.float32, device=device, max_context_len=max_context_len,
                                              head_dim=head_dim)
        self.backend = kit.ATTENTION_BACKENDS["torch_native"](self.runner)

    def _head_dim(self) -> int:
        return getattr(self.cfg, "head_dim", None) or self.cfg.hidden_size // self.cfg.num_attention_heads

    def _init_pools(self):
        """Without the kit (0.5.12): SGLang's ReqToTokenPool, its MLA / MHA KV pool for every layer and its
        TorchNativeAttnBackend, whose constructor reads only `model_runner.device` there
        (layers/attention/torch_native_backend.py); the model runner is SGLang's ModelRunner made with __new__,
        holding what a real one holds for them."""
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.mem_cache import memory_pool
        from sglang.srt.model_executor.model_runner import ModelRunner

        cfg, device = self.cfg, self.device
        size = self._loc(self.max_context_len) + 1  # slot 0 stays unused, as SGLang's allocator keeps it
        if self.attention == "mla":
            kv = memory_pool.MLATokenToKVPool(
                size=size, page_size=1, dtype=torch.float32, kv_lora_rank=cfg.kv_lora_rank,
                qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=cfg.num_hidden_layers, device=device,
                enable_memory_saver=False)
        else:
            kv = memory_pool.MHATokenToKVPool(
                size=size, page_size=1, dtype=torch.float32, head_num=cfg.num_key_value_heads,
                head_dim=self._head_dim(), layer_num=cfg.num_hidden_layers, device=device,
                enable_memory_saver=False, enable_alt_stream=False)
        runner = ModelRunner.__new__(ModelRunner)
        runner.device = device
        runner.req_to_token_pool = memory_pool.ReqToTokenPool(
            size=1, max_context_len=self.max_context_len, device=device, enable_memory_saver=False)
        runner.token_to_kv_pool = kv
        self.runner = runner
        self.backend = TorchNativeAttnBackend(runner)

    @staticmethod
    def _loc(pos: int) -> int:
        """KV-cache slot of position `pos` of the one request (the kit's `_token_loc` at page size 1)."""
        return 1 + pos

    def _make_batch(self, mode, n: int):
        """A ForwardBatch of SGLang's class for the next n tokens, filled as the kit's `_make_forward_batch` fills
        one (request 0 of the pools, page size 1), carrying the pools and backend as a 0.5.12 batch does
        (ForwardBatch.init_new sets `req_to_token_pool`, `token_to_kv_pool`, `attn_backend`)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        dev, i32 = self.device, torch.int32
        prefix = self.seq_len
        seq_len = prefix + n
        for pos in range(seq_len):
            self.runner.req_to_token_pool.req_to_token[0, pos] = self._loc(pos)
        positions = list(range(prefix, seq_len))
        fb = ForwardBatch(
            forward_mode=mode, batch_size=1, input_ids=torch.zeros(n, dtype=torch.int64, device=dev),
            req_pool_indices=torch.zeros(1, dtype=i32, device=dev),
            seq_lens=torch.tensor([seq_len], dtype=i32, device=dev),
            seq_lens_cpu=torch.tensor([seq_len], dtype=i32),
            out_cache_loc=torch.tensor([self._loc(p) for p in positions], dtype=torch.int64, device=dev),
            seq_lens_sum=seq_len, positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            req_to_token_pool=self.runner.req_to_token_pool, token_to_kv_pool=self.runner.token_to_kv_pool,
            attn_backend=self.backend)
        if mode == ForwardMode.EXTEND:
            fb.extend_prefix_lens = torch.tensor([prefix], dtype=i32, device=dev)
            fb.extend_prefix_lens_cpu = [prefix]
            fb.extend_seq_lens = torch.tensor([n], dtype=i32, device=dev)
            fb.extend_seq_lens_cpu = [n]
            fb.extend_start_loc = torch.zeros(1, dtype=i32, device=dev)
            fb.extend_num_tokens = n
        else:
            assert n == 1, "decode takes one token"
        return fb

    def _case(self, mode, n: int):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        kw = dict(name=mode.name.lower(), backend="torch_native", forward_mode=mode,
                  num_heads=self.cfg.num_attention_heads, page_size=1, prefix_lens=(self.seq_len,))
        if self.attention == "mha":
            kw["num_kv_heads"] = self.cfg.num_key_value_heads
            Case = self.kit.DenseAttentionCase
        else:
            Case = self.kit.MLAAttentionCase
        if mode == ForwardMode.EXTEND:
            kw["extend_lens"] = (n,)
        else:
            assert n == 1, "decode takes one token"
        return Case(**kw)

    def batch(self, input_ids: torch.Tensor, mode=None):
        """A real ForwardBatch for the next `input_ids` of the sequence (EXTEND first, DECODE after)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

        if mode is None:
            mode = ForwardMode.EXTEND if self.seq_len == 0 else ForwardMode.DECODE
        if self.kit is None:
            fb = self._make_batch(mode, int(input_ids.numel()))
        else:
            fb = self.kit._make_forward_batch(self._case(mode, int(input_ids.numel())), self.runner,
                                              max_context_len=self.max_context_len, device=self.device)
        fb.input_ids = input_ids.to(device=self.device, dtype=torch.int64)
        fb.capture_hidden_mode = CaptureHiddenMode.FULL
        return fb

    def idle_batch(self):
        """An IDLE ForwardBatch of SGLang's class (no tokens: what a DP rank without requests runs), carrying the
        pools and backend where the batch must (without the kit, 0.5.12)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        e = torch.empty(0, dtype=torch.int64, device=self.device)
        kw = {}
        if self.kit is None:
            kw = dict(req_to_token_pool=self.runner.req_to_token_pool, token_to_kv_pool=self.runner.token_to_kv_pool,
                      attn_backend=self.backend)
        fb = ForwardBatch(forward_mode=ForwardMode.IDLE, batch_size=0, input_ids=e, req_pool_indices=e.int(),
                          seq_lens=e.int(), seq_lens_cpu=e.int().cpu(), out_cache_loc=e, seq_lens_sum=0, positions=e,
                          **kw)
        fb.capture_hidden_mode = CaptureHiddenMode.FULL
        return fb

    def run(self, fn, fb):
        """Call fn(fb) (a model forward) inside SGLang's forward context, then advance the sequence (not when fn
        raises: a caller that knows the KV cache was written advances `seq_len` itself)."""
        with torch.no_grad(), _forward_context(self.backend):
            self.backend.init_forward_metadata(fb)
            out = fn(fb)
        self.seq_len += int(fb.input_ids.numel())
        return out

    def forward(self, model, input_ids: torch.Tensor, mode=None, aux_buffer: Optional[torch.Tensor] = None):
        """One forward of SGLang's model; returns its LogitsProcessorOutput. `mode` defaults to EXTEND for the
        first call and DECODE after. `aux_buffer` plays the decode CUDA-graph runner's preallocated buffer."""
        fb = self.batch(input_ids, mode)
        if aux_buffer is not None:
            fb.aux_hidden_states_buffer = aux_buffer
        return self.run(lambda b: model.forward(b.input_ids, b.positions, b), fb)


# ----------------------------------------------------------------------------------------------------------------
# SGLang's ModelRunner around a built model: ModelRunner.forward -> _forward_raw -> EagerRunner, for real
# ----------------------------------------------------------------------------------------------------------------

def _has_runner_package() -> bool:
    """From 0.5.14 SGLang's ModelRunner.forward hands eager forwards to `model_executor/runner/eager_runner.py:
    EagerRunner` and keeps one graph runner per phase; 0.5.12 has no model_executor/runner package."""
    import importlib.util

    return importlib.util.find_spec("sglang.srt.model_executor.runner") is not None


def _attach_parallel_state(mr) -> None:
    """The runner's parallel layout where EagerRunner._execute_extend reads it from the model runner (the one-GPU
    layout, as SGLang's attention test kit sets it):

    - 0.5.16-0.5.20: `model_runner.ps` (distributed/parallel_state_wrapper.py: ParallelState; `ps.attn_dcp_size`
      read from 0.5.18).
    - 0.5.21: `model_runner.attn_dcp_size` (model_runner.py copies it from runtime_context.get_parallel()).
    - 0.5.22 on: read from get_parallel() directly; nothing to attach."""
    import importlib.util

    if importlib.util.find_spec("sglang.srt.distributed.parallel_state_wrapper") is not None:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState

        if hasattr(ParallelState, "trivial"):
            mr.ps = ParallelState.trivial()
    if importlib.util.find_spec("sglang.srt.runtime_context") is not None:
        from sglang.srt.runtime_context import get_parallel

        if hasattr(type(get_parallel()), "attn_dcp_size"):
            mr.attn_dcp_size = get_parallel().attn_dcp_size


def _attach_eager_runner(mr, graph_runner, device: str) -> None:
    """0.5.14 on (model_runner.py: `forward` -> `_forward_raw` asks `decode_cuda_graph_runner` /
    `prefill_cuda_graph_runner`, else runs `eager_runner`): SGLang's EagerRunner (BaseRunner.__init__ with the model
    runner, its eager buffer registry as `EagerRunner.__init__` builds it) and the graph-runner slots."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import build_eager_registry
    from sglang.srt.model_executor.runner.base_runner import BaseRunner
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    mr.decode_cuda_graph_runner = graph_runner
    mr.prefill_cuda_graph_runner = None
    er = EagerRunner.__new__(EagerRunner)
    BaseRunner.__init__(er, mr)
    kw = dict(device=torch.device(device), max_bs=4, max_num_token=128, cache_loc_dtype=torch.int64)
    import inspect

    if "encoder_lens_dtype" in inspect.signature(build_eager_registry).parameters:  # from 0.5.16
        kw["encoder_lens_dtype"] = torch.int64
    er._eager_registry = build_eager_registry(**kw)
    mr.eager_runner = er


def _attach_graph_runner_slot(mr, graph_runner, seq: "SglangRunner") -> None:
    """0.5.12 (model_runner.py: `_forward_raw` asks `self.graph_runner.can_run(batch)` (a cuda_graph_runner.py
    CudaGraphRunner), `forward_extend` asks `piecewise_cuda_graph_runner`, then `forward_decode` / `forward_extend`
    call `attn_backend.init_forward_metadata` and the model; `_forward_raw` reads the KV pool): those attributes."""
    mr.graph_runner = graph_runner
    mr.piecewise_cuda_graph_runner = None
    mr.token_to_kv_pool = seq.runner.token_to_kv_pool


class ServedRunner:
    """SGLang's own ``ModelRunner`` (and, where the release has one, its ``EagerRunner``), made with ``__new__``: no
    weights loaded, no KV cache sized; their attributes are what their ``forward`` / ``execute`` read, around a model
    built here, with the pools and backend of :class:`SglangRunner`. ``forward(ids)`` runs SGLang's real
    ``ModelRunner.forward``: the path every served forward takes (eager here; no CUDA graph on a CPU).
    ``graph_runner``: an object standing where SGLang keeps its decode CUDA-graph runner (e.g. a
    ``DecodeCudaGraphRunner`` made with ``__new__``), which the model runner then asks whether it can run."""

    def __init__(self, model, cfg, *, rid: str = "req-0", graph_runner=None, is_draft_worker: bool = False,
                 device: str = "cpu"):
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.seq = SglangRunner(cfg, device=device)
        self.model, self.cfg, self.rid = model, cfg, rid
        mr = ModelRunner.__new__(ModelRunner)
        mr.__dict__.update(
            forward_pass_id=0, msprobe_debugger=None, is_draft_worker=is_draft_worker, canary_manager=None,
            model=model, device=device, attn_backend=self.seq.backend, hisparse_coordinator=None, lora_manager=None,
            enable_elastic_ep=False, eplb_manager=None, req_to_token_pool=self.seq.runner.req_to_token_pool,
            pp_group=model.pp_group, support_pp=False, is_generation=True, device_timer=None,
            _kernel_warmed_up=True,
            # ModelRunner.forward reads self.server_args up to 0.5.16 (overlap schedule, elastic EP): the published
            # args (get_global_server_args raises from 0.5.20 on, hence the object setup_process published)
            server_args=_PUBLISHED["server_args"],
            # EagerRunner._execute_extend hands the KV dtype to the model's DCP metadata (0.5.16-0.5.22)
            kv_cache_dtype=torch.float32)
        _attach_parallel_state(mr)
        if _has_runner_package():
            _attach_eager_runner(mr, graph_runner, device)
        else:
            _attach_graph_runner_slot(mr, graph_runner, self.seq)
        if graph_runner is not None:
            graph_runner.model_runner = mr
        self.mr = mr

    def batch(self, input_ids, mode=None, rid: Optional[str] = None):
        fb = self.seq.batch(torch.as_tensor(input_ids), mode)
        fb.rids = [rid or self.rid]
        return fb

    def forward(self, input_ids, mode=None, rid: Optional[str] = None):
        """SGLang's ModelRunner.forward on the next tokens of the sequence; returns its ModelRunnerOutput."""
        fb = self.batch(input_ids, mode, rid)
        out = self.run(fb)
        return out, fb

    def run(self, fb):
        with torch.no_grad():
            out = self.mr.forward(fb)
        self.seq.seq_len += int(fb.input_ids.numel())
        return out


def packed_aux(aux):
    """DeepseekV2Model.forward's captures as one [T, K*H] tensor: the packed tensor it returns from 0.5.18 (its
    AuxHiddenStatePacker), or the list it returns on 0.5.12-0.5.16, concatenated as their LogitsProcessor does."""
    if isinstance(aux, (list, tuple)):
        return torch.cat(list(aux), dim=-1)
    return aux


def sglang_capture_mode():
    """(get_is_capture_mode, model_capture_mode): SGLang's own flag for its graph warm-up / capture passes, where the
    installed release keeps it: model_executor/runner_utils/capture_mode.py from 0.5.14,
    model_executor/cuda_graph_runner.py on 0.5.12."""
    import importlib.util

    if importlib.util.find_spec("sglang.srt.model_executor.runner_utils") is not None:
        from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode, model_capture_mode
    else:
        from sglang.srt.model_executor.cuda_graph_runner import get_is_capture_mode, model_capture_mode
    return get_is_capture_mode, model_capture_mode


def decode_graph_runner_class():
    """The class of SGLang's decode CUDA-graph runner in the installed release: from 0.5.14
    model_executor/runner/decode_cuda_graph_runner.py: DecodeCudaGraphRunner (ModelRunner keeps it as
    `decode_cuda_graph_runner` and asks its `can_run_graph`); on 0.5.12 model_executor/cuda_graph_runner.py:
    CudaGraphRunner (kept as `graph_runner`, asked `can_run`). :class:`ServedRunner` puts it where the release does."""
    if _has_runner_package():
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

        return DecodeCudaGraphRunner
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    return CudaGraphRunner


# ----------------------------------------------------------------------------------------------------------------
# EAGLE-3 drafts: SGLang's Eagle3DeepseekV2ForCausalLM (MLA) and LlamaForCausalLMEagle3, tiny, seeded weights
# ----------------------------------------------------------------------------------------------------------------

def sglang_release() -> str:
    """The version of the SGLang under test (for messages only: what the harness does is decided by what the
    installed SGLang has)."""
    import importlib.metadata

    return importlib.metadata.version("sglang")


def skip_missing_feature(what: str) -> None:
    """Skip the calling test: the installed SGLang release has no `what`, so the test cannot run on it (a skip that
    names the release and the feature, never a silent pass)."""
    import pytest

    pytest.skip(f"SGLang {sglang_release()} has no {what}")


DRAFT_IDS = [-1, 1, 3, 5]  # K = 4 taps of the tiny 6-layer target


def _default_dtype(dtype):
    """SGLang's own model-construction context: parameters (and SGLang's process-wide cached RoPE modules, keyed by
    dtype) are created in `dtype`."""
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    return set_default_torch_dtype(dtype)


def _fill(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def build_mla_draft(fc_norm: bool = True, seed: int = 5, dtype=torch.float32, fill: bool = True,
                    device: str = "cpu"):
    """SGLang's kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM: fc_norm ModuleList (from 0.5.14) + the fc
    (ColumnParallelLinear from 0.5.16, nn.Linear before). A release whose draft cannot build what is asked for
    skips the calling test (:func:`skip_missing_feature`)."""
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    setup_process()
    cfg = tiny_config(num_hidden_layers=1)
    cfg.fc_norm = fc_norm
    cfg.target_hidden_size = cfg.hidden_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(DRAFT_IDS)}
    cfg.draft_vocab_size = cfg.vocab_size
    with _default_dtype(dtype), torch.device(device):  # as SGLang's loader builds a model (a later .to() would
        model = Eagle3DeepseekV2ForCausalLM(cfg).eval()    # convert shared RoPE caches)
    if fc_norm and getattr(model.model, "fc_norm", None) is None:  # 0.5.12's Eagle3MLAModel: a plain fc
        skip_missing_feature("kimi_k25_eagle3.Eagle3MLAModel.fc_norm (the MLA draft ignores a config's fc_norm)")
    if fill:
        _fill(model, seed)
        model.post_load_weights()
    return cfg, model


def build_llama_draft(fc_norm: bool = False, norm_before_fc: bool = False, seed: int = 6, dtype=torch.float32,
                      device: str = "cpu"):
    """SGLang's llama_eagle3.LlamaForCausalLMEagle3: nn.Linear fc, optional fc_norm and input_norm."""
    from transformers import LlamaConfig

    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    setup_process()
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                      tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    cfg.fc_norm = fc_norm
    cfg.target_hidden_size = cfg.hidden_size
    cfg.draft_vocab_size = cfg.vocab_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(DRAFT_IDS), "norm_before_fc": norm_before_fc}
    with _default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLMEagle3(cfg).eval()
    if norm_before_fc and getattr(model.model, "input_norm", None) is None:  # before 0.5.18: no norm_before_fc
        skip_missing_feature("llama_eagle3.LlamaModel.input_norm (the Llama draft ignores eagle_config's "
                             "norm_before_fc)")
    if fc_norm and getattr(model.model, "fc_norm", None) is None:
        skip_missing_feature("llama_eagle3.LlamaModel.fc_norm (the Llama draft ignores a config's fc_norm)")
    _fill(model, seed)
    return cfg, model


def target_features(T: int, H: int, K: int, seed: int = 7, dtype=torch.float32) -> torch.Tensor:
    """A packed [T, K*H] capture whose taps have very different scales (as embedding vs deep layers do), so a
    per-tap norm and a whole-row norm give different results."""
    g = torch.Generator().manual_seed(seed)
    taps = [torch.randn(T, H, generator=g) * (0.05 if k == 0 else 3.0 * k) for k in range(K)]
    return torch.cat(taps, dim=1).to(dtype)


def run_draft(model, cfg, features: torch.Tensor, attention: str, forward=None, prompt=PROMPT, device: str = "cpu"):
    """One draft extend of SGLang's draft model over `prompt`, with `features` as spec_info.hidden_states.
    `forward(model.model, input_ids, positions, fb)` replaces the model's forward (e.g. the unhooked original).
    Returns (output of model.model, the spec_info after the call)."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    r = SglangRunner(cfg, attention=attention, device=device)
    fb = r.batch(torch.tensor(prompt))
    fb.spec_info = EagleDraftInput(hidden_states=features)
    fwd = forward or (lambda m, *a: m(*a))
    out = r.run(lambda b: fwd(model.model, b.input_ids, b.positions, b), fb)
    return out, fb.spec_info


# ----------------------------------------------------------------------------------------------------------------
# The HF reference: hidden states at every canonical tap, the final boundary taken BEFORE the final norm
# ----------------------------------------------------------------------------------------------------------------

def hf_taps(hf_model, input_ids: torch.Tensor) -> List[torch.Tensor]:
    """[T, H] per canonical tap position: index 0 = Embedding, index k+1 = LayerOutput(k), for k = 0..L-1.

    HF's `hidden_states[L]` is after the final norm in DeepseekV3, so LayerOutput(L-1) is taken from a forward hook
    on the last decoder layer's output instead (the residual stream before the norm)."""
    pre = {}

    def grab(module, args, output):
        pre["x"] = output[0] if isinstance(output, tuple) else output

    handle = hf_model.model.layers[-1].register_forward_hook(grab)
    try:
        with torch.no_grad():
            out = hf_model(input_ids[None], output_hidden_states=True)
    finally:
        handle.remove()
    hs = out.hidden_states
    L = hf_model.config.num_hidden_layers
    assert len(hs) == L + 1
    assert not torch.allclose(hs[L], pre["x"]), "HF's last hidden_states entry should be post-norm"
    return [h[0] for h in hs[:L]] + [pre["x"][0]], out.logits[0]


def tap_index(draft_id: int) -> int:
    """Position in hf_taps() of a draft id (-1 = Embedding, d = LayerOutput(d))."""
    return draft_id + 1


# ----------------------------------------------------------------------------------------------------------------
# A model object for set_eagle3_layers_to_capture alone (no weights): SGLang's classes, made with __new__
# ----------------------------------------------------------------------------------------------------------------

TARGET_61 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "configs",
                         "target_deepseek_v3_61.json")


def bare_model(num_layers: Optional[int] = None, hidden_size: Optional[int] = None, cls_name="DeepseekV3ForCausalLM"):
    """A real `DeepseekV3ForCausalLM` (and `DeepseekV2Model` as its .model) made with __new__: what
    set_eagle3_layers_to_capture reads (config, pp_group, model) and writes (capture flag, layers_to_capture).
    Defaults to the 61-layer DeepseekV3 / Kimi-K2.5 language model config of tests/data/configs."""
    from types import SimpleNamespace

    from torch import nn

    from eagle3_capture.configs import read_target_config
    from sglang.srt.models import deepseek_v2

    if num_layers is None or hidden_size is None:
        t = read_target_config(TARGET_61)
        num_layers, hidden_size = num_layers or t.num_layers, hidden_size or t.hidden_size
    cls = getattr(deepseek_v2, cls_name)
    m = cls.__new__(cls)
    nn.Module.__init__(m)
    m.config = SimpleNamespace(num_hidden_layers=num_layers, hidden_size=hidden_size, model_type="deepseek_v3",
                               architectures=[cls_name])
    m.pp_group = SimpleNamespace(is_last_rank=True, is_first_rank=True)
    m.capture_aux_hidden_states = False
    inner = deepseek_v2.DeepseekV2Model.__new__(deepseek_v2.DeepseekV2Model)
    nn.Module.__init__(inner)
    inner.layers_to_capture = []
    m.model = inner
    return m


def stock_layers_to_capture(ids, num_layers: int, cls_name: str = "DeepseekV3ForCausalLM"):
    """What the installed release's own `set_eagle3_layers_to_capture(ids)` stores in layers_to_capture (SGLang's
    function itself, on a bare model; the original where the plugin's hook wraps it): the expectation of a test
    that depends on the release's id rule comes from here, never from a table of versions."""
    m = bare_model(num_layers, 64, cls_name)
    fn = type(m).set_eagle3_layers_to_capture
    getattr(fn, "__wrapped__", fn)(m, None if ids is None else list(ids))
    return list(m.model.layers_to_capture)


_TINY_TARGET = None


def tiny_target():
    """Once per process: the tiny DeepseekV3 (HF and SGLang, same weights) and the HF taps for PROMPT+DECODE_TOKEN:
    dict(cfg, hf, model, taps, logits)."""
    global _TINY_TARGET
    if _TINY_TARGET is None:
        cfg = tiny_config()
        hf = build_hf(cfg)
        model = build_sglang(cfg, hf)
        taps, logits = hf_taps(hf, torch.tensor(PROMPT + [DECODE_TOKEN]))
        _TINY_TARGET = {"cfg": cfg, "hf": hf, "model": model, "taps": taps, "logits": logits}
    return _TINY_TARGET


# ----------------------------------------------------------------------------------------------------------------
# A prefill and a decode step
# ----------------------------------------------------------------------------------------------------------------

def run_sequence(model, cfg, prompt=PROMPT, decode_token=DECODE_TOKEN):
    """Prefill `prompt`, then decode one token: (prefill output, decode output)."""
    r = SglangRunner(cfg)
    a = r.forward(model, torch.tensor(prompt))
    b = r.forward(model, torch.tensor([decode_token]))
    return a, b
