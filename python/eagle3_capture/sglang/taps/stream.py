"""The residual stream at more layer inputs than the draft is fed, for forwards that hold one of the doctor's own
requests (dump/forwards.py decides which forwards and which layer inputs; this module does the capture).

How: for that one forward, ``DeepseekV2Model.layers_to_capture`` is widened to the union of the served layer inputs
and the stream's, so SGLang's own capture loop (and this plugin's final-boundary capture, for layer input L) writes
every wanted layer input into one packed buffer; after the forward the list is restored and the served slots are
cut back out of that buffer, in their order, into the tensor the forward returns. The draft is therefore fed the
very values it would have been fed without the dump (a copy of the same captures; nothing else in the forward
reads ``layers_to_capture``), and the stream's values are SGLang's own captures, bit for bit.

Every attention-TP rank widens the same forwards (a capture may gather rows across ranks, a collective), so the decision
never depends on which rank writes (dump/forwards.py). Runs only eagerly: dump/forwards.py keeps such forwards out of
CUDA graphs, and under DP attention, where that decision is the DP group's, it asks for no stream at all.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch


@dataclass
class StreamRequest:
    """What one runner forward asks of the model forward inside it, and what it got back."""

    layers: List[int]                       # layer inputs of the stream (sorted, 0..L; L = the final boundary)
    num_layers: int
    taken: bool = False                     # the model forward widened its capture for it
    union: List[int] = field(default_factory=list)   # the widened layers_to_capture, in slot order
    served: List[int] = field(default_factory=list)  # the served layers_to_capture, in slot order
    packed: Optional[torch.Tensor] = None   # [T, len(union) * H]: every capture of the forward
    error: Optional[str] = None             # why no stream was taken


_request: contextvars.ContextVar[Optional[StreamRequest]] = contextvars.ContextVar("eagle3_capture_stream",
                                                                                    default=None)


def open_request(req: StreamRequest):
    return _request.set(req)


def close_request(token) -> None:
    _request.reset(token)


def take() -> Optional[StreamRequest]:
    """The stream request of the runner forward in progress, once (the first model forward inside it takes it)."""
    req = _request.get()
    if req is None or req.taken:
        return None
    req.taken = True
    return req


def widen(req: StreamRequest, served: Sequence[int], num_layers: int) -> Optional[List[int]]:
    """The layers_to_capture to run this forward with, or None (with req.error) when the served list has an
    index SGLang's loop never reaches (other than the final boundary the plugin captures): stock SGLang fails
    such a forward, and a wider capture must not make it pass."""
    served = list(served)
    odd = [i for i in served if not 0 <= i <= num_layers]
    if odd or served != sorted(set(served)):
        req.error = (f"the served layers_to_capture {served} are not distinct layer inputs 0..{num_layers} in order: "
                     "the capture is left as SGLang runs it")
        return None
    req.served = served
    req.union = sorted(set(served) | set(req.layers))
    return req.union


def split(req: StreamRequest, out, hidden_size: int):
    """The forward's output with only the served slots (in their order), keeping every capture in req.packed.
    The captures are one packed [T, K*H] tensor (packer releases) or a list of K [T, H] tensors (list releases,
    whose logits processor concatenates them; the stream's copy is then concatenated here, once, eagerly)."""
    aux = out[1] if isinstance(out, tuple) and len(out) == 2 else None
    H = hidden_size
    if isinstance(aux, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in aux):
        if len(aux) != len(req.union) or any(t.dim() != 2 or t.shape[1] != H for t in aux):
            req.error = (f"the forward returned {len(aux)} captures {[tuple(t.shape) for t in aux]}, expected "
                         f"{len(req.union)} of [T, {H}]")
            return out
        req.packed = torch.cat(list(aux), dim=1)
        pos = {i: p for p, i in enumerate(req.union)}
        return out[0], [aux[pos[i]] for i in req.served]
    if not isinstance(aux, torch.Tensor):
        req.error = "the forward returned no aux hidden states"
        return out
    hidden, packed = out
    if packed.dim() != 2 or packed.shape[1] != len(req.union) * H:
        req.error = f"the packed capture is {tuple(packed.shape)}, expected [T, {len(req.union)} x {H}]"
        return out
    req.packed = packed
    if req.served == req.union:
        return out
    pos = {i: p for p, i in enumerate(req.union)}
    served = torch.cat([packed[:, pos[i] * H:(pos[i] + 1) * H] for i in req.served], dim=1)
    return hidden, served


def columns(req: StreamRequest, wanted: Sequence[int]) -> List[int]:
    """Slot positions in req.packed of the layer inputs `wanted`."""
    pos = {i: p for p, i in enumerate(req.union)}
    return [pos[i] for i in wanted]


__all__ = ["StreamRequest", "open_request", "close_request", "take", "widen", "split", "columns"]
