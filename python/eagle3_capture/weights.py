"""Loading a draft's fc (and its per-tap fc_norm) from a safetensors checkpoint, whole or as the column shard one
tensor-parallel rank holds.

Checkpoint names, as SGLang 0.5.23's EAGLE-3 loaders accept them (models/llama_eagle3.py, kimi_k25_eagle3.py):
`fc.weight` [N, K*H], optional `fc.bias` [N], optional `fc_norm.{k}.weight` [H] (legacy `aux_norm_low/mid/high`),
any of them under a `model.` prefix. SGLang's fc is a ColumnParallelLinear: rank r of tp holds output rows
[r*N/tp, (r+1)*N/tp) of the weight and of the bias, and the whole fc_norm (it acts on the replicated input).

A directory with a `*.safetensors.index.json` is read through its `weight_map`: every tensor from the file it
names (a named file that is missing is an error; files the index does not name are not read). Without an index,
every `*.safetensors` in the directory is read and a tensor found twice is an error.

fp8 fc weights (float8_e4m3fn / float8_e5m2) are dequantized to float32 (then to `dtype`, rounded once) by the
scale the checkpoint stores beside them:

* `fc.weight_scale_inv` [ceil(N/bn), ceil(K*H/bk)]: DeepSeek-style block scales, multiplied in (DeepSeek-V3's
  `weight_dequant` and SGLang's block-fp8 path multiply by it despite the name); the block size [bn, bk] is the
  checkpoint config's `quantization_config.weight_block_size`, else [128, 128] when the scale's shape fits it;
* `fc.weight_scale`: one scale for the tensor ([] or [1]) or one per output row ([N] or [N, 1]).

Any other combination (an fp8 weight without a scale, a scale of another shape, a scale beside a weight that is
not fp8) is refused with a message naming the tensor. Activation scales (`input_scale`) are not applied: the
offline fc computes in the requested dtype from the dequantized weight.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

_LEGACY_NORMS = {"aux_norm_low": 0, "aux_norm_mid": 1, "aux_norm_high": 2}
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))
_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_SCALE_NAMES = ("fc.weight_scale", "fc.weight_scale_inv")
DEFAULT_BLOCK = (128, 128)


@dataclass
class DraftFc:
    weight: torch.Tensor                 # [N/tp, K*H]
    norm_weight: Optional[torch.Tensor]  # [K, H] or None
    bias: Optional[torch.Tensor]         # [N/tp] or None
    out_features_total: int              # N before sharding
    tp_rank: int
    tp_size: int
    source: str
    quantization: Optional[str] = None   # how an fp8 weight was dequantized; None for a float checkpoint

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]


# ----------------------------------------------------------------------------------------------------------------
# where each tensor is
# ----------------------------------------------------------------------------------------------------------------

def canonical_name(name: str) -> str:
    """A checkpoint tensor's name without the ``model.`` prefix, legacy aux_norm_{low,mid,high} as fc_norm.{k}."""
    name = name[len("model."):] if name.startswith("model.") else name
    for legacy, k in _LEGACY_NORMS.items():
        name = name.replace(legacy, f"fc_norm.{k}")
    return name


def _wanted(c: str) -> bool:
    return c in ("fc.weight", "fc.bias") or c in _SCALE_NAMES or re.fullmatch(r"fc_norm\.\d+\.weight", c) is not None


_IGNORED_FC_PARTS = ("fc.input_scale",)  # an fp8 activation scale: not applied offline (module docstring)


def _refuse_unknown_fc_part(c: str, key: str, where: str) -> None:
    """A tensor named like part of the fc or of its per-tap norms that this loader does not know (``fc_norm.0.bias``,
    ``fc_norms.0.weight``, ``aux_norm_top.weight``, ...): ValueError naming it, instead of loading the fc without
    it (an fc whose norm is left out computes something else)."""
    if c in _IGNORED_FC_PARTS or _wanted(c):
        return
    if c.startswith(("fc.", "fc_norm", "aux_norm")):
        raise ValueError(f"{where}: {key} looks like part of the draft fc or its per-tap norms, but it is not a name "
                         "the fc loader knows (fc.weight, fc.bias, fc.weight_scale, fc.weight_scale_inv, "
                         "fc_norm.{k}.weight, aux_norm_low/mid/high.weight, each optionally under model.); refused "
                         "rather than loading the fc without it")


def _keys_of(f: str) -> List[str]:
    from safetensors import safe_open

    try:
        with safe_open(f, framework="pt") as h:
            return list(h.keys())
    except Exception as e:  # SafetensorError, OSError, header errors: all mean the file cannot be used
        raise ValueError(f"{f}: not a readable safetensors file ({e})") from None


