"""Run SGLang 0.5.23's real DeepseekV3 model code on a CPU, for the plugin tests.

Follows ../shared/SGLANG_CPU.md: a single-process gloo parallel state, the ForwardBatch test kit shipped in the
sglang wheel, and the few workarounds a CPU-only machine needs. Nothing here imitates an SGLang class: the model,
its layers, the packer, the attention backend and the batch are SGLang's own; this module only wires them.

Used in-process by the tests (after `setup_process()`), and as a script by the tests that need a fresh process
(SGLang's `load_plugins()` runs once per process and its patches cannot be undone):

    python tests/sglang/harness.py native OUT.pt     stock SGLang (plugin not loaded): what it captures
    python tests/sglang/harness.py hooks OUT.json    load_plugins() under the caller's environment: which hooks
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

# The MoE grouped top-k is torch.compile'd in SGLang; on CPU compiling it is slow and useless.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402

_SETUP_DONE = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_process(world_size: int = 1, rank: int = 0, port: Optional[int] = None) -> None:
    """Once per process: gloo parallel state (tp = world_size, pp = ep = 1) and a published ServerArgs. For
    world_size > 1, every rank's process calls it with the same `port`."""
    global _SETUP_DONE
    if _SETUP_DONE:
        return
    from e3_sglang_cpu import stub_vllm  # the test-only CPU stand-ins (tests/sglang_cpu_plugin)

    stub_vllm()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port if port is not None else _free_port())
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


def build_sglang(cfg, hf_model):
    """SGLang's own DeepseekV3ForCausalLM for `cfg`, loaded from the HF model's state dict via its load_weights."""
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    setup_process()
    torch.manual_seed(1234)
    with _default_dtype(torch.float32):
        model = DeepseekV3ForCausalLM(cfg).eval()
    model.load_weights(list(hf_model.state_dict().items()))
    model.post_load_weights()
    return model


# ----------------------------------------------------------------------------------------------------------------
# SGLang forward: prefill (extend) then decode steps, through the attention test kit's runner and batch
# ----------------------------------------------------------------------------------------------------------------

class SglangRunner:
    """SGLang's KV pools and torch_native attention backend for one sequence (the attention test kit's mock model
    runner: MLA for DeepseekV2-family models, MHA for Llama-family drafts); runs extend, then decode steps."""

    def __init__(self, cfg, max_context_len: int = 64, attention: str = "mla"):
        setup_process()
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.cfg = cfg
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
                                                 dtype=torch.float32, device="cpu", max_context_len=max_context_len,
                                                 kv_lora_rank=cfg.kv_lora_rank,
                                                 qk_rope_head_dim=cfg.qk_rope_head_dim)
            # The kit's pool has one layer; the model has num_hidden_layers.
            self.runner.token_to_kv_pool = MLATokenToKVPool(
                size=max_context_len + 2, page_size=1, dtype=torch.float32, kv_lora_rank=cfg.kv_lora_rank,
                qk_rope_head_dim=cfg.qk_rope_head_dim, layer_num=cfg.num_hidden_layers, device="cpu",
                enable_memory_saver=False)
        elif attention == "mha":
            from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

            self.kit = kit
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            assert cfg.num_hidden_layers == 1, "the dense kit's KV pool has one layer"
            mc = kit.TinyModelConfig(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                                     head_dim=head_dim, hidden_size=cfg.hidden_size, context_len=max_context_len)
            self.runner = kit.MockModelRunner(case=self._case(ForwardMode.EXTEND, 1), model_config=mc,
                                              dtype=torch.float32, device="cpu", max_context_len=max_context_len,
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
        fb = self.kit._make_forward_batch(case, self.runner, max_context_len=self.max_context_len, device="cpu")
        fb.input_ids = input_ids.to(torch.int64)
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


def build_mla_draft(fc_norm: bool = True, seed: int = 5, dtype=torch.float32, fill: bool = True):
    """SGLang's kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM: fc_norm ModuleList + ColumnParallelLinear fc."""
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    setup_process()
    cfg = tiny_config(num_hidden_layers=1)
    cfg.fc_norm = fc_norm
    cfg.target_hidden_size = cfg.hidden_size
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(DRAFT_IDS)}
    cfg.draft_vocab_size = cfg.vocab_size
    with _default_dtype(dtype):  # as SGLang's loader builds a model (a later .to() would convert shared RoPE caches)
        model = Eagle3DeepseekV2ForCausalLM(cfg).eval()
    if fill:
        _fill(model, seed)
        model.post_load_weights()
    return cfg, model


