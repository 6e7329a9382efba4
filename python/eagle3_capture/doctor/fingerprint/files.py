"""The two files ``doctor fingerprint`` reads, checked field by field: the reference (read one column at a time,
so a reference of many layers and tokens never sits in memory whole) and the captured dumps.

* reference: safetensors with ``hidden_states`` [L+1, T, H] (floating point), ``final_prenorm`` [T, H] (optional),
  ``input_ids`` [T] (integers), ``positions`` [T] (integers, optional), metadata ``format`` =
  ``eagle3-capture-reference/1``, ``num_layers``, ``hidden_size`` (optional; checked against the shapes).
* captured: the SGLang plugin's dump (``EAGLE3_CAPTURE_DUMP=<dir>``: ``eagle3_capture_pid*_*.pt``; a version-2
  record is read and checked by the dump format's one reader, ``eagle3_capture.dump_format``), a directory of such
  dumps, a ``.pt`` dict with ``aux`` and optionally ``input_ids``, ``positions``, ``draft_ids``,
  ``layers_to_capture``, ``num_layers``, ``hidden_size`` (a version-1 record, or a capture written by hand), or a
  safetensors file with ``aux`` [T, K*H] and ``input_ids`` [T] (metadata ``layers_to_capture`` / ``draft_ids`` as
  JSON lists, ``num_layers`` / ``hidden_size`` as JSON integers, optional).

Every problem is a :class:`~.common.DoctorError` naming the file and the field, what was expected and what was found.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...dump_format.contract import int_values
from ...dump_format.reader import read_record, verify_bytes
from ...spec import EMBEDDING, LayerOutput
from ..common import DoctorError, load_safetensors, meta_json, require_file, save_safetensors, shown

REFERENCE_FORMAT = "eagle3-capture-reference/1"
CAPTURE_FORMAT = "eagle3-capture-captured/1"
POST_NORM = "post-norm"

_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


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


def _int_value(v: Any, what: str, key: str) -> int:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype in _INT:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DoctorError(f"{what}: '{key}' must be an integer, got {shown(v)}")
    if v < 1:
        raise DoctorError(f"{what}: '{key}' must be >= 1, got {v}")
    return v


def _ids_tensor(v: Any, what: str, key: str, n: Optional[int] = None) -> torch.Tensor:
    """A 1-D int64 tensor of token ids / positions, or DoctorError (a float tensor would be truncated silently)."""
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        v = torch.tensor(list(v), dtype=torch.int64)
    if not isinstance(v, torch.Tensor):
        raise DoctorError(f"{what}: '{key}' must be an integer tensor or list, got {type(v).__name__}")
    if v.dtype not in _INT:
        raise DoctorError(f"{what}: '{key}' must hold integers, got dtype {v.dtype}")
    if v.dim() > 1 and sum(s > 1 for s in v.shape) > 1:
        raise DoctorError(f"{what}: '{key}' must be 1-D [T], got shape {tuple(v.shape)}")
    v = v.reshape(-1).to(torch.int64)
    if n is not None and v.numel() != n:
        raise DoctorError(f"{what}: {key} has {v.numel()} entries, expected {n} (one per token row)")
    return v


# ----------------------------------------------------------------------------------------------------------------
# the reference, read by column
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Reference:
    """A reference file's layout and token ids; the hidden states stay on disk until :meth:`column` reads one."""

    columns: List[object]          # canonical taps, plus POST_NORM for HF's post-norm last entry
    labels: List[str]
    sources: List[Tuple[str, Optional[int]]]  # per column: (tensor name, index into it or None)
    input_ids: torch.Tensor        # [T]
    positions: Optional[torch.Tensor]
    num_layers: int
    hidden_size: int
    num_tokens: int
    path: str

    def column(self, i: int) -> torch.Tensor:
        """Column i [T, H] in the file's dtype. The file is opened for this column only, so what it maps is let go
        again."""
        from safetensors import safe_open

        name, idx = self.sources[i]
        try:
            with safe_open(self.path, framework="pt") as h:
                t = h.get_slice(name)[idx] if idx is not None else h.get_tensor(name)
        except Exception as e:  # the file changed or broke under us
            raise DoctorError(f"reference {self.path}: cannot read {name}"
                              + (f"[{idx}]" if idx is not None else "") + f" ({e})") from None
        return t


