"""Capture writes through ``eagle3_capture::capture_`` into SGLang's packed aux buffer.

Hook point: ``AuxHiddenStatePacker.append`` (switch ``capture``), on releases whose packer has ``slot()`` (0.5.23;
installed/internals.py): older packers (0.5.18-0.5.22) allocate and copy inside ``append`` with nothing to hand the op,
and 0.5.12-0.5.16 keep the captures in a Python list that the logits processor concatenates -- there SGLang's own write
stays, and the taps are still exactly the declared ones. Every write into SGLang 0.5.23's packed ``[T, K*H]`` buffer
goes through it: ``capture()`` (what the layer-boundary stage and this plugin's final-boundary capture call),
``append()`` and ``extend()``, for a buffer the packer allocates itself and for the decode CUDA-graph runner's
preallocated one (``AuxHiddenStatePacker.for_batch``: a row slice of a larger buffer). The packer keeps doing its own
bookkeeping (``slot()``: allocation, shape/dtype check against a provided buffer, slot index); only the write changes:
``copy_`` into a strided column block becomes one ``capture_`` into the slot's view, which the op accepts as a
row-strided ``[T, H]`` packed tensor.

Values the op does not take (not 2-D, another dtype, a last stride other than 1, a device the extension was not
built for) go through SGLang's own ``copy_``.

Why not ``fused_add_rmsnorm_capture_`` at the layer input: in 0.5.23 the add + input norm is chosen per path
among several readouts (plain fused add+RMSNorm, quantizing reads, all-reduce + add + norm fusions, gathers for
attention TP/DP; layer_boundary/residual/add_norm.py), and the capture takes the residual *after* the entry's
``input_move`` (the gathered rows), not the norm's input. Replacing the readout would reach into that machinery
for one of its paths and capture the wrong rows on others. The capture here is one write of T*H elements with no
temporary; the add is already done by SGLang's fused kernel.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..settings.switches import logger

from ..installed.internals import PACKER_APPEND_PATH

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ops = None
_backends: Optional[frozenset] = None
_capture_op = None  # torch.ops.eagle3_capture.capture_.default, once the extension is loaded
_fallback_logged = set()


def load_ops():
    """Import the capture ops (the compiled extension); raises ImportError with the build hint if missing."""
    global _ops, _backends, _capture_op
    if _ops is None:
        from ... import native, ops

        _backends = frozenset(native.build_info()["backends"])
        _capture_op = torch.ops.eagle3_capture.capture_.default
        _ops = ops
    return _ops


def _why_not(hidden) -> Optional[str]:
    if not isinstance(hidden, torch.Tensor):
        return f"a {type(hidden).__name__}, not a tensor"
    if hidden.dim() != 2:
        return f"{hidden.dim()}-D"
    if hidden.dtype not in _DTYPES:
        return f"dtype {hidden.dtype}"
    if hidden.shape[1] > 0 and hidden.stride(1) != 1:
        return "a last stride other than 1"
    if hidden.device.type not in _backends:
        return f"device {hidden.device.type} (extension built for {sorted(_backends)})"
    return None


def write_slot(dst, hidden) -> None:
    """The call the hook makes: `hidden` [T, H] into `dst`, one slot's [T, H] view of the packed [T, K*H] buffer
    (row stride K*H; for the decode CUDA-graph buffer, a view into its first T rows)."""
    load_ops().capture_(dst, 0, hidden)


def packer_append_hook(original, self, hidden):
    """AROUND ``AuxHiddenStatePacker.append``: the write goes through ``eagle3_capture::capture_``.

    It runs K times in every target forward, so the common case is one expression and one op call: the checks of
    :func:`_why_not` inline, and with grad mode off (SGLang's forwards) the op itself, whose native checks are the
    ones ``ops.capture_`` reaches too; with grad mode on, ``ops.capture_`` (its inference-only check)."""
    op = _capture_op
    if op is None:
        load_ops()
        op = _capture_op
    if (isinstance(hidden, torch.Tensor) and hidden.dim() == 2 and hidden.dtype in _DTYPES
            and (hidden.stride(1) == 1 or hidden.shape[1] == 0) and hidden.device.type in _backends):
        dst = self.slot(hidden)  # SGLang's bookkeeping: allocation / buffer checks / next slot
        if dst.dim() == 2 and dst.dtype == hidden.dtype and (dst.stride(1) == 1 or dst.shape[1] == 0):
            if torch.is_grad_enabled():
                _ops.capture_(dst, 0, hidden)
            else:
                op(dst, 0, hidden)
            return None
        dst.copy_(hidden)  # e.g. an fp32 residual into a bf16 buffer: SGLang's converting copy
        return None
    why = _why_not(hidden)
    if why not in _fallback_logged:
        _fallback_logged.add(why)
        logger.warning("eagle3_capture: a capture of %s goes through SGLang's copy_ (capture_ takes 2-D "
                       "float32/float16/bfloat16 tensors with contiguous rows)", why)
    return original(self, hidden)


__all__ = ["PACKER_APPEND_PATH", "packer_append_hook", "write_slot", "load_ops"]
