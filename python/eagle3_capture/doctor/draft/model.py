"""An EAGLE-3 draft in plain torch, in the layout SpecForge writes and SGLang 0.5.23's ``LlamaForCausalLMEagle3``
(models/llama_eagle3.py) loads: ``embed_tokens``, ``fc`` (K*H_target -> H, optional per-tap ``fc_norm.{k}`` and
optional ``input_norm`` over the packed taps when ``norm_before_fc``), one decoder layer ``midlayer`` whose attention
reads ``cat(input_layernorm(embed), hidden_norm(hidden))`` (2H wide), the final ``norm`` and ``lm_head`` over the
draft vocabulary (``d2t``: draft id -> target id offset).

Used to train the demo's draft and to run any draft of this layout offline (``doctor accept``); its checkpoint
is written and read by checkpoint.py. The layer's attention is the draft layout's (eagle3_capture/draft_layouts.py:
Llama attention here, MLA in mla.py for SGLang's ``Eagle3DeepseekV2ForCausalLM``, chosen by ``q_lora_rank``);
everything else here is the same for every layout.

The multi-step unroll (:meth:`Eagle3Draft.unroll`) is how such drafts run at decode time and how EAGLE-3 trains
them ("training-time test"): for an anchor position t (the target has verified up to token x_{t+1}),

* step 1 reads the target's taps at t (through fc) and the token x_{t+1}, at position t;
* step j > 1 reads the draft's own hidden output of step j-1 (pre-norm unless ``norm_output``) and the token
  x_{t+j}, at position t+j-1;
* every step attends to the step-1 keys of positions <= t (the draft's KV cache filled from the target's taps)
  and to the anchor's own keys of steps 2..j (its chain so far), as SGLang's draft decode does.

The fc runs through :func:`eagle3_capture.ops.draft_fc` when no gradient is needed (``doctor accept``), and as
plain torch (same maths) when training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ... import draft_layouts
from ..common import DoctorError
from .layers import RMSNorm, attend_rows, rmsnorm as _rmsnorm

DRAFT_ARCH = draft_layouts.LLAMA.architecture


@dataclass
class DraftArch:
    """The architecture fields of an EAGLE-3 draft config.json (the common ones, then each layout's own)."""

    hidden_size: int
    target_hidden_size: int
    num_aux: int
    vocab_size: int
    draft_vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    fc_bias: bool = False
    max_position_embeddings: int = 4096
    layer_ids: List[int] = field(default_factory=list)
    # the MLA layout's (draft_layouts.MLA, selected by q_lora_rank: SGLang's Eagle3DeepseekV2ForCausalLM, mla.py)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: Optional[dict] = None
    rope_interleave: bool = True

    @property
    def layout(self) -> draft_layouts.DraftLayout:
        """The draft layout these fields describe (draft_layouts.of_fields)."""
        return draft_layouts.of_fields(self)

    @property
    def mla(self) -> bool:
        """Whether the layout is MLA (what tests and the GPU programs ask)."""
        return self.layout is draft_layouts.MLA

    def config_json(self) -> dict:
        """config.json as SGLang's draft models (read in 0.5.23) and this project's configs.read_draft_config read
        it: the common keys, then the layout's own fields and without the keys it does not carry."""
        lay = self.layout
        cfg = {
            "architectures": [lay.architecture], "model_type": lay.model_type,
            "hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "tie_word_embeddings": False, "bias": self.fc_bias, "torch_dtype": "float32",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layer_ids), "use_aux_hidden_state": True},
        }
        cfg.update({k: getattr(self, k) for k in lay.config_fields})
        for k in lay.config_drops:
            cfg.pop(k)
        if self.fc_norm:
            cfg["fc_norm"] = True
        if self.norm_before_fc:
            cfg["eagle_config"]["norm_before_fc"] = True
        if self.norm_output:
            cfg["norm_output"] = True
        return cfg


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama rotary embedding (rotate-half form). x [..., T, hd]; pos broadcastable to [..., T]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LlamaAttention(nn.Module):
    """The Llama layout's attention (draft_layouts.LLAMA): grouped-query attention over the layer's 2H-wide input,
    plain RoPE with rope_theta; the checkpoint's tensor names (``self_attn.*``)."""

    def __init__(self, a: DraftArch):
        super().__init__()
        if a.num_attention_heads % a.num_key_value_heads:
            raise DoctorError(f"draft: num_attention_heads {a.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads {a.num_key_value_heads}")
        self.a = a
        nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.q_proj = nn.Linear(2 * a.hidden_size, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * a.hidden_size, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * a.hidden_size, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, a.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        B, T, _ = x.shape
        a = self.a
        q = self.q_proj(x).view(B, T, a.num_attention_heads, a.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, a.num_key_value_heads, a.head_dim).transpose(1, 2)
        rep = a.num_attention_heads // a.num_key_value_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return _rope(q, pos[:, None, :], a.rope_theta), _rope(k, pos[:, None, :], a.rope_theta), v

    def attend_rows(self, q, prefix_k, prefix_v, own_k: List[torch.Tensor], own_v: List[torch.Tensor]):
        """layers.attend_rows, then the output projection: [B,T,R,H]."""
        return self.o_proj(attend_rows(q, prefix_k, prefix_v, own_k, own_v, 1.0 / math.sqrt(q.shape[-1])))


class _MLP(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = draft_layouts.implementation(a.layout.doctor_attention)(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = _MLP(a)


class Eagle3Draft(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.arch = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.fc = nn.Linear(a.num_aux * a.target_hidden_size, a.hidden_size, bias=a.fc_bias)
        self.fc_norm = (nn.ModuleList([RMSNorm(a.target_hidden_size, a.rms_norm_eps) for _ in range(a.num_aux)])
                        if a.fc_norm else None)
        self.input_norm = RMSNorm(a.num_aux * a.target_hidden_size, a.rms_norm_eps) if a.norm_before_fc else None
        self.midlayer = _MidLayer(a)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = nn.Linear(a.hidden_size, a.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(a.draft_vocab_size, dtype=torch.int64))

    # -- pieces ------------------------------------------------------------------------------------------------
    def project(self, taps: torch.Tensor, use_op: bool) -> torch.Tensor:
        """fc over the packed taps [..., K*Ht]; through ops.draft_fc when use_op (no autograd there)."""
        x = taps
        if self.input_norm is not None:
            x = self.input_norm(x)
        g = torch.stack([n.weight for n in self.fc_norm]) if self.fc_norm is not None else None
        if use_op:
            from ... import ops

            # the op has no autograd: this path is for measuring (doctor accept), never for training
            shape = x.shape
            flat = x.detach().reshape(-1, shape[-1]).contiguous()
            w = self.fc.weight.detach().contiguous()
            b = None if self.fc.bias is None else self.fc.bias.detach()
            gw = None if g is None else g.detach().contiguous()
            y = ops.draft_fc(flat, w, gw, self.arch.rms_norm_eps, b)
            return y.view(*shape[:-1], y.shape[-1])
        if g is not None:
            chunks = x.chunk(self.arch.num_aux, dim=-1)
            x = torch.cat([_rmsnorm(c, g[k], self.arch.rms_norm_eps) for k, c in enumerate(chunks)], -1)
        return self.fc(x)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def unroll(self, taps: torch.Tensor, tokens: torch.Tensor, steps: int, *, use_op: bool = False,
               positions: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        """Draft logits (over the draft vocabulary) of steps 1..steps for every anchor t.

        taps: [B, T, K*Ht] target taps at positions 0..T-1; tokens: [B, T + steps - 1] where column t + j - 1 is the
        token fed at step j for anchor t (x_{t+j}: the token sequence shifted left by one). Returns a list of
        ``steps`` tensors [B, T, Vd]; step j's row t predicts the target's greedy token at position t+j.
        """
        B, T, _ = taps.shape
        if tokens.shape != (B, T + steps - 1):
            raise ValueError(f"tokens must be [B, T+steps-1] = {(B, T + steps - 1)}, got {tuple(tokens.shape)}")
        pos0 = torch.arange(T, device=taps.device)[None].expand(B, T) if positions is None else positions
        logits, hidden, kv = self.first_step(taps, tokens[:, :T], pos0, use_op)
        out = [logits]
        for j in range(1, steps):
            logits, hidden = self.rows_step(tokens[:, j: j + T, None], hidden[:, :, None], pos0 + j, kv)
            logits, hidden = logits[:, :, 0], hidden[:, :, 0]
            out.append(logits)
        return out

    def first_step(self, taps: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, use_op: bool = False):
        """Step 1 at every position: the draft reads the target's taps at t and the token x_{t+1} (tokens [B, T]).
        Returns (logits [B, T, Vd], hidden [B, T, H] handed to step 2, the KV: :class:`DraftKV` whose prefix is
        these keys, which every later step of anchor t sees for positions <= t)."""
        hidden = self.project(taps, use_op)
        kv = DraftKV()
        logits, hidden = self.rows_step(tokens[:, :, None], hidden[:, :, None], positions, kv)
        return logits[:, :, 0], hidden[:, :, 0], kv

    def rows_step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, kv: "DraftKV"):
        """One draft forward of R rows per anchor: tokens [B, T, R] (target ids), hidden [B, T, R, H] (each row's
        input hidden), positions [B, T] (every row of anchor t at the same position). Row (t, r) attends to the
        prefix (positions <= t) and to kv's own entries of row r, to which this step's keys are appended (the
        first call sets the prefix instead). Returns (logits [B, T, R, Vd], hidden out [B, T, R, H])."""
        a, layer = self.arch, self.midlayer
        B, T, R = tokens.shape
        emb = self.embed_tokens(tokens)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], -1)
        pos = positions[:, :, None].expand(B, T, R).reshape(B, T * R)
        q, k, v = layer.self_attn.qkv(x.reshape(B, T * R, -1), pos)
        q, k, v = (t.reshape(B, t.shape[1], T, R, t.shape[-1]) for t in (q, k, v))
        if kv.prefix_k is None:
            if R != 1:
                raise ValueError("the first draft step runs one row per position")
            kv.prefix_k, kv.prefix_v = k[:, :, :, 0], v[:, :, :, 0]
        else:
            kv.own_k.append(k)
            kv.own_v.append(v)
        h = hidden + layer.self_attn.attend_rows(q, kv.prefix_k, kv.prefix_v, kv.own_k, kv.own_v)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        normed = self.norm(h)
        return self.lm_head(normed), (normed if a.norm_output else h)


@dataclass
class DraftKV:
    """The draft's KV cache seen by a step: the prefix (step-1 keys of every position) and, per row, the keys of
    its later steps ([B, h, T, R, d] each, one per step)."""

    prefix_k: Optional[torch.Tensor] = None
    prefix_v: Optional[torch.Tensor] = None
    own_k: List[torch.Tensor] = field(default_factory=list)
    own_v: List[torch.Tensor] = field(default_factory=list)


__all__ = ["DraftArch", "Eagle3Draft", "DraftKV", "DRAFT_ARCH", "LlamaAttention"]
