"""The fingerprint against SpecForge's training data: does the server capture what training used, slot by slot, and
which layer was each training slot (the ``[2, 30, 58]`` question: LayerOutput(2, 30, 58) from SpecForge's HF
backend, or LayerOutput(1, 29, 57) from its SGLang backend and from SGLang serving)?

On the same token ids: each training sample's ids are (or were) sent to the server as one of the doctor's
teacher-forced requests, whose rows the plugin dumps with the residual stream. Per sample, the training slots
against the served slots (``aux``) and, with a full-stream dump, against every layer input. A bf16 training capture
and a server's capture of the same tap are not bit-equal; :mod:`.stream_match` says ``ambiguous`` where the best
layer does not beat the next by more than that noise.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ...dump_format.contract import DOCTOR_RID_PREFIX
from ...dump_format.reader import (DumpReader, RequestParts, by_rid, capture_of, doctor_requests, one_writer,
                                   v1_sequences)
from ...pipelines import HF_READING, SGLANG_READING, Readings, readings_of
from ..bad_rows import BLAME, BadRows, grouped, summary
from ..common import DeploymentFinding, DoctorError
from ..sglang_model.http import post_json
from ..sglang_model.request_guard import RequestLimits, check_request
from ..target_side.training_data import TrainingSample, load_sample, training_files
from .stream_match import SlotMatch, StreamMatcher, layer_name, render_matches


@dataclass
class TrainingFingerprint:
    L: int
    samples: int
    tokens: int
    served: Optional[List[int]]
    vs_served: List[SlotMatch]
    vs_stream: List[SlotMatch] = field(default_factory=list)
    stream_layers: Optional[List[int]] = None
    readings: Optional[Readings] = None
    notes: List[str] = field(default_factory=list)
    bad_rows: List[BadRows] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The server captures what training used, and no row of either was bad data."""
        return self.same_as_served and not self.bad_rows

    @property
    def same_as_served(self) -> bool:
        return len(self.vs_served) == len(self.served or []) and all(
            m.verdict in ("exact", "clear") and m.best == m.slot for m in self.vs_served)

    @property
    def training_layers(self) -> Optional[List[int]]:
        if not self.vs_stream or any(m.verdict not in ("exact", "clear") for m in self.vs_stream):
            return None
        return [m.best for m in self.vs_stream]

    def reading(self) -> Optional[str]:
        """Which pipeline's reading of the draft ids the training data holds."""
        got, r = self.training_layers, self.readings
        if got is None or r is None:
            return None
        names = [name for name, inputs in ((HF_READING, r.hf), (SGLANG_READING, r.sglang)) if inputs == got]
        return " and ".join(names) if names else "neither common reading"

    def lines(self) -> List[str]:
        L = self.L
        out = [f"training data against the server: {self.samples} sample(s), {self.tokens} tokens, the same ids",
               "", "each training slot against the slots the server feeds its draft (layer inputs "
               f"{self.served}):"]
        out += ["  " + ln for ln in render_matches(self.vs_served, L, "training", lambda j: f"served slot {j}")]
        verdict = ("the server captures what training used, slot by slot" if self.same_as_served else
                   "the server does NOT capture what training used")
        if self.bad_rows:
            out += [f"  bad rows: {b.line()}" for b in grouped(self.bad_rows)]
            verdict = f"bad data: {summary(self.bad_rows)} -- {BLAME}; on the other rows, {verdict}"
        out += ["", f"verdict: {verdict}"]
        if self.vs_stream:
            out += ["", f"each training slot against the server's residual stream ({len(self.stream_layers)} layer "
                        "inputs):"]
            out += ["  " + ln for ln in render_matches(self.vs_stream, L, "training")]
            got = self.training_layers
            if got is not None:
                out.append(f"training used {[layer_name(i, L) for i in got]} (layer inputs {got})")
                r = self.reading()
                if r is not None:
                    out.append(f"the draft ids {self.readings.ids} mean that as read by {r} (SpecForge-HF reading: "
                               f"layer inputs {self.readings.hf}; SpecForge-SGLang / SGLang reading: "
                               f"{self.readings.sglang})")
            else:
                out.append("which layer some training slot was is ambiguous at this noise: give more samples or "
                           "tokens")
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_json(self) -> dict:
        r = self.readings
        return {"num_layers": self.L, "samples": self.samples, "tokens": self.tokens,
                "served_layer_inputs": self.served, "same_as_served": self.same_as_served,
                "vs_served": [m.to_json(None) for m in self.vs_served],
                "vs_stream": [m.to_json(self.L) for m in self.vs_stream], "stream_layer_inputs": self.stream_layers,
                "training_layer_inputs": self.training_layers, "reading": self.reading(),
                "readings": None if r is None else {"ids": r.ids, "hf": r.hf, "sglang": r.sglang},
                "bad_rows": [b.to_json() for b in self.bad_rows], "notes": self.notes}


