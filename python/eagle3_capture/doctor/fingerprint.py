"""Fingerprinting captured slots against reference hidden states.

The reference (``doctor dump-reference``) holds, for some tokens, every residual-stream value of the target as the
training side computed it: the HF ``hidden_states`` stack (index h: 0 = embedding output, h = k+1 = output of
layer k; the last entry h = L is post-final-norm in most models) plus the final boundary LayerOutput(L-1) taken
before the final norm. The captured file holds what a server packed for the same tokens: ``aux`` [T, K*H].

For every slot and every reference column the table gives the mean over tokens of the cosine similarity; the
column a slot matches names the tap the server really captured, whatever its config says. A one-layer shift
costs only about 0.1 accept length on real drafts, invisible in acceptance alone; here it is a different column.

File formats read:

* reference: safetensors with ``hidden_states`` [L+1, T, H], ``final_prenorm`` [T, H], ``input_ids`` [T]
  (+ ``positions``, ``prompt_offsets``), metadata ``format`` = ``eagle3-capture-reference/1``, ``num_layers``,
  ``hidden_size``.
* captured: the SGLang plugin's dump (``EAGLE3_CAPTURE_DUMP=<dir>``: ``eagle3_capture_pid*_*.pt``, a dict with
  ``aux``, ``input_ids``, ``positions``, ``draft_ids``, ``layers_to_capture``, ``num_layers``, ``hidden_size``),
  a directory of such dumps, or a safetensors file with ``aux`` [T, K*H] and ``input_ids`` [T] (metadata
  ``layers_to_capture`` / ``draft_ids`` as JSON lists, optional).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..spec import EMBEDDING, Finding, LayerOutput, TapError, TapSpec, compare_taps
from .common import DoctorError, fmt_table, load_safetensors, meta_json

REFERENCE_FORMAT = "eagle3-capture-reference/1"
CAPTURE_FORMAT = "eagle3-capture-captured/1"
POST_NORM = "post-norm"

DEFAULT_MIN_COS = 0.95     # below this, a slot matches nothing in the reference
DEFAULT_AMBIGUOUS = 0.005  # best - second best below this: the match is not trustworthy


# ----------------------------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Reference:
    columns: List[object]          # canonical taps, plus POST_NORM for HF's post-norm last entry
    labels: List[str]
    values: torch.Tensor           # [C, T, H] float32
    input_ids: torch.Tensor        # [T]
    positions: Optional[torch.Tensor]
    num_layers: int
    hidden_size: int
    path: str


@dataclass
class Captured:
    aux: torch.Tensor              # [T, K*H]
    input_ids: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]
    layers_to_capture: Optional[List[int]]
    draft_ids: Optional[List[int]]
    num_layers: Optional[int]
    hidden_size: Optional[int]
    path: str


def column_label(c, L: int) -> str:
    if c == POST_NORM:
        return f"hs[{L}] post-norm"
    if c == EMBEDDING:
        return "hs[0] Embedding"
    if c.k == L - 1:
        return f"LayerOutput({c.k}) pre-norm"
    return f"hs[{c.k + 1}] LayerOutput({c.k})"


def short_label(c, L: int) -> str:
    if c == POST_NORM:
        return f"hs{L}post"
    if c == EMBEDDING:
        return "Emb"
    return f"LO{c.k}"


def load_reference(path: str) -> Reference:
    t, meta = load_safetensors(path, "reference")
    what = f"reference {path}"
    for key in ("hidden_states", "input_ids"):
        if key not in t:
            raise DoctorError(f"{what}: no '{key}' tensor (expected a file written by `eagle3-capture doctor "
                              f"dump-reference`; it has {sorted(t)})")
    hs = t["hidden_states"]
    if hs.dim() != 3:
        raise DoctorError(f"{what}: hidden_states must be [L+1, T, H], got shape {tuple(hs.shape)}")
    L = hs.shape[0] - 1
    if L < 1:
        raise DoctorError(f"{what}: hidden_states has {hs.shape[0]} entries; at least 2 (embedding + one layer)")
    T, H = hs.shape[1], hs.shape[2]
    ids = t["input_ids"].reshape(-1).to(torch.int64)
    if ids.numel() != T:
        raise DoctorError(f"{what}: input_ids has {ids.numel()} tokens but hidden_states has T={T}")
    n_meta = meta_json(meta, "num_layers", what)
    if n_meta is not None and int(n_meta) != L:
        raise DoctorError(f"{what}: metadata num_layers={n_meta} but hidden_states has L+1={L + 1} entries")
    cols: List[object] = [EMBEDDING] + [LayerOutput(k) for k in range(L - 1)]
    vals = [hs[h] for h in range(L)]
    pre = t.get("final_prenorm")
    if pre is not None:
        if tuple(pre.shape) != (T, H):
            raise DoctorError(f"{what}: final_prenorm must be [T, H] = {(T, H)}, got {tuple(pre.shape)}")
        cols.append(LayerOutput(L - 1))
        vals.append(pre)
        if not torch.equal(pre, hs[L]):
            cols.append(POST_NORM)
            vals.append(hs[L])
    else:
        cols.append(POST_NORM)
        vals.append(hs[L])
    pos = t.get("positions")
    return Reference(cols, [column_label(c, L) for c in cols], torch.stack(vals).float(), ids,
                     None if pos is None else pos.reshape(-1).to(torch.int64), L, H, path)


def _captured_from_dict(d: dict, path: str) -> Captured:
    what = f"captured {path}"
    aux = d.get("aux")
    if not isinstance(aux, torch.Tensor):
        raise DoctorError(f"{what}: no 'aux' tensor (the packed [T, K*H] capture)")
    if aux.dim() != 2:
        raise DoctorError(f"{what}: aux must be [T, K*H], got shape {tuple(aux.shape)}")

    def ints(key):
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, torch.Tensor):
            v = v.reshape(-1).tolist()
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
            raise DoctorError(f"{what}: '{key}' must be a list of integers, got {v!r}")
        return list(v)

    def tensor(key):
        v = d.get(key)
        return None if v is None else torch.as_tensor(v).reshape(-1).to(torch.int64)

    def opt_int(key):
        v = d.get(key)
        return None if v is None else int(v)

    return Captured(aux.float(), tensor("input_ids"), tensor("positions"), ints("layers_to_capture"),
                    ints("draft_ids"), opt_int("num_layers"), opt_int("hidden_size"), path)


def load_captured(path: str) -> List[Captured]:
    """One record per file (a directory: every ``*.pt`` / ``*.safetensors`` in it, in name order)."""
    from .common import require_file

    require_file(path, "captured", allow_dir=True)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.pt")) + glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise DoctorError(f"captured {path}: directory has no *.pt or *.safetensors capture dump")
    else:
        files = [path]
    out = []
    for f in files:
        if f.endswith(".safetensors"):
            t, meta = load_safetensors(f, "captured")
            d = dict(t)
            for key in ("layers_to_capture", "draft_ids", "num_layers", "hidden_size"):
                if key in meta:
                    d[key] = meta_json(meta, key, f"captured {f}")
            out.append(_captured_from_dict(d, f))
        else:
            try:
                d = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # pickle / zip errors come in many types
                raise DoctorError(f"captured {f}: not a readable capture dump (torch.load: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''})") from None
            if not isinstance(d, dict):
                raise DoctorError(f"captured {f}: expected the plugin's dump (a dict), got {type(d).__name__}")
            out.append(_captured_from_dict(d, f))
    return out


def save_captured(path: str, aux: torch.Tensor, input_ids: torch.Tensor, *, layers_to_capture=None,
                  draft_ids=None, num_layers=None, hidden_size=None, source: str = "") -> None:
    from .common import save_safetensors

    meta = {"format": CAPTURE_FORMAT, "source": source}
    for k, v in (("layers_to_capture", layers_to_capture), ("draft_ids", draft_ids), ("num_layers", num_layers),
                 ("hidden_size", hidden_size)):
        if v is not None:
            meta[k] = v
    save_safetensors(path, {"aux": aux, "input_ids": input_ids.to(torch.int64)}, meta)


# ----------------------------------------------------------------------------------------------------------------
# alignment and the table
# ----------------------------------------------------------------------------------------------------------------

def _align(ref: Reference, cap: Captured) -> Tuple[int, str]:
    """Start row in the reference of the captured rows, or DoctorError."""
    Tc, T = cap.aux.shape[0], ref.values.shape[1]
    if cap.input_ids is None:
        if Tc != T:
            raise DoctorError(f"captured {cap.path}: mismatched token counts: it has T={Tc} rows and no input_ids, "
                              f"the reference {ref.path} has T={T} tokens; without token ids the rows must be the "
                              "same tokens")
        return 0, "no input_ids in the capture: rows assumed to be the reference's tokens"
    if cap.input_ids.numel() != Tc:
        raise DoctorError(f"captured {cap.path}: input_ids has {cap.input_ids.numel()} tokens but aux has {Tc} rows")
    if Tc == 0:
        raise DoctorError(f"captured {cap.path}: no rows")
    if Tc > T:
        raise DoctorError(f"captured {cap.path}: mismatched token counts: {Tc} captured tokens, but the reference "
                          f"{ref.path} has only {T}; dump the reference for the same prompts")
    r, c = ref.input_ids, cap.input_ids
    starts = [s for s in range(T - Tc + 1) if torch.equal(r[s:s + Tc], c)]
    if not starts:
        same_len = " (same count, different tokens)" if Tc == T else ""
        raise DoctorError(f"captured {cap.path}: its {Tc} tokens{same_len} do not occur as a run in the reference's "
                          f"{T} tokens (first captured ids {c[:8].tolist()}, first reference ids "
                          f"{r[:8].tolist()}); dump the reference for the prompts the server captured")
    if len(starts) > 1 and cap.positions is not None and ref.positions is not None:
        exact = [s for s in starts if torch.equal(ref.positions[s:s + Tc], cap.positions)]
        starts = exact or starts
    note = "" if starts[0] == 0 and Tc == T else f"rows {starts[0]}..{starts[0] + Tc - 1} of the reference"
    return starts[0], note


def _cos_table(ref_vals: torch.Tensor, aux: torch.Tensor, H: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sum of cosines [K, C], rows counted [K, C]) over rows where both vectors are non-zero."""
    T = aux.shape[0]
    K = aux.shape[1] // H
    slots = aux.reshape(T, K, H).transpose(0, 1)                          # [K, T, H]
    sn = slots / slots.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    rn = ref_vals / ref_vals.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # [C, T, H]
    cos = torch.einsum("kth,cth->kct", sn.double(), rn.double())          # [K, C, T]
    valid = (slots.norm(dim=-1) > 0)[:, None, :] & (ref_vals.norm(dim=-1) > 0)[None, :, :]
    cos = torch.where(valid, cos, torch.zeros_like(cos))
    return cos.sum(-1), valid.sum(-1).double()


