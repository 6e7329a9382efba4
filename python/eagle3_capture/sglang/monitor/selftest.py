"""The capture self-test on served target forwards (switch ``selftest``): at the first that captures (start-up),
then again while serving -- every ``EAGLE3_CAPTURE_SELFTEST_EVERY`` served target forwards or
``EAGLE3_CAPTURE_SELFTEST_SECONDS`` seconds, whichever comes first, and at the first capturing forward after any
weight update or reload SGLang performs (weight_update.py hooks its entry points).

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

One log line either way, ending with what ran it (`` -- run at start-up``, ``after 10000 served forwards``,
``after 300 s``, ``after a weight update (<SGLang's method>)``), and the exporter's counters
(``selftest_runs{result}``, ``selftest_failures``, the ``capture_broken`` gauge). ``EAGLE3_CAPTURE_SELFTEST=raise``:
a failure at start-up raises a RuntimeError (the server stops at its first forward, nothing served yet); a failure
while serving makes the scheduler finish every new request at once with SGLang's own abort, carrying one line
that names the failed self-test (monitor/admission.py), instead of serving a broken capture or dying with requests in
flight; a later passing self-test (e.g. after a weight reload fixed it) serves again. Skipped, with one line saying
why, where the check cannot be made exactly: pipeline parallelism (the embedding lives on another stage), input
embeddings instead of ids, aux rows that are not the batch's rows (e.g. scattered by DP attention), a declaration
that cannot be read.

Cost. Between re-checks the forward hook does, per served target forward, one attribute read (is it the draft's
runner), one integer increment and compare, and one ``time.monotonic()`` (a vDSO clock read, ~50 ns) and compare:
well under a microsecond against a forward of milliseconds, no device work, nothing inside CUDA graphs (the hook is
around ``ModelRunner.forward``, outside the replay). A re-check costs one embedding gather of the forward's rows and
1 + K(K-1)/2 ``torch.equal`` over [rows, H] slices, each a device sync (the host reads the verdict): at Kimi-K2.5
width (H = 7168, K = 3, bf16) a slot of a 4096-token prefill is 56 MiB, so 4 comparisons read ~450 MiB and the
gather moves ~110 MiB: ~0.1 ms of H200 bandwidth plus 4 host round trips (~10 us each), and a few microseconds for
a 64-row verify -- a stall well under a millisecond once every 10000 forwards or 300 s, under 1e-6 of serving
time at the defaults. At TP > 1 the embedding
all-reduces across the ranks, so every rank must check the same forward: the count and the weight-update triggers
fall on the same forward on every rank, the time trigger would not, so it is off there (one INFO line at start-up)
and ``raise`` agrees on the verdict across those ranks (one all-reduce of one integer on their CPU group, at a
re-check only) so that every rank refuses the same requests.
"""
from __future__ import annotations

import math
import threading
from time import monotonic  # the time trigger's clock (tests replace it)
from typing import List, Optional

import torch

from ...acceptance import names
from ...spec import EMBEDDING, TapError, TapSpec
from ..installed import internals
from ..settings import switches
from ..taps.declaration import config_of, declared_taps
from . import exporter

STARTUP = "at start-up"
_lock = threading.Lock()
# The trigger of the check waiting for the next capturing forward (None: none waits); the first is the start-up's.
_pending: Optional[str] = STARTUP
_started = False          # the start-up check ran in this process
_forwards = 0             # served target forwards since the last check
_every_at = math.inf      # _forwards at which the count trigger fires (inf: off)
_deadline = math.inf      # monotonic() at which the time trigger fires (inf: off)
_time_off_at_tp = False   # the time trigger is off: the embedding all-reduces across ranks
_refusal: Optional[str] = None  # raise mode: why new requests are refused (a failed check while serving)


def reset() -> None:
    """Back to a fresh process: the start-up check runs at the next capturing forward, no refusal (tests)."""
    global _pending, _started, _forwards, _every_at, _deadline, _time_off_at_tp, _refusal
    with _lock:
        _pending, _started, _forwards = STARTUP, False, 0
        _every_at, _deadline, _time_off_at_tp, _refusal = math.inf, math.inf, False, None


def pending() -> bool:
    """Whether a check waits for the next capturing forward (read without the lock: a stale True only costs one
    more call into :func:`check`, which claims under the lock)."""
    return _pending is not None


def due() -> bool:
    """Called once per served target forward (the hot path): whether a check waits, arming the periodic one when
    its count or time has come. An increment, a clock read and two compares while nothing waits."""
    global _forwards
    if _pending is not None:
        return True
    _forwards += 1
    if _forwards >= _every_at:
        return arm(f"after {_forwards} served forwards")
    if monotonic() >= _deadline:
        return arm(f"after {switches.selftest_period()[1]} s")
    return False


def arm(trigger: str) -> bool:
    """Make the next capturing forward run the check, saying `trigger` ran it (a pending start-up check stays the
    start-up's: nothing was served before it)."""
    global _pending
    with _lock:
        if _pending is None:
            _pending = trigger
    return True