def send_samples(url: str, samples: Sequence[TrainingSample], timeout: float, post=post_json,
                 limits: Optional[RequestLimits] = None) -> List[str]:
    """Each sample's ids as one of the doctor's teacher-forced requests (the plugin dumps their stream); ``post``:
    the HTTP client (a test hands in a stand-in for the server). Every sample is checked against ``limits`` (the
    target's vocabulary, the server's context) before the first is sent; without limits nothing is sent."""
    for s in samples:
        check_request(s.input_ids.tolist(), 1, limits or RequestLimits(None), f"--training-data {s.path}")
    run = uuid.uuid4().hex[:12]
    rids = []
    for i, s in enumerate(samples):
        rid = f"{DOCTOR_RID_PREFIX}{run}-t{i}"
        post(url.rstrip("/") + "/generate", {
            "input_ids": s.input_ids.tolist(), "rid": rid,
            "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0}, timeout)
        rids.append(rid)
    return rids


def _request_for(sample: TrainingSample, reqs: Sequence[RequestParts], where: str) -> RequestParts:
    ids = sample.input_ids
    hits = [r for r in reversed(list(reqs))  # the last written first
            if r.input_ids.numel() >= ids.numel() and torch.equal(r.input_ids[:ids.numel()], ids)]
    captures = {capture_of(r.parts[0][0]) for r in hits}
    if len(captures) > 1:  # replicas sharing the directory: one must not hide another
        shown = "; ".join(f"writer {r.writer}: layer inputs {capture_of(r.parts[0][0])[0]}, declared "
                          f"{capture_of(r.parts[0][0])[1]}" for r in hits[:4])
        raise DeploymentFinding(f"{where}: the token ids of {sample.path} were dumped by {len(hits)} requests of "
                                f"servers that capture differently ({shown}): a verdict from one would hide the "
                                "others; give each server its own EAGLE3_CAPTURE_DUMP directory")
    if hits:
        return hits[0]
    raise DoctorError(f"{where}: no dumped request holds the token ids of {sample.path} ({ids.numel()} tokens, first "
                      f"{ids[:8].tolist()}): tokens that do not align (send them with --server URL, or dump the "
                      "server while it processes these samples)")


def _found(sample: TrainingSample, reqs: Sequence[RequestParts]) -> bool:
    ids = sample.input_ids
    return any(r.input_ids.numel() >= ids.numel() and torch.equal(r.input_ids[:ids.numel()], ids) for r in reqs)


def _refuse_unusable(vs_served: StreamMatcher, samples, where: str) -> None:
    """Bad input when either side holds no usable row at all: every training row, or every served row, bad."""
    t = list(vs_served.slot_tally.items.values())
    if all(b.nonfinite + vs_served.slot_zero.get(k, 0) >= b.total for k, b in enumerate(t)):
        first = next((b.first for b in t if b.first), "row 0")
        raise DoctorError(f"--training-data: every row of its {len(samples)} sample(s) holds NaN, Inf or zeros "
                          f"(first: {first}): nothing to compare the server with -- {BLAME}")
    if not vs_served.entries_usable():
        raise DoctorError(f"{where}: every served row of the training samples' requests is NaN, Inf or zero: "
                          f"nothing to compare the training data with -- {BLAME}")


def load_samples(path: str, count: int, max_tokens: int, H: Optional[int] = None) -> List[TrainingSample]:
    files = training_files(path)[:count]
    out = []
    for f in files:
        s = load_sample(f, H)
        if s.tokens > max_tokens:
            s = TrainingSample(s.path, s.input_ids[:max_tokens], None if s.loss_mask is None else
                               s.loss_mask[:max_tokens], s.aux[:max_tokens],
                               None if s.hidden_state is None else s.hidden_state[:max_tokens])
        out.append(s)
    return out


def training_fingerprint(samples: Sequence[TrainingSample], dump_dir: str, rids: Optional[List[str]] = None,
                         draft_ids: Optional[List[int]] = None, timeout: float = 60.0, min_cos: float = 0.95
                         ) -> TrainingFingerprint:
    """Every training sample against the server's dump of the same ids."""
    import time

    reader = DumpReader(dump_dir)
    deadline = time.time() + (timeout if rids else 0)
    while True:
        records = reader.refresh()
        requests = doctor_requests(records)
        written: Dict[str, List[RequestParts]] = by_rid(requests)
        reqs = ([one_writer(r, written[r], f"--captured {dump_dir}") for r in rids if r in written] if rids
                else list(requests.values()))
        if rids is not None and len(reqs) == len(rids) and all(
                q.input_ids.numel() >= s.tokens for q, s in zip(reqs, samples)):
            break
        if not written:  # a version-1 dump: no request ids, the samples found by their token ids
            v1 = v1_sequences(records)
            if rids is None or all(_found(s, v1) for s in samples):
                reqs = v1
                break
        if rids is None or time.time() > deadline:
            break
        time.sleep(0.5)
    where = f"--captured {dump_dir}"
    if not reqs:
        raise DoctorError(f"{where}: no request of the doctor in it (is it the server's EAGLE3_CAPTURE_DUMP "
                          "directory, and is the plugin's dump on?)")
    first = reqs[0].parts[0][0]
    L, H = first.num_layers, first.hidden_size
    vs_served = vs_stream = None
    served = stream_layers = None
    tokens = 0
    notes: List[str] = []
    for s in samples:
        parts = _request_for(s, reqs, where)
        req = parts.load()
        n = s.tokens
        if H is None:
            H = req.aux.shape[1] // len(req.layers_to_capture)
        if s.aux.shape[1] % H:
            raise DoctorError(f"--training-data {s.path}: aux_hidden_state is {s.aux.shape[1]} wide, not a multiple "
                              f"of the server's hidden size {H}: training data of another model")
        Kt = s.aux.shape[1] // H
        if draft_ids is not None and Kt != len(draft_ids):
            raise DoctorError(f"--training-data {s.path}: aux_hidden_state holds {Kt} slots of {H}, but the draft "
                              f"(--draft-config) declares {len(draft_ids)} taps {list(draft_ids)}: training data of "
                              "another draft")
        if vs_served is not None and Kt != vs_served.K:
            raise DoctorError(f"--training-data {s.path}: aux_hidden_state holds {Kt} slots of {H}, the samples "
                              f"before it {vs_served.K}: samples of two different captures")
        if req.aux is None:
            raise DoctorError(f"{where}: the request holding {s.path}'s ids has no served slots (aux)")
        Ks = req.aux.shape[1] // H
        if Ks != Kt and not any(n.startswith("the training samples hold") for n in notes):
            notes.append(f"the training samples hold {Kt} slots, the server serves {Ks}: the server's draft cannot "
                         "be the one trained on this data")
        served = req.layers_to_capture
        slots = req.aux[:n].reshape(n, Ks, H).permute(1, 0, 2)
        name = (lambda k: f"training slot {k}")
        # a served slot holding the embedding output may have a zero row where training's has one too
        vs_served = vs_served or StreamMatcher(Kt, H, zero_ok=[j for j, li in enumerate(served or []) if li == 0],
                                               slot_name=name, entry_name=lambda j: f"served slot {j}")
        where, pos = f"sample {os.path.basename(s.path)}", torch.arange(n)
        vs_served.add(s.aux, slots, list(range(Ks)), where, pos)
        if req.stream is not None:
            vs_stream = vs_stream or StreamMatcher(Kt, H, slot_name=name)
            vs_stream.add(s.aux, req.stream[:, :n], req.stream_layer_inputs, where, pos)
            stream_layers = req.stream_layer_inputs
        tokens += n
        del req
    if vs_stream is None:
        notes.append("the dump has no residual stream: which layer each training slot was cannot be named (a "
                     "version-2 dump with EAGLE3_CAPTURE_DUMP_STREAM=all can)")
    _refuse_unusable(vs_served, samples, where)
    m_served = vs_served.matches(min_cos=min_cos, expected=list(range(vs_served.K)))
    m_stream = [] if vs_stream is None else vs_stream.matches(min_cos=min_cos)
    bad = vs_served.bad_rows(m_served)
    if vs_stream is not None:  # the training slots' own bad rows are counted once, against the served slots
        bad += vs_stream.entry_tally.bad()
    fp = TrainingFingerprint(L or 0, len(samples), tokens, served, m_served, m_stream, stream_layers, None, notes,
                             bad)
    if draft_ids is not None and L:
        fp.readings = readings_of(draft_ids, L, H)
    return fp


__all__ = ["TrainingFingerprint", "send_samples", "load_samples", "training_fingerprint"]
