"""The target side from the server's own residual stream: each prompt's teacher-forced request (prompt + served
continuation, sent by ``doctor online`` with an ``eagle3-doctor-`` rid) as the plugin dumped it.

The taps are read from the stream at the layer inputs the *draft* declares, never from the slots the server fed
its draft (``aux``): a server that captures the wrong layers would otherwise predict itself and "match". The served
slots go to the fingerprint (:mod:`.stream_match`).

:class:`StreamTarget` holds, per prompt, the token sequence, the greedy tokens and where the request's rows are;
:class:`DumpTarget` builds it from a recorded dump alone (``doctor accept --hidden-states``): the sequence is the
dumped request's token ids (the doctor sent prompt + the server's greedy continuation, so the target's greedy token
after position t is the token at t+1), matched to the prompts by prefix. A version-1 dump (no stream) can stand in
only where its served slots are labelled with the declared layer inputs, and the report says that this trusts the
server's own labels.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ... import configs
from ...dump_format.reader import DumpReader, RequestParts, capture_of, doctor_requests, v1_sequences
from ..common import DeploymentFinding, DoctorError
from .side import TargetBatch, TargetInfo, TargetSide, info_from_config

V1_TRUST = ("version-1 dump (no residual stream): the taps were read from the served slots, where the server's own "
            "layers_to_capture says they are the declared layer inputs; a capture wired wrong inside the server would "
            "predict itself -- the plugin's version-2 dump (EAGLE3_CAPTURE_DUMP_STREAM) removes that trust")
STREAM_HINT = ("restart the server with EAGLE3_CAPTURE_DUMP_STREAM=all (every layer input) or =declared with this "
               "draft")


@dataclass
class StreamedPrompt:
    seq: torch.Tensor          # [T] token ids: prompt + continuation, as far as known
    greedy: torch.Tensor       # [T] the target's greedy token after each position (-1: unknown)
    parts: RequestParts        # where the teacher-forced request's rows are in the dump
    forced: Optional[torch.Tensor] = None     # [T] a server's teacher-forced argmax after each position
    runner_up: Optional[torch.Tensor] = None  # [T] its second token (-1: unknown)
    gap: Optional[torch.Tensor] = None        # [T] float64: the logprob gap between the two (nan: unknown)


def taps_of(parts: RequestParts, wanted: List[int], rows: int, notes: List[str]) -> torch.Tensor:
    """[rows, K*H]: the stream at the layer inputs ``wanted`` over the request's first ``rows`` positions."""
    head = parts.parts[0][0]
    if head.version == 1:
        ltc = head.layers_to_capture or []
        absent = [i for i in wanted if i not in ltc]
        if absent:
            raise DoctorError(f"dump {head.path}: a version-1 record (no residual stream) whose served slots are "
                              f"layer inputs {ltc}; the draft declares {wanted}: the server does not capture the "
                              "declared taps, and the prediction cannot be made without its stream; "
                              + STREAM_HINT.replace("restart", "run the version-2 plugin and restart"))
        req = parts.load()
        H = req.aux.shape[1] // len(ltc)
        if V1_TRUST not in notes:
            notes.append(V1_TRUST)
        cols = torch.cat([req.aux[:, ltc.index(i) * H:(ltc.index(i) + 1) * H] for i in wanted], 1)
        return cols[:rows]
    if head.stream_layer_inputs is None:
        raise DoctorError(f"dump {head.path}: the doctor's request {parts.rid} has no residual stream (the plugin "
                          "dumps it for eagle3-doctor- requests: is the dump from an older plugin?)")
    absent = [i for i in wanted if i not in head.stream_layer_inputs]
    if absent:
        raise AnotherDeclaration(parts, wanted, absent)
    req = parts.load(layers=wanted, with_aux=False)
    if req.first_position != 0:
        raise DoctorError(f"dump {head.path}: request {parts.rid} starts at position {req.first_position}, not 0: "
                          "part of it came from the prefix cache (send it with logprob_start_len 0)")
    K, T, H = req.stream.shape
    return req.stream[:, :rows].permute(1, 0, 2).reshape(min(rows, T), K * H)