def _index_file(d: str) -> Optional[str]:
    found = sorted(glob.glob(os.path.join(d, "*.safetensors.index.json")))
    if len(found) > 1:
        raise ValueError(f"draft checkpoint {d}: {len(found)} shard indexes ({[os.path.basename(f) for f in found]});"
                         " expected at most one")
    return found[0] if found else None


def shard_path(directory: str, name: str, index: str) -> str:
    """The path of the shard file ``name`` that the shard index ``index`` (in ``directory``) names: ValueError when
    the name leaves the directory (an absolute path, or one that climbs out with ``..``). The directory is the one
    the user gave; the file that names the shards is not trusted to send the reader elsewhere. Checked on the name,
    not through links: a Hugging Face cache's shards are links into its blob store."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == os.pardir or norm.startswith(os.pardir + os.sep) or not norm or norm == ".":
        raise ValueError(f"shard index {index}: weight_map names {name!r}, which is not a file inside "
                         f"{directory}: an index may only name files beside it")
    return os.path.join(directory, norm)


def checkpoint_files(path: str) -> List[str]:
    """The safetensors files of a checkpoint directory that hold its tensors: those its shard index names (each
    must exist), else every ``*.safetensors`` in it."""
    index = _index_file(path)
    if index is None:
        return sorted(glob.glob(os.path.join(path, "*.safetensors")))
    try:
        with open(index, "r", encoding="utf-8") as f:
            wm = json.load(f).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"shard index {index}: expected an object with 'weight_map' ({e})") from None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise ValueError(f"shard index {index}: expected an object with 'weight_map' {{tensor name: file name}}")
    files = sorted({shard_path(path, v, index) for v in wm.values()})
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"shard index {index} names a file that is missing: {os.path.basename(missing[0])}")
    return files


def _read_json(path: str, what: str):
    """The parsed JSON of a file; ValueError naming it (``what``, e.g. "shard index") when it is not JSON."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path}: malformed JSON ({e})") from None


def _from_index(index: str) -> Dict[str, Tuple[str, str]]:
    """canonical name -> (file, key) for the tensors this loader reads, as the index names them."""
    d = os.path.dirname(index)
    data = _read_json(index, "shard index")
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ValueError(f"shard index {index}: expected an object with 'weight_map' {{tensor name: file name}}, got "
                         f"{str(data)[:80]!r}")
    for v in set(wm.values()):
        shard_path(d, v, index)
    missing = sorted({v for v in wm.values() if not os.path.isfile(os.path.join(d, v))})
    if missing:
        names = [k for k, v in wm.items() if v == missing[0]]
        raise FileNotFoundError(f"shard index {index} names {len(missing)} file(s) that are missing: {missing[0]} "
                                f"(holding {names[:4]}{' ...' if len(names) > 4 else ''})"
                                + (f" and {missing[1:4]}" if len(missing) > 1 else ""))
    found: Dict[str, Tuple[str, str]] = {}
    keys_in: Dict[str, set] = {}
    for key, fname in wm.items():
        c = canonical_name(key)
        _refuse_unknown_fc_part(c, key, f"shard index {index}")
        if not _wanted(c):
            continue
        if c in found:
            raise ValueError(f"shard index {index}: {c} appears twice ({found[c][1]} and {key})")
        path = os.path.join(d, fname)
        if path not in keys_in:
            keys_in[path] = set(_keys_of(path))
        if key not in keys_in[path]:
            raise ValueError(f"shard index {index}: {key} is mapped to {fname}, but it is not in {fname}")
        found[c] = (path, key)
    return found


def _locate(path: str) -> Tuple[Dict[str, Tuple[str, str]], str]:
    """(canonical name -> (file, key), directory of the checkpoint)."""
    if os.path.isdir(path):
        index = _index_file(path)
        if index is not None:
            return _from_index(index), path
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in draft checkpoint directory {path}")
        d = path
    elif not os.path.exists(path):
        raise FileNotFoundError(f"draft checkpoint {path} does not exist")
    else:
        files, d = [path], os.path.dirname(path)
    found: Dict[str, Tuple[str, str]] = {}
    for f in files:
        for key in _keys_of(f):
            c = canonical_name(key)
            _refuse_unknown_fc_part(c, key, f)
            if _wanted(c):
                if c in found:
                    raise ValueError(f"{path}: {c} appears twice ({found[c][1]} in {found[c][0]} and {key} in {f})")
                found[c] = (f, key)
    return found, d


