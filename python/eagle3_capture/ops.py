"""Python API over torch.ops.eagle3_capture.*: each op's typed wrapper with its fake (meta) implementation right
above it, so the ops trace under torch.compile and FakeTensorMode. The fake implementations check shapes the way the
native checks do, so a compiled graph fails at trace time on the inputs the kernels would refuse. The schemas are
in csrc/ops/registration.cpp.

The ops are inference-only: they have no backward, and with grad mode on a tensor argument that requires grad is
refused here (see ``_inference_only``); call them under ``torch.no_grad()`` / ``torch.inference_mode()``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .native import load

load()
_ops = torch.ops.eagle3_capture

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _inference_only(op: str, **tensors) -> None:
    """The ops have no backward: with grad mode on, an argument that requires grad would silently get no gradient
    (draft_fc) or be mutated in place behind autograd's back (the capture ops), so it is refused. Training uses
    plain torch (eagle3_capture.reference holds the same math)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(f"eagle3_capture.{op} is inference-only (no backward): '{name}' requires grad; call "
                               "it under torch.no_grad() or torch.inference_mode(), or detach the tensor "
                               "(for training, use the plain-torch eagle3_capture.reference)")


def _check_packed(op: str, packed: torch.Tensor, slot: int, tap: torch.Tensor) -> None:
    torch._check(packed.dim() == 2, lambda: f"eagle3_capture.{op}: expected packed [T, K*H], got {tuple(packed.shape)}")
    torch._check(tap.dim() == 2, lambda: f"eagle3_capture.{op}: expected a [T, H] tap, got {tuple(tap.shape)}")
    torch._check(packed.dtype == tap.dtype, lambda: f"eagle3_capture.{op}: packed dtype {packed.dtype} != {tap.dtype}")
    torch._check(tap.dtype in _DTYPES, lambda: f"eagle3_capture.{op}: unsupported dtype {tap.dtype}")
    torch._check(packed.shape[0] == tap.shape[0], lambda: f"eagle3_capture.{op}: packed has {packed.shape[0]} rows, tap {tap.shape[0]}")
    h = tap.shape[1]
    torch._check(h >= 1 and packed.shape[1] % h == 0 and packed.shape[1] >= h,
                 lambda: f"eagle3_capture.{op}: packed width {packed.shape[1]} is not K*H for H={h}")
    torch._check(0 <= slot < packed.shape[1] // h, lambda: f"eagle3_capture.{op}: slot {slot} out of range")


def _tap_list(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, torch.Tensor) for t in x):
        return list(x)
    raise TypeError("eagle3_capture.draft_fc: x must be a packed [M, K*H] tensor or a non-empty list of K [M, H] "
                    f"tensors, got {type(x).__name__}")


def _norm_tensor(norm_weights):
    """None, a [K, H] tensor, or a list of K [H] tensors (stacked here: pass [K, H] to avoid it per call)."""
    if norm_weights is None or isinstance(norm_weights, torch.Tensor):
        return norm_weights
    return torch.stack(list(norm_weights))


@torch.library.register_fake("eagle3_capture::capture_")
def _capture_fake(packed, slot, hidden, residual=None):
    _check_packed("capture_", packed, slot, hidden)
    if residual is not None:
        torch._check(residual.shape == hidden.shape, lambda: "eagle3_capture.capture_: residual shape != hidden shape")
    return None


def capture_(packed: torch.Tensor, slot: int, hidden: torch.Tensor, residual: Optional[torch.Tensor] = None) -> None:
    """Writes `hidden` (+ `residual`, added in fp32 and rounded once, exactly like torch's `hidden + residual`) into
    columns [slot*H, (slot+1)*H) of the packed [T, K*H] buffer, in one pass with no temporary.

    `packed` may be a row-strided view (e.g. the first T rows of a larger decode buffer); every tensor needs
    contiguous rows (last stride 1). CPU and CUDA; float32, float16, bfloat16; T may be 0.
    """
    _inference_only("capture_", packed=packed, hidden=hidden, residual=residual)
    _ops.capture_(packed, slot, hidden, residual)


