"""Run SGLang 0.5.23's real DeepseekV3 model code on a CPU, for the plugin tests.

A single-process gloo parallel state, the ForwardBatch test kit shipped in the sglang wheel, and the few workarounds
a CPU-only machine needs. Nothing here imitates an SGLang class: the model, its layers, the packer, the attention
backend and the batch are SGLang's own; this module only wires them.

Used in-process by the tests (after `setup_process()`); what needs a fresh process runs through scenarios.py.
"""
from __future__ import annotations

import os
import socket
from typing import List, Optional

# The MoE grouped top-k is torch.compile'd in SGLang; on CPU compiling it is slow and useless.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402

_SETUP_DONE = False


def free_port() -> int:
    """A TCP port free on this host now (for the gloo rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_process(world_size: int = 1, rank: int = 0, port: Optional[int] = None) -> None:
    """Once per process: gloo parallel state (tp = world_size, pp = ep = 1) and a published ServerArgs. For
    world_size > 1, every rank's process calls it with the same `port`."""
    global _SETUP_DONE
    if _SETUP_DONE:
        return
    if not torch.cuda.is_available():  # SGLang's rotary embedding imports vllm only where there is no GPU
        from e3_sglang_cpu import stub_vllm  # the test-only CPU stand-ins (tests/sglang_cpu_plugin)

        stub_vllm()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel
    from sglang.srt.server_args import ServerArgs

    parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank, backend="gloo")
    runtime_context.reset_context()
    runtime_context.publish(
        ServerArgs(model_path="dummy", tp_size=world_size, pp_size=1, ep_size=1, attention_backend="torch_native"),
        role="test", ranks=SpawnRanks(world_rank=rank))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    if world_size == 1:
        parallel_state.initialize_model_parallel(backend="gloo")
    else:
        # CPU-only workaround for world > 1: SGLang's group coordinators default to PyNccl and the custom
        # all-reduce, which need a GPU; over gloo, plain torch.distributed collectives are what is left.
        import functools
        from unittest import mock

        from e3_sglang_cpu import init_model_parallel_group_hook

        no_gpu_comms = functools.partial(init_model_parallel_group_hook, parallel_state.init_model_parallel_group)
        with mock.patch.object(parallel_state, "init_model_parallel_group", no_gpu_comms):
            parallel_state.initialize_model_parallel(backend="gloo")

    # torch_native has no DeepSeek handler and would fall back to an MHA path that cannot read the MLA cache.
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod
    AttentionBackendRegistry.register("torch_native", lambda attn, fb: AttnForwardMethod.MLA)
    _SETUP_DONE = True


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
    """SGLang's own DeepseekV3ForCausalLM for `cfg`, loaded from the HF model's state dict via its load_weights
    (built on `device`, as SGLang's loader builds a model: parameters created there, weights copied in)."""
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    from sglang.srt.layers.moe.utils import resolve_shared_experts_config
    from sglang.srt.runtime_context import get_model

    setup_process()
    torch.manual_seed(1234)
    # as SGLang's loader builds a model (model_loader/loader.py: _initialize_model): the shared-experts layout
    # resolved first, kept on the model (the model runner's forward reads it)
    shared = resolve_shared_experts_config(DeepseekV3ForCausalLM, cfg, None)
    with _default_dtype(torch.float32), torch.device(device), get_model().override(shared_experts=shared):
        model = DeepseekV3ForCausalLM(cfg).eval()
    model.shared_experts_config = shared
    model.load_weights(list(hf_model.state_dict().items()))
    model.post_load_weights()
    return model


# ----------------------------------------------------------------------------------------------------------------
# SGLang forward: prefill (extend) then decode steps, through the attention test kit's runner and batch
# ----------------------------------------------------------------------------------------------------------------

