"""Test-only torch implementations of the sgl_kernel functions that SGLang 0.5.23 calls on the CUDA path of a
tiny DeepseekV3 target + LlamaForCausalLMEagle3 draft with ``--attention-backend triton`` (read in its source;
scripts/gpu_sglang/README.md lists the call sites). sglang-kernel (CUDA only, built for torch 2.14.1) cannot be
installed on the GPU machine, so these stand in for it there; they are never part of eagle3-capture.

Each function keeps sgl_kernel's calling convention: argument order, in-place outputs (``fused_add_rmsnorm``
writes ``input`` and ``residual``, ``moe_sum_reduce`` and ``moe_align_block_size`` write their output
arguments), return values, and the float32 arithmetic of its CUDA kernel for 16/32-bit inputs. Every one runs
without a host synchronisation and at fixed shapes, so SGLang can capture it in a CUDA graph (checked by
tests/gpu_programs/test_native.py on CUDA when there is a GPU). Torch only: no import of SGLang or of the package.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch

_LOW = (torch.float16, torch.bfloat16, torch.float32)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulation type: float32 for 16/32-bit inputs (float64 stays float64, for the tests)."""
    return torch.float32 if dtype in _LOW else dtype


def _need_tensor(name: str, t, dims: Optional[int] = None, floating: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions, got shape {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")


def _same_device(**tensors) -> None:
    devs = {k: v.device for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    if len(set(devs.values())) > 1:
        raise ValueError(f"tensors on different devices: {devs}")


def _check_norm(input, weight, residual=None, out=None) -> None:
    _need_tensor("input", input, floating=True)
    _need_tensor("weight", weight, dims=1, floating=True)
    if input.dim() < 1 or input.shape[-1] != weight.shape[0]:
        raise ValueError(f"input's last dimension {tuple(input.shape)} must equal weight's {tuple(weight.shape)}")
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            _need_tensor(name, t, floating=True)
            if t.shape != input.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} must equal input shape {tuple(input.shape)}")
    _same_device(input=input, weight=weight, residual=residual, out=out)


# ------------------------------------------------------------------------------------------------------------------
# RMSNorm (flashinfer's kernels, which sgl_kernel wraps): y = x * rsqrt(mean(x^2) + eps) * w, in float32;
# the gemma variants multiply by (1 + w).
# ------------------------------------------------------------------------------------------------------------------

def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    w = weight.to(x.dtype)
    return x * _rms(x, eps) * ((1.0 + w) if gemma else w)


def _rmsnorm(input, weight, eps, out, gemma):
    _check_norm(input, weight, out=out)
    if out is None:
        out = torch.empty_like(input)
    x = input.to(_acc(input.dtype))
    out.copy_(_norm(x, weight, eps, gemma))
    return out


def _fused_add_rmsnorm(input, residual, weight, eps, gemma):
    _check_norm(input, weight, residual=residual)
    x = input.to(_acc(input.dtype)) + residual.to(_acc(input.dtype))
    residual.copy_(x)                     # the kernel stores the sum in residual's dtype ...
    input.copy_(_norm(x, weight, eps, gemma))  # ... and normalises the float32 sum
    return None


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: Optional[torch.Tensor] = None,
            enable_pdl: Optional[bool] = None) -> torch.Tensor:
    return _rmsnorm(input, weight, eps, out, gemma=False)


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: Optional[bool] = None) -> None:
    """In place: residual <- input + residual; input <- rmsnorm(input + residual) * weight."""
    return _fused_add_rmsnorm(input, residual, weight, eps, gemma=False)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: Optional[torch.Tensor] = None,
                  enable_pdl: Optional[bool] = None) -> torch.Tensor:
    return _rmsnorm(input, weight, eps, out, gemma=True)


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                            enable_pdl: Optional[bool] = None) -> None:
    return _fused_add_rmsnorm(input, residual, weight, eps, gemma=True)


# ------------------------------------------------------------------------------------------------------------------
# act(x[..., :d]) * x[..., d:], in float32
# ------------------------------------------------------------------------------------------------------------------

