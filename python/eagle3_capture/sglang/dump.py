"""Capture dump: save what the target captured, to fingerprint it offline against reference hidden states.

Switched on by ``EAGLE3_CAPTURE_DUMP=<dir>`` (off by default; read at each forward, so it needs no restart of a
test process). The ``DeepseekV2Model.forward`` hook then saves, for the first ``EAGLE3_CAPTURE_DUMP_MAX``
(default 8) eager forwards of each process that return aux hidden states, one file
``<dir>/eagle3_capture_pid<pid>_<n>.pt`` holding a dict:

``input_ids``, ``positions`` (CPU int64), ``aux`` (the packed ``[T, K*H]`` buffer, on CPU, its dtype),
``forward_mode`` (name), ``draft_ids`` (None when the ``taps`` hook is off), ``layers_to_capture``, ``num_layers``, ``hidden_size``, ``describe``
(``TapSpec.describe()``), ``model_class``.

A forward being captured into a CUDA graph is never dumped (no host copy is allowed there); decode steps replayed
from a graph run no Python, so with CUDA graphs on only eager forwards (prefill/extend) are dumped.
"""
from __future__ import annotations

import os
import threading

import torch

from . import switches
from .switches import logger

_lock = threading.Lock()
_count = 0


def active() -> bool:
    return switches.dump_dir() is not None


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def maybe_dump(model, spec, input_ids, positions, forward_batch, out) -> None:
    global _count
    d = switches.dump_dir()
    if d is None or not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], torch.Tensor):
        return
    if _capturing():
        return
    limit = switches.dump_max()
    with _lock:
        if _count >= limit:
            return
        n = _count
        _count += 1
    try:
        os.makedirs(d, exist_ok=True)
        mode = getattr(forward_batch, "forward_mode", None)
        record = {
            "input_ids": input_ids.detach().to("cpu", torch.int64) if isinstance(input_ids, torch.Tensor) else None,
            "positions": positions.detach().to("cpu", torch.int64) if isinstance(positions, torch.Tensor) else None,
            "aux": out[1].detach().to("cpu"),
            "forward_mode": getattr(mode, "name", str(mode)),
            # spec is None when the taps hook is off: then layers_to_capture is SGLang's own rule's result
            "draft_ids": spec.to_draft_ids() if spec is not None else None,
            "layers_to_capture": list(getattr(model, "layers_to_capture", [])),
            "num_layers": int(model.config.num_hidden_layers),
            "hidden_size": int(model.config.hidden_size),
            "describe": spec.describe() if spec is not None else None,
            "model_class": type(model).__name__,
        }
        path = os.path.join(d, f"eagle3_capture_pid{os.getpid()}_{n:04d}.pt")
        torch.save(record, path)
        if n == 0:
            logger.info("eagle3_capture: dumping captures to %s (first %d forwards of this process)", d, limit)
    except Exception:
        logger.exception("eagle3_capture: capture dump to %s failed", d)


__all__ = ["active", "maybe_dump"]