def _layer(i: int) -> str:
    return "Embedding" if i == 0 else f"LayerOutput({i - 1})"


def another_declaration(parts: RequestParts, wanted: List[int], absent: List[int],
                        holds: Optional[List[str]] = None) -> str:
    """The finding when the server's dumped stream lacks layers the draft declares: the server ran with another
    draft's declaration. Names both declarations and, with ``holds`` (what each served slot holds, from the
    fingerprint of its stream), what the server feeds its draft; without, the server's own labels."""
    head = parts.parts[0][0]
    server = head.declared or [_layer(i) for i in head.layers_to_capture or []]
    slots = ("; its served slots hold " + ", ".join(holds)) if holds else \
        f"; its served slots are labelled layer inputs {head.layers_to_capture}"
    return (f"dump {head.path}: the server runs another draft's declaration: the server declares {server}, the "
            f"draft given declares {[_layer(i) for i in wanted]}{slots}. The dumped stream holds layer inputs "
            f"{head.stream_layer_inputs}, not {absent}: for the full prediction, {STREAM_HINT}")


class AnotherDeclaration(DeploymentFinding):
    """The server's stream lacks layers the draft declares (a finding, exit 1); ``parts`` / ``wanted`` /
    ``absent`` let a command that can fingerprint the stream say what each served slot holds."""

    def __init__(self, parts: RequestParts, wanted: List[int], absent: List[int]):
        self.parts, self.wanted, self.absent = parts, wanted, absent
        super().__init__(another_declaration(parts, wanted, absent))


class StreamTarget(TargetSide):
    greedy_is_own = False  # True when the greedy tokens are the server's teacher-forced argmax, not the sequence's

    def __init__(self, source: str, info: TargetInfo, prompts: List[StreamedPrompt], tokenizer=None):
        super().__init__()
        self.source = source
        self._info = info
        self.streamed = prompts
        self.tokenizer = tokenizer

    @property
    def info(self) -> TargetInfo:
        return self._info

    def prompt_name(self, i: int) -> str:
        sp = self.streamed[i] if i < len(self.streamed) else None
        rid = sp.parts.rid if sp is not None else None
        return f"prompt {i}" + (f" (dumped request {rid})" if rid else "")

    def batch(self, prompts: Sequence[List[int]], members: List[int], continuation: int,
              wanted: List[int]) -> TargetBatch:
        P = len(prompts[members[0]])
        T = P + continuation
        seqs, greedy, rows = [], [], []
        for i in members:
            sp = self.streamed[i]
            if sp.seq.numel() < T:
                raise DoctorError(f"prompt {i}: the dumped request holds {sp.seq.numel()} tokens; the replay needs "
                                  f"{T} ({P} prompt + {continuation}: the new tokens and the draft steps past them)")
            unknown = (sp.greedy[P - 1:T] < 0).nonzero()
            if unknown.numel():
                raise DoctorError(f"prompt {i}: the target's greedy token after position {P - 1 + int(unknown[0])} is "
                                  f"not in the dumped request; the replay needs it after every position {P - 1} to "
                                  f"{T - 1} ({P} prompt + {continuation}: the new tokens and the draft steps past "
                                  "them)")
            seqs.append(sp.seq[:T])
            greedy.append(sp.greedy[:T])
            rows.append(taps_of(sp.parts, wanted, T, self.notes))
            if rows[-1].shape[0] < T:
                raise DoctorError(f"prompt {i}: the dump holds {rows[-1].shape[0]} rows of its teacher-forced "
                                  f"request, the replay needs {T}")
        seq, g = torch.stack(seqs), torch.stack(greedy)
        # a server's own tokens: its greedy token after t-1 (seq holds what the doctor sent)
        expected = torch.cat([seq[:, :1], g[:, :-1]], 1) if self.greedy_is_own else None
        return TargetBatch(list(members), P, seq, g, torch.stack(rows), expected)