# ----------------------------------------------------------------------------------------------------------------
# reading and checking
# ----------------------------------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, found: Dict[str, Tuple[str, str]]):
        self.found = found

    def name(self, c: str) -> str:
        return self.found[c][1]

    def meta(self, c: str) -> Tuple[List[int], torch.dtype]:
        from safetensors import safe_open

        f, key = self.found[c]
        try:
            with safe_open(f, framework="pt") as h:
                shape = list(h.get_slice(key).get_shape())
                # the torch dtype without reading the data: an empty slice (a 0-d tensor is one element)
                dtype = (h.get_slice(key)[tuple(slice(0, 0) for _ in shape)] if shape else h.get_tensor(key)).dtype
        except Exception as e:
            raise ValueError(f"{f}: cannot read {key} ({e})") from None
        return shape, dtype

    def read(self, c: str, rows: Optional[slice] = None) -> torch.Tensor:
        from safetensors import safe_open

        f, key = self.found[c]
        try:
            with safe_open(f, framework="pt") as h:
                t = h.get_slice(key)[rows] if rows is not None else h.get_tensor(key)
        except Exception as e:
            raise ValueError(f"{f}: cannot read {key} ({e})") from None
        return t.contiguous()


def _block_size(d: str) -> Optional[Tuple[int, int]]:
    """quantization_config.weight_block_size of the checkpoint's config.json, or None when it does not say."""
    p = os.path.join(d, "config.json")
    if not os.path.isfile(p):
        return None
    cfg = _read_json(p, "draft config")
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(q, dict) or q.get("weight_block_size") is None:
        return None
    b = q["weight_block_size"]
    if (not isinstance(b, list) or len(b) != 2 or
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in b)):
        raise ValueError(f"draft config {p}: quantization_config.weight_block_size must be two positive integers, "
                         f"got {b!r}")
    return b[0], b[1]


