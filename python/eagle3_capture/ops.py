"""Python API over torch.ops.eagle3_capture.*, with a fake (meta) implementation beside every op so they trace
under torch.compile and FakeTensorMode. The fake implementations check shapes the way the native checks do, so a
compiled graph fails at trace time on the inputs the kernels would refuse.

The ops are inference-only: they have no backward, and with grad mode on a tensor argument that requires grad is
refused here (see ``_inference_only``); call them under ``torch.no_grad()`` / ``torch.inference_mode()``.
"""
from __future__ import annotations

from typing import Optional

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


@torch.library.register_fake("eagle3_capture::capture_")
def _capture_fake(packed, slot, hidden, residual=None):
    _check_packed("capture_", packed, slot, hidden)
    if residual is not None:
        torch._check(residual.shape == hidden.shape, lambda: "eagle3_capture.capture_: residual shape != hidden shape")
    return None


@torch.library.register_fake("eagle3_capture::fused_add_rmsnorm_capture_")
def _fused_add_rmsnorm_capture_fake(hidden, residual, weight, eps, packed, slot):
    _check_packed("fused_add_rmsnorm_capture_", packed, slot, hidden)
    torch._check(residual.shape == hidden.shape, lambda: "eagle3_capture.fused_add_rmsnorm_capture_: residual shape != hidden shape")
    torch._check(weight.dim() == 1 and weight.shape[0] == hidden.shape[1],
                 lambda: f"eagle3_capture.fused_add_rmsnorm_capture_: weight must be [H], got {tuple(weight.shape)}")
    return None


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


def capture_(packed: torch.Tensor, slot: int, hidden: torch.Tensor, residual: Optional[torch.Tensor] = None) -> None:
    """Writes `hidden` (+ `residual`, added in fp32 and rounded once, exactly like torch's `hidden + residual`) into
    columns [slot*H, (slot+1)*H) of the packed [T, K*H] buffer, in one pass with no temporary.

    `packed` may be a row-strided view (e.g. the first T rows of a larger decode buffer); every tensor needs
    contiguous rows (last stride 1). CPU and CUDA; float32, float16, bfloat16; T may be 0.
    """
    _inference_only("capture_", packed=packed, hidden=hidden, residual=residual)
    _ops.capture_(packed, slot, hidden, residual)


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


__all__ = ["capture_", "fused_add_rmsnorm_capture_", "draft_fc"]
