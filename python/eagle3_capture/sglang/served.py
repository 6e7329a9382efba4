"""Around the model runner's forward: the capture self-test and the capture dump see every served target forward,
and only served ones.

Hook points (AROUND hooks through SGLang's HookRegistry) and why these, read in SGLang 0.5.23's
``model_executor/model_runner.py`` and ``model_executor/runner/*``:

* ``ModelRunner.forward`` (switch ``selftest``, and the dump): the scheduler's TP worker calls it once per served
  forward, whatever runs it underneath -- ``_forward_raw`` replays the decode/verify CUDA graph
  (``DecodeCudaGraphRunner.execute``), the piecewise/breakable prefill graph (``PrefillCudaGraphRunner.execute``) or
  runs the ``EagerRunner`` -- and returns a ``ModelRunnerOutput`` whose ``logits_output.hidden_states`` is the packed
  aux buffer the EAGLE worker hands the draft (CaptureHiddenMode FULL: prefill and verify), already cut to the
  batch's real rows by the graph runners. SGLang's warm-up and capture passes never go through it: the graph
  runners call the model's forward directly inside ``model_capture_mode()`` (``capture_one_shape`` /
  ``run_once``). It is skipped anyway whenever SGLang's capture-mode flag is set or the stream is capturing.
  ``DeepseekV2Model.forward``, where these checks used to run, runs only in those warm-up and capture passes under
  CUDA graphs (and the breakable prefill replay swaps it out on the instance).
* ``DecodeCudaGraphRunner.can_run_graph``, ``PrefillCudaGraphRunner.can_run_graph``, ``CPUGraphRunner.can_run_graph``
  (0.5.14+; on 0.5.12 ``CudaGraphRunner``, ``PiecewiseCudaGraphRunner``, ``BreakableCudaGraphRunner`` and
  ``CPUGraphRunner.can_run``: whichever the installed release has, installed/internals.py) (only with the dump on):
  SGLang decides graph or eager per batch there -- ``_forward_raw`` for every forward, and ``eagle_utils`` once more
  before a verify -- so answering False for a target batch that holds one of the doctor's requests makes that
  forward eager everywhere alike, which the stream needs (dump/forwards.py). The draft's runners are not touched.
  SGLang's capture-mode flag is ``runner_utils.capture_mode.get_is_capture_mode`` (0.5.14+) or
  ``cuda_graph_runner.get_is_capture_mode`` (0.5.12).

Between self-tests (or with it off) and the dump off, the forward hook only reads the runner's draft flag, counts
the forward, reads the clock once (selftest.due(): well under a microsecond) and checks a flag before calling
SGLang.
"""
from __future__ import annotations

import torch

from .dump import forwards
from .dump.record import batch_rows
from .installed import internals
from .monitor import selftest
from .settings import switches
from .settings.switches import logger
from .taps import stream
from .taps.declaration import remember_config
from .taps.model_forward import SPEC_ATTR

RUNNER_FORWARD_PATH = internals.RUNNER_FORWARD_PATH

_TARGET_ATTR = "_eagle3_capture_target"  # on the ModelRunner: (id(model), (model, inner) or None)
_capture_mode = None


def _in_capture() -> bool:
    """SGLang's capture-mode flag (its warm-up and capture passes) or a stream being captured."""
    global _capture_mode
    if _capture_mode is None:
        path = internals.current().capture_mode_path
        # without SGLang's flag (internals moved), a capturing stream is the only sign left
        _capture_mode = internals.resolve(path) if path else (lambda: False)
    if _capture_mode():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def target_of(runner):
    """(causal LM, its DeepseekV2Model) when `runner` serves a DeepseekV2-family target that captures aux hidden
    states for a draft; else None. Cached on the runner per model object."""
    model = getattr(runner, "model", None)
    cached = runner.__dict__.get(_TARGET_ATTR)
    if cached is not None and cached[0] == id(model):
        return cached[1]
    found = None
    if not getattr(runner, "is_draft_worker", False) and getattr(model, "capture_aux_hidden_states", False):
        from sglang.srt.models.deepseek_v2 import DeepseekV2Model

        inner = getattr(model, "model", None)
        if isinstance(inner, DeepseekV2Model):
            found = (model, inner)
            remember_config(model)  # with the taps hook off, nothing else records it where 0.5.12 lacks it
    runner.__dict__[_TARGET_ATTR] = (id(model), found)
    return found


def runner_forward_hook(original, self, forward_batch, *args, **kwargs):
    """AROUND ``ModelRunner.forward``: the self-test on the served target forwards it is due on (the first that
    captures every row, then periodically and after a weight update: selftest.due() counts them), and the capture
    dump (with the doctor's stream) when it is switched on."""
    test = (not getattr(self, "is_draft_worker", False) and switches.enabled(switches.SELFTEST)
            and selftest.due())  # due() counts the forward: only where the self-test is on
    dumping = forwards.wants(forward_batch)
    if not (test or dumping):
        return original(self, forward_batch, *args, **kwargs)
    found = target_of(self)
    if found is None or _in_capture():
        return original(self, forward_batch, *args, **kwargs)
    model, inner = found
    spec = getattr(inner, SPEC_ATTR, None)
    rows = batch_rows(forward_batch)  # before the forward: the eager runner may rewrite the batch's mode
    req = forwards.want_stream(inner, spec, rows) if dumping else None
    token = stream.open_request(req) if req is not None else None
    try:
        out = original(self, forward_batch, *args, **kwargs)
    finally:
        if token is not None:
            stream.close_request(token)
    aux = getattr(getattr(out, "logits_output", None), "hidden_states", None)
    graph = bool(getattr(out, "can_run_graph", False))
    if test and isinstance(aux, torch.Tensor):
        n = aux.shape[0] if rows.note else rows.rows
        ids = forward_batch.input_ids
        rid = rows.requests[0][0] if rows.requests else None
        where = (f"served {rows.mode} forward{' replayed from a CUDA graph' if graph else ''}"
                 + (f", request {rid}" if rid is not None else "")
                 + (f" and {len(rows.requests) - 1} more" if len(rows.requests) > 1 else ""))
        selftest.check(inner, spec, ids[:n] if isinstance(ids, torch.Tensor) else ids, forward_batch, aux[:n],
                       where=where, tp_rank=int(getattr(self, "tp_rank", 0) or 0))
    if dumping:
        try:
            forwards.record(model, inner, spec, forward_batch, rows, aux, graph, req)
        except Exception as e:  # the dump must never break serving
            forwards.fail(f"{type(e).__name__}: {e}")
            logger.debug("eagle3_capture: capture dump failure", exc_info=True)
    return out


def graph_gate_hook(original, self, forward_batch, *args, **kwargs):
    """AROUND a graph runner's ``can_run_graph``: no CUDA graph for a target forward holding a doctor request
    while the dump reads its stream."""
    if forwards.forces_eager(forward_batch):
        runner = getattr(self, "model_runner", None)
        if runner is not None and target_of(runner) is not None:
            return False
    return original(self, forward_batch, *args, **kwargs)


def graph_gate_hooks(i: internals.Internals):
    """(dotted path, hook) for every graph-or-eager decision the release `i` has."""
    return [(path, graph_gate_hook) for path in i.graph_gate_paths]


__all__ = ["RUNNER_FORWARD_PATH", "runner_forward_hook", "graph_gate_hook", "graph_gate_hooks", "target_of"]