def _silu(x):
    return x / (1.0 + torch.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _act_and_mul(act, input, out):
    _need_tensor("input", input, floating=True)
    if input.dim() < 1 or input.shape[-1] % 2:
        raise ValueError(f"input's last dimension must be even (gate | up), got shape {tuple(input.shape)}")
    d = input.shape[-1] // 2
    shape = input.shape[:-1] + (d,)
    if out is None:
        out = torch.empty(shape, dtype=input.dtype, device=input.device)
    else:
        _need_tensor("out", out, floating=True)
        if out.shape != shape:
            raise ValueError(f"out shape {tuple(out.shape)} must be {tuple(shape)} for input {tuple(input.shape)}")
        _same_device(input=input, out=out)
    x = input.to(_acc(input.dtype))
    out.copy_(act(x[..., :d]) * x[..., d:])
    return out


def silu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                 enable_pdl: Optional[bool] = None) -> torch.Tensor:
    return _act_and_mul(_silu, input, out)


def gelu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                 enable_pdl: Optional[bool] = None) -> torch.Tensor:
    return _act_and_mul(_gelu, input, out)


def gelu_tanh_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None,
                      enable_pdl: Optional[bool] = None) -> torch.Tensor:
    return _act_and_mul(_gelu_tanh, input, out)


# ------------------------------------------------------------------------------------------------------------------
# MoE
# ------------------------------------------------------------------------------------------------------------------

def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float) -> None:
    """In place: output[t] <- routed_scaling_factor * sum_k input[t, k] (float32 sum), input [T, topk, H]."""
    _need_tensor("input", input, dims=3, floating=True)
    _need_tensor("output", output, dims=2, floating=True)
    if output.shape != (input.shape[0], input.shape[2]):
        raise ValueError(f"output shape {tuple(output.shape)} must be {(input.shape[0], input.shape[2])} for input "
                         f"{tuple(input.shape)}")
    _same_device(input=input, output=output)
    acc = input.to(_acc(input.dtype)).sum(dim=1)
    output.copy_(acc * float(routed_scaling_factor))
    return None


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor,
                         pad_sorted_token_ids: bool = False) -> None:
    """sgl_kernel's token sort by expert for the Triton fused MoE, with SGLang's "+1 bucket" convention:
    ``num_experts`` counts the real experts plus one bucket for id -1 (filtered experts), token i goes to bucket
    ``topk_ids[i] + 1``. Every bucket is padded to a multiple of ``block_size``; in place:

    * ``sorted_token_ids``: with ``pad_sorted_token_ids`` first filled with ``numel`` (the padding id); then token
      i sits at ``cumsum[bucket] + its rank within the bucket`` (ascending i here; the CUDA kernel's order within a
      bucket depends on its threads, and the fused MoE computes every row on its own, so no result depends on it);
    * ``experts_ids[j]`` = bucket - 1 (the expert id, -1 for the filtered bucket) for each block j of the padded
      total, later entries untouched;
    * ``num_tokens_post_pad[0]`` = the padded total; ``cumsum_buffer[: num_experts + 1]`` = the exclusive prefix
      sums of the padded counts and the total.
    """
    _need_tensor("topk_ids", topk_ids)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected int32 or int64, got {topk_ids.dtype}")
    for name, t in (("sorted_token_ids", sorted_token_ids), ("experts_ids", experts_ids),
                    ("num_tokens_post_pad", num_tokens_post_pad), ("cumsum_buffer", cumsum_buffer)):
        _need_tensor(name, t, dims=1)
        if t.dtype != torch.int32:
            raise TypeError(f"{name}: expected int32, got {t.dtype}")
    _same_device(topk_ids=topk_ids, sorted_token_ids=sorted_token_ids, experts_ids=experts_ids,
                 num_tokens_post_pad=num_tokens_post_pad, cumsum_buffer=cumsum_buffer)
    if not isinstance(num_experts, int) or not 1 <= num_experts <= 8192:
        raise ValueError(f"num_experts (real experts + 1) must be an int in [1, 8192], got {num_experts!r}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if cumsum_buffer.numel() < num_experts + 1:
        raise ValueError(f"cumsum_buffer holds {cumsum_buffer.numel()} entries, needs num_experts + 1 = "
                         f"{num_experts + 1}")
    numel = topk_ids.numel()
    dev = topk_ids.device
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(numel)
    bucket = topk_ids.reshape(-1).to(torch.int64) + 1                                  # [numel]
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)                                                     # inclusive
    starts = ends - padded                                                             # exclusive prefix
    total = ends[-1:]
    # rank of each token inside its bucket: a stable sort by bucket, minus the bucket's first sorted position
    order = torch.sort(bucket, stable=True).indices                                    # token ids by bucket
    sorted_bucket = bucket[order]
    first = torch.cumsum(counts, 0) - counts                                           # unpadded bucket starts
    rank = torch.arange(numel, device=dev) - first[sorted_bucket]
    sorted_token_ids.scatter_(0, starts[sorted_bucket] + rank, order.to(torch.int32))
    # the expert of each block: the bucket whose padded range holds the block's first row
    blocks = experts_ids.numel()
    block_start = torch.arange(blocks, device=dev, dtype=torch.int64) * block_size
    owner = torch.searchsorted(ends, block_start, right=True)                         # bucket index
    in_range = block_start < total
    experts_ids.copy_(torch.where(in_range, (owner - 1).to(torch.int32), experts_ids))
    num_tokens_post_pad[:1].copy_(total)
    cumsum_buffer[:num_experts].copy_(starts)
    cumsum_buffer[num_experts:num_experts + 1].copy_(total)
    return None