def weight_update_hook(original, self, *args, **kwargs):
    """AROUND each of SGLang's weight-update and reload entry points (internals.WEIGHT_UPDATE_PATHS): call it, then
    have the next capturing forward re-check the capture (new weights, maybe a new model object) -- also when it
    failed, which may have changed some weights before it did."""
    try:
        return original(self, *args, **kwargs)
    finally:
        arm(f"after a weight update ({getattr(original, '__name__', 'update')})")


def refusal() -> Optional[str]:
    """The line new requests are finished with while a self-test that failed while serving stands (raise mode);
    None while serving."""
    return _refusal


def _claim() -> Optional[str]:
    """Take the pending check (its trigger), or None when another forward took it; restarts both periods."""
    global _pending, _started, _forwards, _every_at, _deadline
    with _lock:
        trigger = _pending
        if trigger is None:
            return None
        _pending = None
        _started = True
        every, seconds = switches.selftest_period()
        _forwards = 0
        _every_at = every if every > 0 else math.inf
        _deadline = monotonic() + seconds if seconds > 0 and not _time_off_at_tp else math.inf
        return trigger


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


def _embedding_tp_size(model) -> int:
    return int(getattr(getattr(model, "embed_tokens", None), "tp_size", 1) or 1)


def check(model, spec: Optional[TapSpec], input_ids, forward_batch, out, where: str = "",
          tp_rank: int = 0) -> Optional[str]:
    """The self-test on one forward's aux hidden states (`out`: the packed [T, K*H] tensor, or the DeepseekV2Model
    forward's (hidden, aux)) when one is pending (:func:`due`); `model` is the DeepseekV2Model, `tp_rank` labels
    the metrics. Returns the line it logged (None when it did not run: another forward will be checked)."""
    aux = out[1] if isinstance(out, tuple) and len(out) == 2 else out
    if not isinstance(aux, torch.Tensor) or aux.dim() != 2 or aux.shape[0] == 0 or _capturing():
        return None
    if forward_batch is not None and not _captures_every_row(forward_batch):
        return None
    if not _started:
        _time_trigger_at_tp(model)
    trigger = _claim()
    if trigger is None:
        return None
    result = _Result(trigger, tp_rank, model)
    where = f"; {where}" if where else ""
    pp = getattr(model, "pp_group", None)
    if pp is not None and getattr(pp, "world_size", 1) > 1:
        return result.skip("pipeline parallelism: the embedding is computed on another stage")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        return result.skip("the forward got no 1-D input ids (input embeddings?)")
    if input_ids.shape[0] != aux.shape[0]:
        return result.skip(f"the aux buffer has {aux.shape[0]} rows for {input_ids.shape[0]} input ids (rows "
                           "gathered or scattered across ranks)")
    try:
        declared, source = declared_taps(model, spec)
    except (TapError, ValueError) as e:
        return result.skip(f"the declared taps cannot be read ({e})")
    slot_inputs = list(getattr(model, "layers_to_capture", []))  # the layer input each slot is told to take
    H = int(config_of(model).hidden_size)
    K = aux.shape[1] // H if H else 0
    if H == 0 or aux.shape[1] != K * H:
        return result.skip(f"the aux buffer is {aux.shape[1]} wide, not a multiple of H={H}")
    if declared is not None and declared.K != K:
        return result.fail(f"the draft declares K={declared.K} taps ({list(declared.taps)}, from {source}) but {K} "
                           f"are captured ({rows_text(aux.shape[0], where)})")
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
        return result.fail("; ".join(problems) + "; the draft sees other inputs than it was trained on (check the "
                           f"taps with `eagle3-capture doctor check`, fingerprint a capture dump; "
                           f"{rows_text(rows, where)})")
    what = (f"slot {emb_slot} equals the embedding bit for bit, " if emb_slot is not None
            else "no Embedding tap declared, ")
    return result.passed(f"{what}{K} slots distinct ({rows_text(rows, where)})")


def rows_text(rows: int, where: str) -> str:
    return f"{rows} rows{where}"


def _slot_source(slot_inputs: List, slot: int) -> str:
    """What the capture loop was told to put in `slot`, in words."""
    if slot >= len(slot_inputs):
        return "nothing the capture names"
    i = slot_inputs[slot]
    return "layer input 0 (the embedding)" if i == 0 else f"layer input {i} (LayerOutput({i - 1}))"


def _time_trigger_at_tp(model) -> None:
    """Before the first check: where the embedding all-reduces across ranks, turn the time trigger off (ranks would
    re-check different forwards and the embedding's all-reduce would not match), saying so once."""
    global _time_off_at_tp
    every, seconds = switches.selftest_period()
    n = _embedding_tp_size(model)
    if n > 1 and not _time_off_at_tp:
        _time_off_at_tp = True
        if seconds > 0:
            switches.announce("info", f"eagle3_capture: {switches.ENV_SELFTEST_SECONDS}={seconds} has no effect at "
                                      f"TP {n}: the self-test's embedding all-reduces across the ranks, which must "
                                      "check the same forward, and only a count falls on the same forward everywhere "
                                      f"({switches.ENV_SELFTEST_EVERY}={every} re-checks"
                                      f"{'' if every else ': 0, never'})")