@dataclass
class SlotMatch:
    slot: int
    best: int
    best_cos: float
    second: int
    second_cos: float
    declared: Optional[int]
    declared_cos: Optional[float]


@dataclass
class FingerprintResult:
    reference: Reference
    cos: torch.Tensor              # [K, C] mean cosine
    rows: int
    records: List[str]
    notes: List[str]
    declared: Optional[TapSpec]
    declared_source: str
    served: Optional[List[object]]  # what the dump says the server meant to capture
    matches: List[SlotMatch]
    findings: List[Finding] = field(default_factory=list)
    min_cos: float = DEFAULT_MIN_COS

    @property
    def K(self) -> int:
        return self.cos.shape[0]

    @property
    def matched(self) -> List[object]:
        return [self.reference.columns[m.best] if m.best_cos >= self.min_cos else None for m in self.matches]

    def to_json(self) -> dict:
        ref = self.reference
        return {
            "reference": ref.path, "records": self.records, "rows": self.rows, "notes": self.notes,
            "columns": ref.labels, "cos": [[round(float(v), 6) for v in row] for row in self.cos],
            "declared": None if self.declared is None else [repr(t) for t in self.declared.taps],
            "declared_source": self.declared_source,
            "served": None if self.served is None else [repr(t) for t in self.served],
            "slots": [{"slot": m.slot, "matches": ref.labels[m.best], "cos": m.best_cos,
                       "next_best": ref.labels[m.second], "next_cos": m.second_cos,
                       "declared": None if m.declared is None else ref.labels[m.declared],
                       "declared_cos": m.declared_cos,
                       "ok": m.declared is not None and m.best == m.declared and m.best_cos >= self.min_cos}
                      for m in self.matches],
            "findings": [f.__dict__ for f in self.findings],
        }