def info_from_dump(parts: Sequence[RequestParts], where: str, checkpoint_config: Optional[dict] = None,
                   vocab_size: Optional[int] = None) -> TargetInfo:
    """The target's L, H, class from the dump's records, checked against the checkpoint's config when given."""
    recs = [p.parts[0][0] for p in parts]
    Ls = {r.num_layers for r in recs if r.num_layers is not None}
    Hs = {r.hidden_size for r in recs if r.hidden_size is not None}
    if len(Ls) > 1 or len(Hs) > 1:
        raise DoctorError(f"{where}: records from different models (num_layers {sorted(Ls)}, hidden_size "
                          f"{sorted(Hs)})")
    if (not Ls or not Hs) and checkpoint_config is None:
        v1 = any(r.version == 1 for r in recs)
        raise DoctorError(f"{where}: the records do not say the target's num_layers / hidden_size"
                          + (" (version-1 records never do)" if v1 else "")
                          + ": give --target-checkpoint, whose config.json says them")
    if not Ls or not Hs:  # version-1 records: the checkpoint's config says them (checked below against the rows)
        try:
            cfg = configs.read_target_config(checkpoint_config)
        except ValueError as e:
            raise DoctorError(f"--target-checkpoint config: {e}") from None
        Ls, Hs = Ls or {cfg.num_layers}, Hs or {cfg.hidden_size}
    L, H = Ls.pop(), Hs.pop()
    widths = {r.aux.shape[-1] // len(r.layers_to_capture) for r in recs
              if r.version == 1 and r.aux is not None and r.layers_to_capture}
    if widths and widths != {H}:
        raise DoctorError(f"{where}: the records' served slots are {sorted(widths)} wide; the target's hidden size "
                          f"is {H}: a dump from another model")
    cls = next((r.model_class for r in recs if r.model_class), None)
    if checkpoint_config is not None:
        try:
            cfg = configs.read_target_config(checkpoint_config)
        except ValueError as e:
            raise DoctorError(f"--target-checkpoint config: {e}") from None
        if (cfg.num_layers, cfg.hidden_size) != (L, H):
            raise DoctorError(f"{where}: the server's records are from a target with L={L}, H={H}; "
                              f"--target-checkpoint's config says L={cfg.num_layers}, H={cfg.hidden_size}: a dump "
                              "from another model")
        return info_from_config(cfg, vocab_size)
    d = {"num_hidden_layers": L, "hidden_size": H, "architectures": [cls] if cls else []}
    return info_from_config(configs.read_target_config(d), vocab_size)


def written_at(parts: RequestParts) -> float:
    """When the request's last record was written (its file's modification time): record names say nothing of the
    order of two servers' or two runs' records."""
    try:
        return max(os.path.getmtime(rec.path) for rec, _, _ in parts.parts)
    except OSError:  # removed since it was read: the oldest
        return 0.0