# ------------------------------------------------------------------------------------------------------------------
# sampling renorm (sgl_kernel.sampling, flashinfer semantics); a probability row in, a new float32 row out
# ------------------------------------------------------------------------------------------------------------------

def _per_row(value: Union[torch.Tensor, int, float], rows: int, device, dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() not in (1, rows):
            raise ValueError(f"expected one value per row ({rows}) or a scalar, got shape {tuple(value.shape)}")
        return value.to(device=device, dtype=dtype).reshape(-1, 1).expand(rows, 1)
    return torch.full((rows, 1), value, device=device, dtype=dtype)


def top_k_renorm_prob(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Keep each row's probabilities >= its k-th largest (ties at the k-th are kept), zero the rest, renormalise.
    k <= 0 or k >= vocab keeps the whole row."""
    _need_tensor("probs", probs, dims=2, floating=True)
    p = probs.to(_acc(probs.dtype))
    rows, vocab = p.shape
    k = _per_row(top_k, rows, p.device, torch.int64)
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
    kth = torch.sort(p, dim=-1, descending=True).values.gather(1, k - 1)
    kept = torch.where(p >= kth, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep each probability whose strictly larger probabilities sum to less than top_p (the smallest top set
    reaching top_p; ties kept together), zero the rest, renormalise."""
    _need_tensor("probs", probs, dims=2, floating=True)
    p = probs.to(_acc(probs.dtype))
    rows, _ = p.shape
    tp = _per_row(top_p, rows, p.device, p.dtype)
    asc = torch.sort(p, dim=-1).values
    csum = torch.cumsum(asc, dim=-1)
    upto = torch.searchsorted(asc, p, right=True) - 1          # last index whose value <= p_i
    mass_above = csum[:, -1:] - csum.gather(1, upto)           # sum of values > p_i
    kept = torch.where(mass_above < tp, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


top_k_renorm_probs = top_k_renorm_prob
top_p_renorm_probs = top_p_renorm_prob


# ------------------------------------------------------------------------------------------------------------------
# CUDA graphs: a view of a tensor's memory that does not keep the memory alive
# ------------------------------------------------------------------------------------------------------------------

def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The same memory, shape, strides and dtype, without owning the storage (sgl_kernel builds it with
    ``from_blob`` and no deleter; SGLang's breakable CUDA graphs rely on it so the graph pool can reuse
    intermediates). Built the way torch's own CUDA-graph trees alias pool memory."""
    _need_tensor("tensor", tensor)
    st = tensor.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(st.data_ptr(), tensor.device, st.nbytes())
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return out.set_(alias, tensor.storage_offset(), tensor.size(), tensor.stride())


# ------------------------------------------------------------------------------------------------------------------
# sgl_kernel.utils
# ------------------------------------------------------------------------------------------------------------------

def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch: compute capability 9.0 or later (False without a GPU)."""
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9


def moe_fused_gate(input_tensor: torch.Tensor, bias: torch.Tensor, num_expert_group: int, topk_group: int, topk: int,
                   num_fused_shared_experts: int = 0, routed_scaling_factor: float = 1.0,
                   apply_routed_scaling_factor_on_output: bool = False):
    """DeepSeek's biased grouped top-k (SGLang 0.5.12 calls it on CUDA for a sigmoid router whose experts are a power
    of two, at most 32 per group): sigmoid scores, choice = score + bias, the groups with the largest sum of their
    two best choices, the top-k choices among those groups; weights are the chosen experts' scores renormalised to
    sum 1 (x routed_scaling_factor when apply_routed_scaling_factor_on_output). Returns (weights float32 [T, topk],
    ids int32 [T, topk]). A fused shared expert (only for 256-expert checkpoints) is not stood in for."""
    _need_tensor("input_tensor", input_tensor, 2, floating=True)
    _need_tensor("bias", bias, 1, floating=True)
    T, E = input_tensor.shape
    if num_fused_shared_experts:
        raise NotImplementedError("moe_fused_gate stand-in: num_fused_shared_experts > 0 (SGLang fuses a shared expert "
                                  "only for 256 routed experts) is not implemented")
    if bias.numel() != E or E % num_expert_group or not 1 <= topk_group <= num_expert_group or not 1 <= topk <= E:
        raise ValueError(f"moe_fused_gate: {E} experts, bias {tuple(bias.shape)}, {num_expert_group} groups, "
                         f"topk_group {topk_group}, topk {topk}")
    scores = input_tensor.float().sigmoid()
    choice = scores + bias.float()[None]
    per = E // num_expert_group
    group = choice.view(T, num_expert_group, per).topk(min(2, per), dim=-1)[0].sum(-1)
    keep = torch.zeros_like(group, dtype=torch.bool).scatter_(1, group.topk(topk_group, dim=-1)[1], True)
    choice = choice.masked_fill(~keep[:, :, None].expand(T, num_expert_group, per).reshape(T, E), float("-inf"))
    ids = choice.topk(topk, dim=-1)[1]
    w = scores.gather(1, ids)
    w = w / w.sum(-1, keepdim=True)
    if apply_routed_scaling_factor_on_output:
        w = w * routed_scaling_factor
    return w.float(), ids.to(torch.int32)


def fast_topk(values: torch.Tensor, topk: int, dim: int):
    """(values, indices) of the top-k along dim; k = 1 as a max with the dim kept (SGLang's own torch fallback)."""
    if topk == 1:
        return torch.max(values, dim=dim, keepdim=True)
    return torch.topk(values, topk, dim=dim)


# The speculative tree kernels SGLang 0.5.12 calls on its EAGLE path (eagle_utils.build_tree_kernel_efficient after
# the draft graph's replay, verify_tree_greedy_func after the verify forward: both outside CUDA graphs). Unlike the
# functions above they walk each request's tree in Python (host syncs): eager only, a few draft tokens per request.
# sgl_kernel's TreeMaskMode values (FULL_MASK = 0, QLEN_ONLY = 1, QLEN_ONLY_BITPACKING = 2)
FULL_MASK, QLEN_ONLY = 0, 1


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                      retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                      draft_token_num, tree_mask_mode=FULL_MASK):
    """Torch-native ``sgl_kernel.build_tree_kernel_efficient`` (same argument order, outputs written in place).

    For each request b: token 0 is the verified (bonus) token, tokens 1..D-1 the selected draft tokens
    (``selected_index[b, i-1]`` indexes the flattened draft candidates, ``// topk`` gives its parent's entry in
    ``parent_list``). Writes the retrieve index / first-child / next-sibling links, each token's position (seq_len
    + its depth) and the attention mask among the draft tokens (each attends to itself and its ancestors)."""
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"build_tree_kernel_efficient stand-in: tree mask mode {mode} (bit-packed) has no torch stand-in")
    D = int(draft_token_num)
    bs = verified_seq_len.shape[0]
    sel = selected_index.tolist()
    par = parent_list.tolist()
    seq = verified_seq_len.tolist()
    prefix = 0
    for b in range(bs):
        s = int(seq[b])
        sel_b, par_b = sel[b], par[b]

        def parent_slot(cur):
            """The draft slot (0-based among selected tokens) of slot `cur`'s parent, or None for the root."""
            tb = sel_b[cur] // topk
            if tb == 0:
                return None
            want = par_b[tb]
            for cp in range(D - 1):
                if sel_b[cp] == want:
                    return cp
            return -1  # parent not selected: the kernel stops walking there

        # links: retrieve index, first child (next token), next sibling; children walked from the last one
        for i in range(D - 1, 0, -1):
            retrive_index[b, i] = b * D + i
            p = parent_slot(i - 1)
            if p == -1:
                continue
            pos = 0 if p is None else p + 1
            prev = int(retrive_next_token[b, pos])
            retrive_next_token[b, pos] = i
            if prev != -1:
                retrive_next_sibling[b, i] = prev
        retrive_index[b, 0] = b * D
        # positions and the mask
        positions[b * D] = s
        for t in range(D):
            if mode == FULL_MASK:
                row = D * D * b + prefix * D + (s + D) * t + s  # the token's own column among the draft columns
            else:
                row = D * D * b + D * t
            tree_mask[row] = True
            tree_mask[row + 1: row + D] = False
            if t == 0:
                continue
            cur, depth_t = t - 1, 0
            for _ in range(depth):
                depth_t += 1
                tree_mask[row + 1 + cur] = True
                p = parent_slot(cur)
                if p is None or p == -1:
                    break
                cur = p
            positions[b * D + t] = s + depth_t
        prefix += s


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict):
    """Torch-native ``sgl_kernel.verify_tree_greedy``: walk each request's tree from the root, at each level take the
    child whose draft token equals the target's greedy token at the last accepted node; record accepted indices
    (``accept_index[b, 0]`` is the root), the number of accepted drafts, and the target's token at every accepted
    node (the last one's is the bonus token)."""
    bs, S = accept_index.shape
    D = candidates.shape[1]
    tgt = target_predict.reshape(-1).tolist()
    cand = candidates.tolist()
    ridx = retrive_index.tolist()
    nxt = retrive_next_token.tolist()
    sib = retrive_next_sibling.tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        n, cur = 0, 0
        for _ in range(1, S):
            cur = nxt[b][cur]
            target = tgt[last]
            matched = False
            while cur != -1:
                if cand[b][cur] == target:
                    predicts[last] = target
                    n += 1
                    accept_index[b, n] = ridx[b][cur]
                    last = ridx[b][cur]
                    matched = True
                    break
                cur = sib[b][cur]
            if not matched:
                break
        accept_token_num[b] = n
        predicts[last] = tgt[last]


# the functions the stand-in package exports by name
EXPORTS = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul", "gelu_and_mul",
           "gelu_tanh_and_mul", "moe_sum_reduce", "moe_align_block_size", "top_k_renorm_prob", "top_p_renorm_prob",
           "top_k_renorm_probs", "top_p_renorm_probs", "weak_ref_tensor", "moe_fused_gate", "fast_topk", "build_tree_kernel_efficient",
           "verify_tree_greedy")

# torch ops sgl_kernel registers that SGLang names at import time (0.5.12's topk.py registers a fake for
# sgl_kernel::moe_fused_gate on CUDA, which needs the op to exist): their schemas and the implementations above
OPS = {"moe_fused_gate": "(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, int topk, "
                         "int num_fused_shared_experts=0, float routed_scaling_factor=0, "
                         "bool apply_routed_scaling_factor_on_output=False) -> Tensor[]"}

__all__ = list(EXPORTS)