class _Result:
    """Says one check's verdict: the log line (with its trigger), the metrics, and in raise mode the stop (at
    start-up) or the refusal of new requests (while serving)."""

    def __init__(self, trigger: str, tp_rank: int, model):
        self.trigger, self.model = trigger, model
        self.labels = {names.TP_RANK: str(tp_rank)}

    def _line(self, verdict: str, text: str) -> str:
        return f"eagle3_capture: capture self-test {verdict}: {text} -- run {self.trigger}"

    def skip(self, why: str) -> str:
        line = self._line("skipped", why)
        switches.announce("info", line)
        _export(names.SELFTEST_RUNS, dict(self.labels, **{names.RESULT: "skipped"}))
        return line

    def passed(self, text: str) -> str:
        line = self._line("passed", text)
        switches.announce("info", line)
        _export(names.SELFTEST_RUNS, dict(self.labels, **{names.RESULT: "passed"}))
        _export(names.CAPTURE_BROKEN, self.labels, gauge=0)
        self._serving_verdict(False, "")
        return line

    def fail(self, why: str) -> str:
        line = self._line("FAILED", why)
        switches.announce("error", line)
        _export(names.SELFTEST_RUNS, dict(self.labels, **{names.RESULT: "failed"}))
        _export(names.SELFTEST_FAILURES, self.labels)
        _export(names.CAPTURE_BROKEN, self.labels, gauge=1)
        if switches.selftest_raises() and self.trigger == STARTUP:  # nothing served yet: stop, as it always did
            raise RuntimeError(line + f" ({switches.ENV_SELFTEST}=raise)")
        self._serving_verdict(True, why.split("; the draft sees")[0])
        return line

    def _serving_verdict(self, failed: bool, why: str) -> None:
        """Raise mode, while serving: refuse new requests from now on when this rank or one it checked the forward
        with failed; serve again when all passed. Every rank comes here once per verdict (skips excepted, which
        fall alike on every rank), so the agreement's all-reduce matches."""
        global _refusal
        if not switches.selftest_raises() or self.trigger == STARTUP:
            return
        any_failed = self._agree(failed)
        if any_failed and _refusal is None:
            what = why if failed else "it failed on another rank of this forward"
            _refusal = (f"eagle3_capture: request refused: the capture self-test failed while serving (run "
                        f"{self.trigger}; {switches.ENV_SELFTEST}=raise): {what}; new requests are refused until "
                        "a self-test passes (e.g. after a weight reload)")
            switches.announce("error", f"eagle3_capture: refusing new requests from now on ({switches.ENV_SELFTEST}"
                                       "=raise): the capture self-test failed while serving; requests in flight "
                                       "finish; a passing self-test serves again")
        elif not any_failed and _refusal is not None:
            _refusal = None
            switches.announce("warning", "eagle3_capture: serving requests again: the capture self-test passed "
                                         f"(run {self.trigger}) after the failure that refused them")

    def _agree(self, failed: bool) -> bool:
        """Whether any rank whose embedding all-reduced with this one failed (every such rank checked this same
        forward): all of them then refuse the same requests. One all-reduce of one integer on their CPU group."""
        if _embedding_tp_size(self.model) <= 1:
            return failed
        group = _embedding_group(self.model)
        if group is None:
            return failed
        flag = torch.tensor([1 if failed else 0], dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
        return bool(flag.item())


def _embedding_group(model):
    """The CPU group of the ranks the embedding all-reduces over (attention TP with DP attention, else TP), or None
    where the release names it otherwise."""
    attn = bool(getattr(getattr(model, "embed_tokens", None), "use_attn_tp_group", False))
    for path in (internals.ATTN_TP_GROUP_PATHS if attn else internals.TP_GROUP_PATHS):
        get = internals.resolve(path)
        if get is not None:
            try:
                return get().cpu_group
            except Exception:  # not initialised: nothing to agree with
                return None
    return None


_export_broken = False


def _export(name: str, labels: dict, gauge=None) -> None:
    """One metric update; the exporter must never break the check (a failure is said once)."""
    global _export_broken
    try:
        if not exporter.enabled():
            return
        if gauge is None:
            exporter.inc(name, labels)
        else:
            exporter.set_gauge(name, labels, gauge)
    except Exception as e:
        if not _export_broken:
            _export_broken = True
            switches.announce("warning", f"eagle3_capture: the self-test's metrics are not exported "
                                         f"({type(e).__name__}: {e})")


__all__ = ["check", "due", "arm", "pending", "refusal", "reset", "weight_update_hook", "STARTUP", "rows_text"]