def _declared_from_record(cap: Captured, L: int, H: int) -> Tuple[Optional[TapSpec], Optional[List[object]], str]:
    """(declared taps from the dump's draft ids, taps the server meant from layers_to_capture, source text)."""
    declared, served, src = None, None, ""
    if cap.draft_ids is not None:
        try:
            declared = TapSpec.from_draft_ids(cap.draft_ids, L, H)
            src = f"draft ids {cap.draft_ids} recorded in the capture dump"
        except TapError as e:
            src = f"draft ids {cap.draft_ids} in the dump are not a valid tap set ({e})"
    if cap.layers_to_capture is not None:
        served = [EMBEDDING if i == 0 else LayerOutput(i - 1) for i in cap.layers_to_capture if 0 <= i <= L]
    return declared, served, src


def fingerprint(reference: str, captured: str, declared: Optional[TapSpec] = None, declared_source: str = "",
                min_cos: float = DEFAULT_MIN_COS, ambiguous: float = DEFAULT_AMBIGUOUS) -> FingerprintResult:
    ref = load_reference(reference)
    caps = load_captured(captured)
    L, H = ref.num_layers, ref.hidden_size
    K = None
    total = None
    count = None
    records, notes = [], []
    skipped = []
    served = None
    for cap in caps:
        W = cap.aux.shape[1]
        if W % H:
            raise DoctorError(f"captured {cap.path}: aux width {W} is not a multiple of the reference's hidden size "
                              f"H={H} (K*H expected): a capture from another model?")
        if cap.hidden_size is not None and cap.hidden_size != H:
            raise DoctorError(f"captured {cap.path}: recorded hidden_size {cap.hidden_size}, the reference has H={H}")
        if cap.num_layers is not None and cap.num_layers != L:
            raise DoctorError(f"captured {cap.path}: recorded num_layers {cap.num_layers}, the reference has L={L}")
        if K is not None and W // H != K:
            raise DoctorError(f"captured {cap.path}: K={W // H} slots, earlier records have K={K}")
        try:
            start, note = _align(ref, cap)
        except DoctorError as e:
            if len(caps) == 1:
                raise
            skipped.append(f"{os.path.basename(cap.path)}: {e}")
            continue
        K = W // H
        if note:
            notes.append(f"{os.path.basename(cap.path)}: {note}")
        s, n = _cos_table(ref.values[:, start:start + cap.aux.shape[0]], cap.aux, H)
        total = s if total is None else total + s
        count = n if count is None else count + n
        records.append(cap.path)
        if declared is None:
            d, sv, src = _declared_from_record(cap, L, H)
            if d is not None:
                declared, declared_source = d, src
            elif src and not declared_source:
                notes.append(src)
            served = served or sv
        elif served is None:
            served = _declared_from_record(cap, L, H)[1]
    if total is None:
        raise DoctorError(f"captured {captured}: none of its {len(caps)} dumps matches the reference's tokens: "
                          + "; ".join(skipped[:3]))
    if skipped:
        notes.append(f"{len(skipped)} dump(s) skipped (tokens not in the reference)")
    cos = (total / count.clamp_min(1)).float()
    matches = []
    dcols = None
    if declared is not None:
        if declared.hidden_size != H or declared.num_layers != L:
            raise DoctorError(f"declared taps are for L={declared.num_layers}, H={declared.hidden_size}; the "
                              f"reference has L={L}, H={H}")
        missing = [t for t in declared.taps if t not in ref.columns]
        if missing:
            raise DoctorError(f"declared taps {missing} have no column in the reference {ref.path} (a reference "
                              "without final_prenorm cannot show the final boundary; dump it with doctor "
                              "dump-reference)")
        dcols = [ref.columns.index(t) for t in declared.taps]
    for s in range(K):
        order = torch.argsort(cos[s], descending=True).tolist()
        best, second = order[0], order[1] if len(order) > 1 else order[0]
        dc = dcols[s] if dcols is not None and s < len(dcols) else None
        matches.append(SlotMatch(s, best, float(cos[s, best]), second, float(cos[s, second]), dc,
                                 None if dc is None else float(cos[s, dc])))
    res = FingerprintResult(ref, cos, int(count.max()), records, notes, declared, declared_source, served, matches,
                            min_cos=min_cos)
    res.findings = _findings(res, ambiguous)
    return res