class DumpTarget(StreamTarget):
    """``doctor accept --hidden-states DUMP``: the doctor's teacher-forced requests of a recorded dump."""

    def __init__(self, path: str, checkpoint_config: Optional[dict] = None, vocab_size: Optional[int] = None,
                 tokenizer=None, flag: str = "--hidden-states"):
        self.flag = flag
        records = DumpReader(path).refresh()
        if not records:
            raise DoctorError(f"{flag} {path}: no dump records (eagle3_capture_pid*.pt) in it")
        reqs: List[RequestParts] = list(doctor_requests(records).values())
        self.version = 2
        if not reqs:
            reqs = v1_sequences(records)
            self.version = 1
            if not reqs:
                raise DoctorError(f"{flag} {path}: no teacher-forced request of the doctor in it (rid "
                                  "eagle3-doctor-...: `doctor online --server URL --dump DIR` sends them; the plugin "
                                  "dumps their residual stream)")
        self.requests = reqs
        info = info_from_dump(reqs, f"{flag} {path}", checkpoint_config, vocab_size)
        super().__init__(f"recorded dump {path}", info, [], tokenizer)
        self.path = path
        self.others: List[RequestParts] = []  # other writers' requests of the prompts (fingerprinted, not replayed)

    def _begin_with(self, i: int, p: List[int]) -> list:
        """The requests whose ids begin with prompt i, as (request, ids); DoctorError when there is none."""
        pt = torch.tensor(p, dtype=torch.int64)
        hits = [(r, x) for r, x in self._ids if x.numel() >= len(p) and torch.equal(x[:len(p)], pt)]
        if not hits:
            raise DoctorError(f"{self.flag} {self.path}: no dumped request of the doctor begins with prompt {i} "
                              f"({len(self.requests)} requests; first ids {p[:8]}): tokens that do not align "
                              "(another prompts file, or another tokenizer)")
        return hits

    @property
    def _ids(self) -> list:
        if not hasattr(self, "_ids_cache"):
            self._ids_cache = [(r, r.input_ids) for r in self.requests]
        return self._ids_cache

    def match(self, prompts: Sequence[List[int]], need: int) -> None:
        """Each prompt's request: the last-written one whose ids begin with the prompt and hold at least ``need``
        tokens after it (+1: the greedy token after the last position is the next token)."""
        out = []
        for i, p in enumerate(prompts):
            P = len(p)
            hits = self._begin_with(i, p)
            long = [(r, x) for r, x in hits if x.numel() >= P + need + 1]
            if not long:
                got = max(x.numel() for _, x in hits) - P
                raise DoctorError(f"{self.flag} {self.path}: prompt {i}'s dumped request holds {got} tokens "
                                  f"after the prompt; the replay needs {need + 1} (--new-tokens plus num-steps plus "
                                  "one); give fewer --new-tokens")
            captures = {capture_of(q.parts[0][0]) for q, _ in long}
            if len(captures) > 1:  # replicas (or runs) that capture differently: one must not hide another
                def said(q):
                    ltc, declared = capture_of(q.parts[0][0])
                    return f"writer {q.writer} (rid {q.rid}): layer inputs {list(ltc or [])}, declared {declared}"
                raise DeploymentFinding(
                    f"{self.flag} {self.path}: prompt {i} was dumped by servers that capture differently ("
                    + "; ".join(said(q) for q, _ in long[:4])
                    + "): a verdict from one would hide the others; give each server its own EAGLE3_CAPTURE_DUMP "
                    "directory, or remove the other server's records")
            r, x = max(long, key=lambda rx: written_at(rx[0]))
            if len(long) > 1:  # several doctor runs (or prompts sharing a beginning): say which one is read
                writers = sorted({q.writer for q, _ in long if q.writer is not None})
                self.notes.append(f"prompt {i}: {len(long)} dumped requests begin with it (several doctor runs"
                                  + (f", by {len(writers)} writers: {', '.join(writers[:4])}" if len(writers) > 1
                                     else "") + f"?); the newest written is used (rid {r.rid}, "
                                  f"{os.path.basename(r.parts[-1][0].path)})"
                                  + ("; the others' slots are fingerprinted too" if len(writers) > 1 else ""))
                self.others += [q for q, _ in long if q is not r and q.writer != r.writer]
            greedy = torch.full_like(x, -1)
            greedy[P - 1:-1] = x[P:]  # the continuation is the target's greedy one: its next token
            out.append(StreamedPrompt(x, greedy, r))
        self.streamed = out

    def available_new_tokens(self, prompts: Sequence[List[int]], steps: int) -> int:
        """The most new tokens every prompt's dumped request can replay."""
        return min(max(x.numel() for _, x in self._begin_with(i, p)) - len(p) - steps - 1
                   for i, p in enumerate(prompts))

    def batches(self, prompts, continuation, taps, batch_size, progress=False, desc="target"):
        self.match(prompts, continuation)
        return super().batches(prompts, continuation, taps, batch_size, progress, desc)


__all__ = ["StreamedPrompt", "StreamTarget", "DumpTarget", "info_from_dump", "taps_of", "V1_TRUST"]