class SglangRunner:
    """SGLang's KV pools and torch_native attention backend for one sequence (the attention test kit's mock model
    runner: MLA for DeepseekV2-family models, MHA for Llama-family drafts); runs extend, then decode steps."""

    def __init__(self, cfg, max_context_len: int = 64, attention: str = "mla", device: str = "cpu"):
        setup_process()
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.cfg = cfg
        self.device = device
        self.attention = attention
        self.max_context_len = max_context_len
        self.seq_len = 0
        if attention == "mla":
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
            from sglang.test.kits.attention_unittest.attention_methods import mla_attention as kit

            self.kit = kit
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
        elif attention == "mha":
            from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

            self.kit = kit
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            assert cfg.num_hidden_layers == 1, "the dense kit's KV pool has one layer"
            mc = kit.TinyModelConfig(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                                     head_dim=head_dim, hidden_size=cfg.hidden_size, context_len=max_context_len)
            self.runner = kit.MockModelRunner(case=self._case(ForwardMode.EXTEND, 1), model_config=mc,
                                              dtype=torch.float32, device=device, max_context_len=max_context_len,
                                              head_dim=head_dim)
        else:
            raise ValueError(f"attention must be 'mla' or 'mha', got {attention!r}")
        self.backend = self.kit.ATTENTION_BACKENDS["torch_native"](self.runner)

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
        case = self._case(mode, int(input_ids.numel()))
        fb = self.kit._make_forward_batch(case, self.runner, max_context_len=self.max_context_len,
                                          device=self.device)
        fb.input_ids = input_ids.to(device=self.device, dtype=torch.int64)
        fb.capture_hidden_mode = CaptureHiddenMode.FULL
        return fb

    def run(self, fn, fb):
        """Call fn(fb) (a model forward) inside SGLang's forward context, then advance the sequence (not when fn
        raises: a caller that knows the KV cache was written advances `seq_len` itself)."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        with torch.no_grad(), forward_context(ForwardContext(attn_backend=self.backend)):
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

class ServedRunner:
    """SGLang's own ``ModelRunner`` and ``EagerRunner`` (made with ``__new__``: no weights loaded, no KV cache
    sized; their attributes are what their ``forward`` / ``execute`` read), around a model built here, with the
    attention test kit's pools and backend (:class:`SglangRunner`). ``forward(ids)`` runs SGLang's real
    ``ModelRunner.forward``: the path every served forward takes (eager here; no CUDA graph on a CPU).
    ``graph_runner``: an object standing where SGLang keeps its decode CUDA-graph runner (e.g. a
    ``DecodeCudaGraphRunner`` made with ``__new__``), whose ``can_run_graph`` the model runner then asks."""

    def __init__(self, model, cfg, *, rid: str = "req-0", graph_runner=None, is_draft_worker: bool = False,
                 device: str = "cpu"):
        from sglang.srt.model_executor.cuda_graph_buffer_registry import build_eager_registry
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.model_executor.runner.base_runner import BaseRunner
        from sglang.srt.model_executor.runner.eager_runner import EagerRunner

        self.seq = SglangRunner(cfg, device=device)
        self.model, self.cfg, self.rid = model, cfg, rid
        mr = ModelRunner.__new__(ModelRunner)
        mr.__dict__.update(
            forward_pass_id=0, msprobe_debugger=None, is_draft_worker=is_draft_worker, canary_manager=None,
            model=model, device=device, attn_backend=self.seq.backend, decode_cuda_graph_runner=graph_runner,
            prefill_cuda_graph_runner=None, hisparse_coordinator=None, lora_manager=None, enable_elastic_ep=False,
            eplb_manager=None, req_to_token_pool=self.seq.runner.req_to_token_pool, pp_group=model.pp_group,
            support_pp=False, is_generation=True, device_timer=None, _kernel_warmed_up=True)
        er = EagerRunner.__new__(EagerRunner)
        BaseRunner.__init__(er, mr)
        er._eager_registry = build_eager_registry(device=torch.device(device), max_bs=4, max_num_token=128,
                                                  cache_loc_dtype=torch.int64, encoder_lens_dtype=torch.int64)
        mr.eager_runner = er
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


# ----------------------------------------------------------------------------------------------------------------
# EAGLE-3 drafts: SGLang's Eagle3DeepseekV2ForCausalLM (MLA) and LlamaForCausalLMEagle3, tiny, seeded weights
# ----------------------------------------------------------------------------------------------------------------

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
    """SGLang's kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM: fc_norm ModuleList + ColumnParallelLinear fc."""
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    setup_process()
    cfg = tiny_config(num_hidden_layers=1)
    cfg.fc_norm = fc_norm
    cfg.target_hidden_size = cfg.hidden_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(DRAFT_IDS)}
    cfg.draft_vocab_size = cfg.vocab_size
    with _default_dtype(dtype), torch.device(device):  # as SGLang's loader builds a model (a later .to() would
        model = Eagle3DeepseekV2ForCausalLM(cfg).eval()    # convert shared RoPE caches)
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