@torch.library.register_fake("eagle3_capture::fused_add_rmsnorm_capture_")
def _fused_add_rmsnorm_capture_fake(hidden, residual, weight, eps, packed, slot):
    _check_packed("fused_add_rmsnorm_capture_", packed, slot, hidden)
    torch._check(residual.shape == hidden.shape, lambda: "eagle3_capture.fused_add_rmsnorm_capture_: residual shape != hidden shape")
    torch._check(weight.dim() == 1 and weight.shape[0] == hidden.shape[1],
                 lambda: f"eagle3_capture.fused_add_rmsnorm_capture_: weight must be [H], got {tuple(weight.shape)}")
    return None


def fused_add_rmsnorm_capture_(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                               packed: torch.Tensor, slot: int) -> None:
    """The residual-stream step at a decoder layer's input, capturing on the way, in place:

        residual <- residual + hidden                (fp32 add, rounded to the storage dtype)
        packed[:, slot*H:(slot+1)*H] <- residual     (the tap: the previous layer's output)
        hidden <- rmsnorm(residual) * weight         (from the unrounded fp32 sum, as SGLang's fused_add_rmsnorm)

    The only traffic beyond the plain fused add+norm is one write of T*H elements.
    """
    _inference_only("fused_add_rmsnorm_capture_", hidden=hidden, residual=residual, weight=weight, packed=packed)
    _ops.fused_add_rmsnorm_capture_(hidden, residual, weight, eps, packed, slot)


@torch.library.register_fake("eagle3_capture::draft_fc")
def _draft_fc_fake(x, weight, norm_weight=None, eps=1e-6, bias=None):
    torch._check(len(x) >= 1, lambda: "eagle3_capture.draft_fc: empty x")
    torch._check(weight.dim() == 2, lambda: f"eagle3_capture.draft_fc: weight must be [N, K*H], got {tuple(weight.shape)}")
    in_features = x[0].shape[1] * len(x)
    torch._check(weight.shape[1] == in_features,
                 lambda: f"eagle3_capture.draft_fc: weight in_features {weight.shape[1]} != K*H {in_features}")
    return x[0].new_empty((x[0].shape[0], weight.shape[0]))


@torch.library.register_fake("eagle3_capture::draft_fc_out")
def _draft_fc_out_fake(x, weight, norm_weight, eps, bias, out):
    torch._check(out.shape == (x[0].shape[0], weight.shape[0]),
                 lambda: f"eagle3_capture.draft_fc: out must be [M, N], got {tuple(out.shape)}")
    return None