def _findings(res: FingerprintResult, ambiguous: float) -> List[Finding]:
    ref, out = res.reference, []
    labels = ref.labels
    for m in res.matches:
        if m.best_cos < res.min_cos:
            out.append(Finding("error", "fingerprint-no-match",
                               f"captured slot {m.slot} matches no reference index (best {labels[m.best]} at cos "
                               f"{m.best_cos:.3f} < {res.min_cos}): not a hidden state of this model for these "
                               "tokens",
                               "check that the reference was dumped from the served weights for the same token ids"))
        elif m.best_cos - m.second_cos < ambiguous:
            out.append(Finding("warning", "fingerprint-ambiguous",
                               f"captured slot {m.slot}: {labels[m.best]} (cos {m.best_cos:.4f}) and "
                               f"{labels[m.second]} (cos {m.second_cos:.4f}) are too close to tell apart",
                               "use more or longer prompts for the reference and the capture"))
        if ref.columns[m.best] == POST_NORM and m.best_cos >= res.min_cos:
            out.append(Finding("error", "fingerprint-post-norm",
                               f"captured slot {m.slot} holds the final norm's output (HF hidden_states[{ref.num_layers}]), "
                               "not a residual-stream tap",
                               f"capture LayerOutput({ref.num_layers - 1}) before the final norm"))
    if res.declared is None:
        out.append(Finding("info", "fingerprint-undeclared",
                           "no declared taps (no --draft-config/--taps and no draft ids in the dump): matches are "
                           "reported without a verdict"))
        return out
    matched = res.matched
    if any(t is None or t == POST_NORM for t in matched):
        if len(matched) != res.declared.K:
            out.append(Finding("error", "count-mismatch",
                               f"{len(matched)} slots captured, the draft declares K={res.declared.K}"))
        return out
    for f in compare_taps(res.declared, matched,
                          fix=f"capture {list(res.declared.taps)} = draft ids {res.declared.to_draft_ids()}"):
        out.append(Finding(f.severity, "fingerprint-" + f.code, "measured: " + f.message, f.fix))
    return out


