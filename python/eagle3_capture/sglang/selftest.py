"""Startup self-test of the capture, on the first served target forward that captures (switch ``selftest``).

Run from the model runner's forward (served.py), i.e. after a CUDA-graph replay or an eager forward, on the aux
hidden states the draft is handed; never on SGLang's warm-up or capture passes (its capture-mode flag set, or a
stream capturing), whose dummy batches (and, at TP > 1 with the legacy custom all-reduce, all-zero all-reduces)
say nothing about the served capture. It waits for a forward that captures every row (CaptureHiddenMode FULL:
prefill, verify), and at TP > 1 every rank checks its own capture on the same forward.

Needs no reference: for that batch, the slot the draft declares as ``Embedding`` must equal the embedding of the
batch's input ids bit for bit (layer input 0 is the embedding output itself, no arithmetic), and no two slots may
hold the same values. This catches the fault that motivated the project (no embedding captured, every slot one
tap later) and any capture that is wired wrong at run time, with the taps hook on (the plugin's own capture) or
off (stock SGLang's capture against the draft config's declaration).

One log line either way; ``EAGLE3_CAPTURE_SELFTEST=raise`` turns a failure into a RuntimeError (the server then
stops at its first forward). Skipped, with one line saying why, where the check cannot be made exactly: pipeline
parallelism (the embedding lives on another stage), input embeddings instead of ids, aux rows that are not the
batch's rows (e.g. scattered by DP attention), a declaration that cannot be read.
"""
from __future__ import annotations

import threading
from typing import List, Optional

import torch

from ..spec import EMBEDDING, TapError, TapSpec
from . import switches
from .declaration import config_of, declared_taps

_lock = threading.Lock()
_done = False


def reset() -> None:
    """Run the self-test again at the next capturing forward (tests)."""
    global _done
    with _lock:
        _done = False


def pending() -> bool:
    """Whether the self-test is still to run in this process (read without the lock: a stale True only costs
    one more call into :func:`check`, which claims under the lock)."""
    return not _done


def _claim() -> bool:
    global _done
    with _lock:
        if _done:
            return False
        _done = True
        return True


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def _captures_every_row(forward_batch) -> bool:
    """Whether the forward hands the draft every row's slots (CaptureHiddenMode FULL), not only the last row's."""
    mode = getattr(forward_batch, "capture_hidden_mode", None)
    is_full = getattr(mode, "is_full", None)
    return mode is None or (callable(is_full) and bool(is_full()))


def check(model, spec: Optional[TapSpec], input_ids, forward_batch, out, where: str = "") -> Optional[str]:
    """The self-test on one forward's aux hidden states (`out`: the packed [T, K*H] tensor, or the DeepseekV2Model
    forward's (hidden, aux)); `model` is the DeepseekV2Model. Returns the line it logged (None when it did not run:
    another forward will be checked)."""
    aux = out[1] if isinstance(out, tuple) and len(out) == 2 else out
    if not isinstance(aux, torch.Tensor) or aux.dim() != 2 or aux.shape[0] == 0 or _capturing():
        return None
    if forward_batch is not None and not _captures_every_row(forward_batch):
        return None
    if not _claim():
        return None
    where = f"; {where}" if where else ""
    raise_on_fail = switches.selftest_raises()
    pp = getattr(model, "pp_group", None)
    if pp is not None and getattr(pp, "world_size", 1) > 1:
        return _skip("pipeline parallelism: the embedding is computed on another stage")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        return _skip("the forward got no 1-D input ids (input embeddings?)")
    if input_ids.shape[0] != aux.shape[0]:
        return _skip(f"the aux buffer has {aux.shape[0]} rows for {input_ids.shape[0]} input ids (rows gathered or "
                     "scattered across ranks)")
    try:
        declared, source = declared_taps(model, spec)
    except (TapError, ValueError) as e:
        return _skip(f"the declared taps cannot be read ({e})")
    slot_inputs = list(getattr(model, "layers_to_capture", []))  # the layer input each slot is told to take
    H = int(config_of(model).hidden_size)
    K = aux.shape[1] // H if H else 0
    if H == 0 or aux.shape[1] != K * H:
        return _skip(f"the aux buffer is {aux.shape[1]} wide, not a multiple of H={H}")
    if declared is not None and declared.K != K:
        return _fail(f"the draft declares K={declared.K} taps ({list(declared.taps)}, from {source}) but {K} are "
                     f"captured ({rows_text(aux.shape[0], where)})", raise_on_fail)
    problems = []
    rows = aux.shape[0]
    emb_slot = None
    if declared is not None and EMBEDDING in declared.taps:
        emb_slot = declared.taps.index(EMBEDDING)
        with torch.no_grad():
            emb = model.embed_tokens(input_ids)
        got = aux[:, emb_slot * H:(emb_slot + 1) * H]
        if emb.shape != got.shape or emb.dtype != got.dtype:
            problems.append(f"slot {emb_slot} (declared Embedding) is {tuple(got.shape)} {got.dtype}, the embedding "
                            f"{tuple(emb.shape)} {emb.dtype}")
        elif not torch.equal(emb, got):
            diff = (emb.float() - got.float()).abs()
            bad = int((diff > 0).any(-1).sum())
            problems.append(f"slot {emb_slot} should hold Embedding (declared by {source}) but differs from the "
                            f"embedding of the batch's input ids in {bad} of {rows} rows (max |diff| "
                            f"{float(diff.max()):.4g}); the slot holds {_slot_source(slot_inputs, emb_slot)}")
    for i in range(K):
        for j in range(i + 1, K):
            if torch.equal(aux[:, i * H:(i + 1) * H], aux[:, j * H:(j + 1) * H]):
                problems.append(f"slots {i} and {j} hold the same values ({rows} rows)")
    if problems:
        return _fail("; ".join(problems) + "; the draft sees other inputs than it was trained on (check the taps "
                     f"with `eagle3-capture doctor check`, fingerprint a capture dump; {rows_text(rows, where)})",
                     raise_on_fail)
    what = (f"slot {emb_slot} equals the embedding bit for bit, " if emb_slot is not None
            else "no Embedding tap declared, ")
    line = f"eagle3_capture: capture self-test passed: {what}{K} slots distinct ({rows_text(rows, where)})"
    switches.announce("info", line)
    return line


def rows_text(rows: int, where: str) -> str:
    return f"{rows} rows{where}"


def _slot_source(slot_inputs: List, slot: int) -> str:
    """What the capture loop was told to put in `slot`, in words."""
    if slot >= len(slot_inputs):
        return "nothing the capture names"
    i = slot_inputs[slot]
    return "layer input 0 (the embedding)" if i == 0 else f"layer input {i} (LayerOutput({i - 1}))"


def _skip(why: str) -> str:
    line = f"eagle3_capture: capture self-test skipped: {why}"
    switches.announce("info", line)
    return line


def _fail(why: str, raise_on_fail: bool) -> str:
    line = f"eagle3_capture: capture self-test FAILED: {why}"
    switches.announce("error", line)
    if raise_on_fail:
        raise RuntimeError(line + f" ({switches.ENV_SELFTEST}=raise)")
    return line


__all__ = ["check", "pending", "reset"]