def draft_fc(x, weight: torch.Tensor, norm_weights=None, eps: float = 1e-6, bias: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The EAGLE-3 draft's fc over its captured taps: linear(cat(rmsnorm_k(x_k) * g_k), weight, bias), with no concat.

    x: the packed [M, K*H] capture buffer (K taken from norm_weights; without norms the packed row is one input)
       or a list of K [M, H] tensors. weight: [N, K*H] (N = H, or H/tp for a column-parallel shard).
    norm_weights: None (EAGLE-3), or the per-tap RMSNorm weights of EAGLE-3.1 drafts (`fc_norm`) as [K, H] or a
       list of K [H]. bias: [N] or None. out: optional [M, N] contiguous output.
    bf16/fp16 (CUDA decode kernel for M <= the device's threshold, 8 on sm_90 and 16 on sm_12x: weights streamed
    once, norms applied on the fly; above that the normalised taps go through cuBLAS) and float32 (CPU, and the cuBLAS path on CUDA). H must be a multiple of 8.
    """
    taps = _tap_list(x)
    g = _norm_tensor(norm_weights)
    _inference_only("draft_fc", x=x if isinstance(x, torch.Tensor) else None,
                    **{f"x[{k}]": t for k, t in enumerate(taps) if not isinstance(x, torch.Tensor)},
                    weight=weight, norm_weights=g, bias=bias, out=out)
    if out is None:
        return _ops.draft_fc(taps, weight, g, eps, bias)
    _ops.draft_fc_out(taps, weight, g, eps, bias, out)
    return out


# The p2p gather's limits, as csrc/kernels/gather.h sets them (tests/test_gather.py reads them there).
GATHER_MAX_RANKS = 16       # e3::kGatherMaxRanks
GATHER_MAX_SEGMENTS = 16    # e3::kGatherMaxSegments
GATHER_MAX_BLOCKS = 1024    # e3::kGatherMaxBlocks
GATHER_FLAG_WORDS = 64 + GATHER_MAX_RANKS * GATHER_MAX_BLOCKS  # e3::kGatherFlagWords
GATHER_SIGNALS = (0, 1)     # e3::kGatherSignalAtomic, e3::kGatherSignalFlags


@torch.library.register_fake("eagle3_capture::gather_p2p_")
def _gather_p2p_fake(out, local, out_ptrs, flag_ptrs, flags, error, rank, dst_row_offset, src_cols, dst_cols,
                     seg_len, blocks, timeout_s, signal=0, trap_on_timeout=True):
    op = "eagle3_capture.gather_p2p_"
    torch._check(out.dim() == 2, lambda: f"{op}: expected out [rows, K*H], got {tuple(out.shape)}")
    torch._check(local.dim() == 2, lambda: f"{op}: expected local [rows, cols], got {tuple(local.shape)}")
    torch._check(local.dtype == out.dtype, lambda: f"{op}: local dtype {local.dtype} != out dtype {out.dtype}")
    torch._check(out.dtype in _DTYPES, lambda: f"{op}: unsupported dtype {out.dtype}")
    world = len(out_ptrs)
    torch._check(1 <= world <= GATHER_MAX_RANKS, lambda: f"{op}: expected 1..{GATHER_MAX_RANKS} ranks, got {world}")
    torch._check(len(flag_ptrs) == world, lambda: f"{op}: expected {world} flag pointers (one per rank), got "
                                                  f"{len(flag_ptrs)}")
    torch._check(0 <= rank < world, lambda: f"{op}: rank {rank} out of range for world {world}")
    torch._check(flags.dtype == torch.int64 and flags.numel() >= GATHER_FLAG_WORDS,
                 lambda: f"{op}: flags must be an int64 flag area of at least {GATHER_FLAG_WORDS} words, got "
                         f"{flags.dtype} x {flags.numel()}")
    torch._check(error.dtype == torch.int32 and error.numel() >= 4,
                 lambda: f"{op}: error must be an int32 tensor of at least 4 elements, got {error.dtype} x "
                         f"{error.numel()}")
    segments = len(src_cols)
    torch._check(1 <= segments <= GATHER_MAX_SEGMENTS and len(dst_cols) == segments,
                 lambda: f"{op}: expected 1..{GATHER_MAX_SEGMENTS} column segments with one source and one "
                         f"destination column each, got {segments} and {len(dst_cols)}")
    torch._check(seg_len >= 1, lambda: f"{op}: segment length must be >= 1, got {seg_len}")
    for s, (src, dst) in enumerate(zip(src_cols, dst_cols)):
        torch._check(0 <= src and src + seg_len <= local.shape[1],
                     lambda: f"{op}: segment {s} reads local columns [{src}, {src + seg_len}) of {local.shape[1]}")
        torch._check(0 <= dst and dst + seg_len <= out.shape[1],
                     lambda: f"{op}: segment {s} writes output columns [{dst}, {dst + seg_len}) of {out.shape[1]}")
    torch._check(0 <= dst_row_offset and dst_row_offset + local.shape[0] <= out.shape[0],
                 lambda: f"{op}: this rank's {local.shape[0]} rows at offset {dst_row_offset} do not fit the "
                         f"output's {out.shape[0]} rows")
    torch._check(1 <= blocks <= GATHER_MAX_BLOCKS, lambda: f"{op}: blocks must be in 1..{GATHER_MAX_BLOCKS}, got "
                                                          f"{blocks}")
    torch._check(signal in GATHER_SIGNALS, lambda: f"{op}: signal must be 0 (atomic) or 1 (flags), got {signal}")
    torch._check(math.isfinite(timeout_s) and 0 < timeout_s <= 1e6,
                 lambda: f"{op}: timeout must be in (0, 1e6] s, got {timeout_s}")
    return None


def gather_p2p_(out: torch.Tensor, local: torch.Tensor, out_ptrs: Sequence[int], flag_ptrs: Sequence[int],
                flags: torch.Tensor, error: torch.Tensor, rank: int, dst_row_offset: int, src_cols: Sequence[int],
                dst_cols: Sequence[int], seg_len: int, blocks: int, timeout_s: float, signal: int = 0,
                trap_on_timeout: bool = True) -> None:
    """One rank's part of a TP gather (CUDA only): this rank's ``local`` rows, as ``len(src_cols)`` column segments
    of ``seg_len`` columns each (``local[:, src_cols[s]:+seg_len]`` -> ``out[:, dst_cols[s]:+seg_len]``), written at
    row ``dst_row_offset`` into every rank's registered output buffer over peer-mapped memory, ordered by the
    peer-mapped ``flags`` (``signal`` 0: atomic counters, 1: per-block flags; the same on every rank).

    ``out`` is this rank's registered output (its address is ``out_ptrs[rank]``), ``flags`` its flag area
    (``flag_ptrs[rank]``); ``error`` a pinned int32 [4] that a wait longer than ``timeout_s`` fills in (code, peer,
    step, count) before it traps (``trap_on_timeout``) or turns every later call on this flag area into a no-op
    (the probe). ``tp.PackedGatherer`` owns the peer mapping and drives this; call it directly only with its
    buffers. No grad: nothing here has a backward, and the out / flags / error arguments are written in place.
    """
    _inference_only("gather_p2p_", out=out, local=local)
    _ops.gather_p2p_(out, local, out_ptrs, flag_ptrs, flags, error, rank, dst_row_offset, src_cols, dst_cols, seg_len,
                     blocks, timeout_s, signal, trap_on_timeout)


# ----------------------------------------------------------------------------------------------------------------
# Test and benchmark knobs of the native extension (process-wide settings, not ops)
# ----------------------------------------------------------------------------------------------------------------

def _set_draft_fc_decode_max_rows(rows: int) -> int:
    """Benchmark/test knob: CUDA bf16/fp16 draft_fc takes the decode kernel for M <= rows (clamped to 0..16: the
    kernels hold two token groups of 8), the normalise + cuBLAS path above. Process-wide; a negative value (the
    initial setting, -1) means each device's tuned threshold (`eagle3_capture.tuning`: 8 on sm_90, 16 on sm_12x;
    EAGLE3_CAPTURE_DECODE_MAX_ROWS overrides it). Returns the previous setting so callers can restore it."""

    return int(load().set_draft_fc_decode_max_rows(int(rows)))


def _set_draft_fc_cluster_fault(cuda_error: int) -> int:
    """Test knob: the cudaError_t value (e.g. 912, cudaErrorInvalidClusterSize) that the cluster decode kernel's
    launch pretends to return, so the fallback to the split kernel (one line on stderr) runs on a GPU where clusters
    launch; 0 turns it off. Process-wide; returns the previous value."""
    return int(load().set_draft_fc_cluster_fault(int(cuda_error)))


_DECODE_KERNELS = ("auto", "cluster", "split")  # e3::DraftFcDecodeKernel, in its order


def _set_draft_fc_decode_kernel(kernel: str) -> str:
    """Test/benchmark knob: the decode kernel CUDA draft_fc prefers, process-wide; returns the previous one.

    "cluster" (sm_90+, K <= 8): the K-splits of a column tile reduced in a thread-block cluster's shared memory.
    "split": partials added in an L2 workspace by atomics (any GPU). "auto" (default): cluster for small N (the split
    grid cuts each tap into at least the device's `cluster_min_splits` pieces, `eagle3_capture.tuning`) where its
    grid fits one wave of co-resident clusters, else split. Where the preferred kernel does not apply, auto's choice
    runs; a cluster launch the device refuses runs the split kernel (one line on stderr)."""
    if kernel not in _DECODE_KERNELS:
        raise ValueError(f"decode kernel must be one of {_DECODE_KERNELS}, got {kernel!r}")
    return _DECODE_KERNELS[int(load().set_draft_fc_decode_kernel(_DECODE_KERNELS.index(kernel)))]


__all__ = ["capture_", "fused_add_rmsnorm_capture_", "draft_fc", "gather_p2p_", "GATHER_MAX_RANKS",
           "GATHER_MAX_SEGMENTS", "GATHER_MAX_BLOCKS", "GATHER_FLAG_WORDS"]