def render(res: FingerprintResult, *, max_cols: int = 24) -> str:
    """The cosine table (slots x reference indices) and a verdict per slot."""
    ref = res.reference
    C = len(ref.columns)
    cols = list(range(C))
    if C > max_cols:  # keep the columns that matter: per slot its best, second and declared
        keep = sorted({i for m in res.matches for i in (m.best, m.second, m.declared) if i is not None})
        cols = keep
    lines = [f"fingerprint: {len(res.records)} capture record(s), {res.rows} token rows, reference {ref.path} "
             f"(L={ref.num_layers}, H={ref.hidden_size})"]
    lines += [f"  note: {n}" for n in res.notes]
    L = ref.num_layers
    header = ["slot"] + [short_label(ref.columns[c], L) for c in cols]
    rows = []
    for m in res.matches:
        row = [str(m.slot)]
        for c in cols:
            v = float(res.cos[m.slot, c])
            mark = "*" if c == m.best else ("d" if c == m.declared else " ")
            row.append(f"{v:.3f}{mark}")
        rows.append(row)
    lines.append(f"cosine similarity, mean over tokens (* best match, d declared; Emb = hidden_states[0], LOk = "
                 f"LayerOutput(k) = hidden_states[k+1], LO{L - 1} taken before the final norm"
                 + (f", hs{L}post = HF's last entry, after it" if POST_NORM in ref.columns else "") + "):")
    lines.append(fmt_table(rows, header))
    vrows = []
    for m in res.matches:
        dec = "-" if m.declared is None else ref.labels[m.declared]
        ok = (m.declared is not None and m.best == m.declared and m.best_cos >= res.min_cos)
        verdict = "ok" if ok else ("?" if m.declared is None else "MISMATCH")
        served = "-"
        if res.served is not None and m.slot < len(res.served):
            served = repr(res.served[m.slot])
        vrows.append([m.slot, f"{ref.labels[m.best]} ({m.best_cos:.3f})",
                      f"{ref.labels[m.second]} ({m.second_cos:.3f})", dec, served, verdict])
    lines.append("")
    lines.append(fmt_table(vrows, ["slot", "matches", "next best", "declared", "server meant", "verdict"]))
    if res.declared is not None:
        lines.append(f"declared taps: {list(res.declared.taps)} ({res.declared_source or 'given'})")
    return "\n".join(lines)


__all__ = ["REFERENCE_FORMAT", "CAPTURE_FORMAT", "Reference", "Captured", "load_reference", "load_captured",
           "save_captured", "fingerprint", "FingerprintResult", "render", "POST_NORM"]