def _dequantize(rd: _Reader, d: str, weight: torch.Tensor, shape: List[int], rows: slice) -> Tuple[torch.Tensor, str]:
    """float32 rows `rows` of the fp8 fc weight (already read: `weight`), times the checkpoint's scale."""
    n, kh = shape
    wname = rd.name("fc.weight")
    have = [s for s in _SCALE_NAMES if s in rd.found]
    if not have:
        raise ValueError(f"{wname} is {weight.dtype} but the checkpoint has no fc.weight_scale (per-tensor or "
                         "per-channel) or fc.weight_scale_inv (block): an fp8 weight cannot be used without its "
                         "scale")
    if len(have) == 2:
        raise ValueError(f"{wname} has both {rd.name(have[0])} and {rd.name(have[1])}: which one applies is unknown")
    sname = have[0]
    sshape, sdtype = rd.meta(sname)
    if sdtype not in _FLOAT:
        raise ValueError(f"{rd.name(sname)}: a scale must be a floating-point tensor, got {sdtype}")
    w = weight.to(torch.float32)
    if sname == "fc.weight_scale":
        if sshape in ([], [1]):
            s = rd.read(sname).to(torch.float32).reshape(())
            return w * s, f"{weight.dtype} x per-tensor {rd.name(sname)}"
        if sshape in ([n], [n, 1]):
            s = rd.read(sname).to(torch.float32).reshape(n, 1)[rows]
            return w * s, f"{weight.dtype} x per-channel {rd.name(sname)}"
        raise ValueError(f"{rd.name(sname)} has shape {sshape}; for {wname} {shape} expected [] or [1] (per tensor) "
                         f"or [{n}] / [{n}, 1] (per output channel)")
    if len(sshape) != 2:
        raise ValueError(f"{rd.name(sname)} has shape {sshape}; block scales are 2-D [ceil(N/bn), ceil(K*H/bk)]")
    block = _block_size(d)
    given = block is not None
    bn, bk = block or DEFAULT_BLOCK
    want = [-(-n // bn), -(-kh // bk)]
    if sshape != want:
        raise ValueError(f"{rd.name(sname)} has shape {sshape}; for {wname} {shape} with "
                         + (f"the config's weight_block_size [{bn}, {bk}]" if given else
                            f"no quantization_config.weight_block_size in {os.path.join(d, 'config.json')} "
                            f"(default [{bn}, {bk}])") + f" expected {want}")
    b0, b1 = rows.start // bn, -(-rows.stop // bn)
    s = rd.read(sname).to(torch.float32)[b0:b1]
    s = s.repeat_interleave(bn, 0)[rows.start - b0 * bn: rows.stop - b0 * bn].repeat_interleave(bk, 1)[:, :kh]
    return w * s, f"{weight.dtype} x block {rd.name(sname)} [{bn}, {bk}]"


def _check_tp(tp_rank, tp_size) -> None:
    for name, v in (("tp_rank", tp_rank), ("tp_size", tp_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, tp_size): got tp_rank={tp_rank}, tp_size={tp_size}")


def load_draft_fc(path: str, tp_rank: int = 0, tp_size: int = 1, dtype: Optional[torch.dtype] = None,
                  device="cpu") -> DraftFc:
    """Reads fc.weight / fc.bias / fc_norm.*.weight from a safetensors file or directory; shards like SGLang.
    ValueError (or FileNotFoundError) naming the tensor or file on anything it cannot use as is; TypeError for a
    ``dtype`` that is not a floating-point torch.dtype."""
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point
                              or dtype in _FP8):
        raise TypeError(f"load_draft_fc: dtype must be None or a floating-point torch.dtype (torch.float32, "
                        f"torch.bfloat16, torch.float16, torch.float64), got {dtype!r}")
    _check_tp(tp_rank, tp_size)
    found, d = _locate(path)
    if "fc.weight" not in found:
        raise ValueError(f"{path}: no fc weight (looked for fc.weight, model.fc.weight)")
    rd = _Reader(found)
    shape, wdtype = rd.meta("fc.weight")
    wname = rd.name("fc.weight")
    if len(shape) != 2:
        raise ValueError(f"{path}: {wname} must be 2-D [N, K*H], got shape {shape}")
    is_fp8 = wdtype in _FP8
    if not is_fp8 and wdtype not in _FLOAT:
        raise ValueError(f"{path}: {wname} is {wdtype}; expected a floating-point or fp8 weight")
    if not is_fp8 and any(s in found for s in _SCALE_NAMES):
        s = next(s for s in _SCALE_NAMES if s in found)
        raise ValueError(f"{path}: {rd.name(s)} is present but {wname} is {wdtype}, not fp8: a scale beside an "
                         "unquantized weight is inconsistent")
    n_total, in_features = shape
    if n_total % tp_size:
        raise ValueError(f"{path}: fc out_features {n_total} is not divisible by tp_size {tp_size} "
                         "(ColumnParallelLinear needs equal shards)")
    per = n_total // tp_size
    rows = slice(tp_rank * per, (tp_rank + 1) * per)

    def out(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype or t.dtype)

    weight = rd.read("fc.weight", rows)
    quant = None
    if is_fp8:
        try:
            weight, quant = _dequantize(rd, d, weight, shape, rows)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    weight = out(weight)
    bias = None
    if "fc.bias" in found:
        bshape, bdtype = rd.meta("fc.bias")
        if bshape != [n_total]:
            raise ValueError(f"{path}: {rd.name('fc.bias')} has shape {bshape}; {wname} has {n_total} output "
                             f"features, so the bias must be [{n_total}]")
        if bdtype not in _FLOAT:
            raise ValueError(f"{path}: {rd.name('fc.bias')} is {bdtype}; expected a floating-point bias")
        bias = out(rd.read("fc.bias", rows))
    norm_keys = sorted((k for k in found if k.startswith("fc_norm.")), key=lambda k: int(k.split(".")[1]))
    norm = None
    if norm_keys:
        idx = [int(k.split(".")[1]) for k in norm_keys]
        if idx != list(range(len(idx))):
            raise ValueError(f"{path}: fc_norm indices {idx} are not 0..K-1")
        metas = [rd.meta(k) for k in norm_keys]
        h0 = metas[0][0]
        for k, (s, dt) in zip(norm_keys, metas):
            if len(s) != 1 or s != h0:
                raise ValueError(f"{path}: {rd.name(k)} has shape {s}; every fc_norm weight must be [H], the same H "
                                 f"(fc_norm.0 is {h0})")
            if dt not in _FLOAT:
                raise ValueError(f"{path}: {rd.name(k)} is {dt}; expected a floating-point norm weight")
        if len(norm_keys) * h0[0] != in_features:
            raise ValueError(f"{path}: {len(norm_keys)} fc_norm weights of size {h0[0]} do not match fc "
                             f"in_features {in_features} (expected K*H)")
        norm = out(torch.stack([rd.read(k) for k in norm_keys]))
    return DraftFc(weight, norm, bias, n_total, tp_rank, tp_size, path, quant)