def _header(path: str) -> Tuple[Dict[str, Tuple[List[int], torch.dtype]], Dict[str, str]]:
    """{name: (shape, dtype)} and the metadata of a safetensors file, reading no tensor data."""
    from safetensors import safe_open

    p = require_file(path, "reference")
    try:
        with safe_open(p, framework="pt") as h:
            meta = dict(h.metadata() or {})
            info = {}
            for k in h.keys():
                shape = list(h.get_slice(k).get_shape())
                # the torch dtype without reading the data: an empty slice (a 0-d tensor is one element)
                t = h.get_slice(k)[tuple(slice(0, 0) for _ in shape)] if shape else h.get_tensor(k)
                info[k] = (shape, t.dtype)
    except Exception as e:  # SafetensorError, OSError, a header that is not JSON
        raise DoctorError(f"reference {p}: not a readable safetensors file ({e})") from None
    return info, meta


def _small(path: str, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as h:
        return h.get_tensor(name)


def load_reference(path: str) -> Reference:
    info, meta = _header(path)
    what = f"reference {path}"
    for key in ("hidden_states", "input_ids"):
        if key not in info:
            raise DoctorError(f"{what}: no '{key}' tensor (expected a file written by `eagle3-capture doctor "
                              f"dump-reference`; it has {sorted(info)})")
    fmt = meta.get("format")
    if fmt is not None and fmt != REFERENCE_FORMAT:
        raise DoctorError(f"{what}: metadata format is {fmt!r}, expected {REFERENCE_FORMAT!r}")
    shape, dtype = info["hidden_states"]
    if len(shape) != 3:
        raise DoctorError(f"{what}: hidden_states must be [L+1, T, H], got shape {tuple(shape)}")
    if dtype not in _FLOAT:
        raise DoctorError(f"{what}: hidden_states must be floating point, got dtype {dtype}")
    L = shape[0] - 1
    if L < 1:
        raise DoctorError(f"{what}: hidden_states has {shape[0]} entries; at least 2 (embedding + one layer)")
    T, H = shape[1], shape[2]
    if T < 1 or H < 1:
        raise DoctorError(f"{what}: hidden_states has shape {tuple(shape)}: no tokens or no width")
    ishape, idtype = info["input_ids"]
    if idtype not in _INT:
        raise DoctorError(f"{what}: input_ids must hold integers, got dtype {idtype}")
    ids = _ids_tensor(_small(path, "input_ids"), what, "input_ids")
    if ids.numel() != T:
        raise DoctorError(f"{what}: input_ids has {ids.numel()} tokens but hidden_states has T={T}")
    for key, want in (("num_layers", L), ("hidden_size", H)):
        v = meta_json(meta, key, what)
        if v is not None:
            v = _int_value(v, what, f"metadata {key}")
            if v != want:
                shown = f"L+1={L + 1} entries" if key == "num_layers" else f"H={H}"
                raise DoctorError(f"{what}: metadata {key}={v} but hidden_states has {shown}")
    cols: List[object] = [EMBEDDING] + [LayerOutput(k) for k in range(L - 1)]
    sources: List[Tuple[str, Optional[int]]] = [("hidden_states", h) for h in range(L)]
    if "final_prenorm" in info:
        pshape, pdtype = info["final_prenorm"]
        if tuple(pshape) != (T, H):
            raise DoctorError(f"{what}: final_prenorm must be [T, H] = {(T, H)}, got {tuple(pshape)}")
        if pdtype not in _FLOAT:
            raise DoctorError(f"{what}: final_prenorm must be floating point, got dtype {pdtype}")
        cols.append(LayerOutput(L - 1))
        sources.append(("final_prenorm", None))
        ref = Reference(cols, [], sources, ids, None, L, H, T, path)
        last = ref.column(len(sources) - 1)
        sources.append(("hidden_states", L))
        # the last HF entry is its own column unless it is the pre-norm value itself (a model without final norm)
        if not torch.equal(last, ref.column(len(sources) - 1)):
            cols.append(POST_NORM)
        else:
            sources.pop()
        del last
    else:
        cols.append(POST_NORM)
        sources.append(("hidden_states", L))
    pos = None
    if "positions" in info:
        pos = _ids_tensor(_small(path, "positions"), what, "positions", T)
    return Reference(cols, [column_label(c, L) for c in cols], sources, ids, pos, L, H, T, path)


# ----------------------------------------------------------------------------------------------------------------
# captured dumps
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class Captured:
    aux: torch.Tensor              # [T, K*H], in the dump's floating dtype
    input_ids: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]
    layers_to_capture: Optional[List[int]]
    draft_ids: Optional[List[int]]
    num_layers: Optional[int]
    hidden_size: Optional[int]
    path: str