def build_llama_draft(fc_norm: bool = False, norm_before_fc: bool = False, seed: int = 6, dtype=torch.float32):
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
    with _default_dtype(dtype):
        model = LlamaForCausalLMEagle3(cfg).eval()
    _fill(model, seed)
    return cfg, model


def target_features(T: int, H: int, K: int, seed: int = 7, dtype=torch.float32) -> torch.Tensor:
    """A packed [T, K*H] capture whose taps have very different scales (as embedding vs deep layers do), so a
    per-tap norm and a whole-row norm give different results."""
    g = torch.Generator().manual_seed(seed)
    taps = [torch.randn(T, H, generator=g) * (0.05 if k == 0 else 3.0 * k) for k in range(K)]
    return torch.cat(taps, dim=1).to(dtype)


def run_draft(model, cfg, features: torch.Tensor, attention: str, forward=None, prompt=PROMPT):
    """One draft extend of SGLang's draft model over `prompt`, with `features` as spec_info.hidden_states.
    `forward(model.model, input_ids, positions, fb)` replaces the model's forward (e.g. the unhooked original).
    Returns (output of model.model, the spec_info after the call)."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    r = SglangRunner(cfg, attention=attention)
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
# Subprocess scenarios
# ----------------------------------------------------------------------------------------------------------------

def run_sequence(model, cfg, prompt=PROMPT, decode_token=DECODE_TOKEN):
    """Prefill `prompt`, then decode one token: (prefill output, decode output)."""
    r = SglangRunner(cfg)
    a = r.forward(model, torch.tensor(prompt))
    b = r.forward(model, torch.tensor([decode_token]))
    return a, b


def _native(out_path: str) -> None:
    """Stock SGLang: for each id list, what its packer received (slots, in order) and how the forward ended."""
    from unittest import mock

    setup_process()
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    assert not hasattr(DeepseekV2ForCausalLM.set_eagle3_layers_to_capture, "__wrapped__"), "plugin loaded"
    cfg = tiny_config()
    hf = build_hf(cfg)
    model = build_sglang(cfg, hf)
    original_finalize = AuxHiddenStatePacker.finalize
    seen: List[torch.Tensor] = []

    def spy_finalize(self):  # test instrumentation: record what stock SGLang packed before its own check
        n = len(self)
        width = 0 if self._feature_size is None else n * self._feature_size
        seen.append(self._buffer[:, :width].clone() if self._buffer is not None else None)
        return original_finalize(self)

    results: Dict[str, dict] = {}
    with mock.patch.object(AuxHiddenStatePacker, "finalize", spy_finalize):
        for ids in ([-1, 1, 3, 5], [0, 2, 4]):
            model.set_eagle3_layers_to_capture(list(ids))
            rec = {"layers_to_capture": list(model.model.layers_to_capture), "steps": []}
            r = SglangRunner(cfg)
            for toks in (PROMPT, [DECODE_TOKEN]):
                seen.clear()
                try:
                    out = r.forward(model, torch.tensor(toks))
                    rec["steps"].append({"aux": out.hidden_states.clone(), "error": None, "packed": seen[-1]})
                except RuntimeError as e:
                    rec["steps"].append({"aux": None, "error": str(e), "packed": seen[-1] if seen else None})
                    r.seq_len += len(toks)  # the KV cache was written before the failing check
            results[str(ids)] = rec
    torch.save(results, out_path)


def _hooks(out_path: str) -> None:
    """load_plugins() under this process's environment; report which of the plugin's hooks are in place."""
    import json
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s|%(message)s", stream=sys.stderr)
    setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture.sglang import plugin
    from eagle3_capture.sglang.hook_chain import hook_path_in_place

    in_place = {group: {path: hook_path_in_place(path, fn) for path, fn in hooks}
                for group, hooks in plugin.HOOKS.items()}
    set_layers = {}
    for ids in ([-1, 2, 30], [-1, 2, 30, 60]):
        m = bare_model()
        try:
            m.set_eagle3_layers_to_capture(list(ids))
            set_layers[str(ids)] = list(m.model.layers_to_capture)
        except Exception as e:
            set_layers[str(ids)] = f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump({"in_place": in_place, "registered": plugin.registered, "skipped": plugin.skipped,
                   "status": plugin.hook_status(), "set_layers": set_layers}, f)


def _draft_tp_rank(out_dir: str, rank: str, world: str, port: str) -> None:
    """One TP rank of the draft fc at TP = world on CPU (gloo): SGLang's Eagle3MLAModel with its fc column-sharded,
    full weights loaded through the parameters' own weight loaders, run with the plugin (fused fc + the project's
    gatherer) and with SGLang's own forward, up to the draft layer's input (the fc output: everything after it is
    SGLang's attention, unchanged by the plugin)."""
    import json

    rank, world = int(rank), int(world)
    setup_process(world_size=world, rank=rank, port=int(port))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture import reference
    from eagle3_capture.sglang import draft
    from eagle3_capture.tp import PackedGatherer

    cfg, model = build_mla_draft(fc_norm=True, fill=False)
    K, H = len(DRAFT_IDS), cfg.hidden_size
    g = torch.Generator().manual_seed(21)  # same full weights on every rank; each rank's loader takes its shard
    full = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            loader = getattr(p, "weight_loader", None)
            if name == "model.fc.weight":
                w = torch.randn(H, K * H, generator=g) / (K * H) ** 0.5
            elif name == "model.embed_tokens.weight":
                w = 0.05 * torch.randn(cfg.vocab_size, H, generator=g)
            elif "norm" in name:
                w = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
                continue
            full[name] = w
            loader(p, w) if loader is not None else p.copy_(w)
    model.post_load_weights()
    assert tuple(model.model.fc.weight.shape) == (H // world, K * H), tuple(model.model.fc.weight.shape)
    x = target_features(len(PROMPT), H, K)
    seen = {}

    def pre(module, args):
        seen["h"] = args[2].clone()
        raise _StopAtDraftLayer

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    handle = model.model.midlayer.register_forward_pre_hook(pre)
    results = {}
    try:
        for label, fwd in (("plugin", type(model.model).forward), ("sglang", type(model.model).forward.__wrapped__)):
            ids = torch.tensor(PROMPT)
            n = len(PROMPT)
            fb = ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
                              req_pool_indices=torch.zeros(1, dtype=torch.int32),
                              seq_lens=torch.tensor([n], dtype=torch.int32),
                              seq_lens_cpu=torch.tensor([n], dtype=torch.int32), out_cache_loc=torch.arange(n),
                              seq_lens_sum=n, positions=torch.arange(n))
            fb.spec_info = EagleDraftInput(hidden_states=x)
            try:
                with torch.no_grad():
                    fwd(model.model, ids, fb.positions, fb)
            except _StopAtDraftLayer:
                pass
            results[label] = seen.pop("h")
    finally:
        handle.remove()
    g_norm = torch.stack([full[f"model.fc_norm.{k}.weight"] for k in range(K)]).double()
    want = reference.draft_fc(x.double(), full["model.fc.weight"].double(), g_norm, cfg.rms_norm_eps)
    gatherer = model.model.__dict__.get(draft._GATHER_ATTR)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({
            "plugin_vs_reference": float((results["plugin"].double() - want).abs().max()),
            "sglang_vs_reference": float((results["sglang"].double() - want).abs().max()),
            "plugin_vs_sglang": float((results["plugin"] - results["sglang"]).abs().max()),
            "shape": list(results["plugin"].shape),
            "gatherer": type(gatherer).__name__ if isinstance(gatherer, PackedGatherer) else repr(gatherer),
            "backend": getattr(gatherer, "backend", None),
            "fc_shard": list(model.model.fc.weight.shape),
        }, f)


class _StopAtDraftLayer(Exception):
    pass


def run_ranks(scenario: str, out_dir, world: int, env_extra: Optional[Dict[str, str]] = None, timeout: int = 300):
    """Run `harness.py SCENARIO OUT_DIR RANK WORLD PORT` for every rank at once; raise with stderr on failure."""
    import subprocess

    env = dict(os.environ)
    env.update(env_extra or {})
    env["TORCHDYNAMO_DISABLE"] = "1"
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), scenario, str(out_dir), str(r), str(world),
                               port], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"harness.py {scenario} rank {r} timed out after {timeout} s")
        outs.append((p.returncode, err))
    bad = [(r, rc, err) for r, (rc, err) in enumerate(outs) if rc != 0]
    if bad:
        r, rc, err = bad[0]
        raise AssertionError(f"harness.py {scenario} rank {r} failed (rc {rc}):\n{err[-6000:]}")


def run_script(scenario: str, out_path, env_extra: Optional[Dict[str, str]] = None, timeout: int = 300):
    """Run this file as `harness.py SCENARIO OUT` in a fresh process (the caller's environment plus env_extra);
    returns the CompletedProcess, raising with its stderr if it failed."""
    import subprocess

    env = dict(os.environ)
    env.update(env_extra or {})
    env["TORCHDYNAMO_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), scenario, str(out_path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"harness.py {scenario} failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


if __name__ == "__main__":
    scenario, args = sys.argv[1], sys.argv[2:]
    {"native": _native, "hooks": _hooks, "draft_tp": _draft_tp_rank}[scenario](*args)