def _captured_from_dict(d: dict, path: str) -> Captured:
    what = f"captured {path}"
    aux = d.get("aux")
    if not isinstance(aux, torch.Tensor):
        raise DoctorError(f"{what}: no 'aux' tensor (the packed [T, K*H] capture)"
                          + (f"; 'aux' is {type(aux).__name__}" if aux is not None else ""))
    if aux.dim() != 2:
        raise DoctorError(f"{what}: aux must be [T, K*H], got shape {tuple(aux.shape)}")
    if aux.dtype not in _FLOAT:
        raise DoctorError(f"{what}: aux must be floating point (the captured hidden states), got dtype {aux.dtype}")
    if aux.shape[1] == 0:
        raise DoctorError(f"{what}: aux has no columns (shape {tuple(aux.shape)})")

    def ints(key):
        v = d.get(key)
        if v is not None and int_values(v) is None:
            raise DoctorError(f"{what}: '{key}' must be a list of integers, got {shown(v)}")
        return None if v is None else int_values(v)

    def tensor(key):
        v = d.get(key)
        return None if v is None else _ids_tensor(v, what, key, aux.shape[0])

    def opt_int(key):
        v = d.get(key)
        return None if v is None else _int_value(v, what, key)

    return Captured(aux, tensor("input_ids"), tensor("positions"), ints("layers_to_capture"), ints("draft_ids"),
                    opt_int("num_layers"), opt_int("hidden_size"), path)


def load_captured(path: str) -> List[Captured]:
    """One record per file (a directory: every ``*.pt`` / ``*.safetensors`` in it, in name order)."""
    require_file(path, "captured", allow_dir=True)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.pt")) + glob.glob(os.path.join(path, "*.safetensors")))
        files = [f for f in files if os.path.isfile(f)]
        if not files:
            raise DoctorError(f"captured {path}: directory has no *.pt or *.safetensors capture dump")
    else:
        files = [path]
    out = []
    for f in files:
        if f.endswith(".safetensors"):
            t, meta = load_safetensors(f, "captured")
            d: Dict[str, Any] = dict(t)
            for key in ("layers_to_capture", "draft_ids", "num_layers", "hidden_size"):
                if key in meta:
                    d[key] = meta_json(meta, key, f"captured {f}")
            out.append(_captured_from_dict(d, f))
        else:
            verify_bytes(f)  # the zip's CRC-32s: torch.load would take changed tensor bytes as data
            try:
                d = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # pickle / zip errors come in many types
                raise DoctorError(f"captured {f}: not a readable capture dump (torch.load: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''})") from None
            if not isinstance(d, dict):
                raise DoctorError(f"captured {f}: expected the plugin's dump (a dict), got {type(d).__name__}")
            if d.get("format") is None:  # a version-1 record, or a capture written by hand
                out.extend(_requests_of(_captured_from_dict(d, f)))
                continue
            rec = read_record(d, f)  # the plugin's version-2 record: checked as the dump format says
            if rec.aux is None:
                continue  # a forward that fed the draft nothing (an idle batch)
            out.extend(_requests_of(Captured(rec.aux, rec.input_ids, rec.positions, rec.layers_to_capture,
                                             rec.draft_ids, rec.num_layers, rec.hidden_size, f)))
    return out


def _requests_of(cap: Captured) -> List[Captured]:
    """A forward's rows split into its requests' runs (positions count up by one within a request): a server batches
    concurrent requests in any order, so only each request's rows are a run of some reference's tokens."""
    if cap.positions is None or cap.input_ids is None or cap.positions.numel() < 2:
        return [cap]
    pos = cap.positions
    cuts = [0] + (torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1).tolist() + [pos.numel()]
    if len(cuts) == 2:
        return [cap]
    return [Captured(cap.aux[s:e], cap.input_ids[s:e], pos[s:e], cap.layers_to_capture, cap.draft_ids,
                     cap.num_layers, cap.hidden_size, f"{cap.path}[rows {s}:{e}]") for s, e in zip(cuts, cuts[1:])]


def save_captured(path: str, aux: torch.Tensor, input_ids: torch.Tensor, *, layers_to_capture=None,
                  draft_ids=None, num_layers=None, hidden_size=None, source: str = "") -> None:
    meta = {"format": CAPTURE_FORMAT, "source": source}
    for k, v in (("layers_to_capture", layers_to_capture), ("draft_ids", draft_ids), ("num_layers", num_layers),
                 ("hidden_size", hidden_size)):
        if v is not None:
            meta[k] = v
    save_safetensors(path, {"aux": aux, "input_ids": input_ids.to(torch.int64)}, meta)


__all__ = ["REFERENCE_FORMAT", "CAPTURE_FORMAT", "POST_NORM", "Reference", "Captured", "load_reference",
           "load_captured", "save_captured", "column_label", "short_label"]
