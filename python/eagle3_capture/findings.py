"""Findings: one mismatch between what a draft was trained on and what a capture delivers (with its fix), and
:func:`compare_taps`, which names every such mismatch slot by slot. Engine-free: sglang_releases/ adds what stock
SGLang drops and raises on each release; the doctor's checks add their own findings of the same type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .spec import CONV_CANONICAL, LAYER_INPUTS, Embedding, LayerOutput, Tap, TapSpec, convention_limits, tap_error

__all__ = ["Finding", "compare_taps", "wanted_capture"]


@dataclass(frozen=True)
class Finding:
    """One mismatch between what a draft was trained on and what is captured."""

    severity: str  # "error" | "warning" | "info"
    code: str      # e.g. "missing-embedding", "shifted-tap", "dropped-tap", "count-mismatch"
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code}: {self.message}" + (f" (fix: {self.fix})" if self.fix else "")


def _layers(n: int) -> str:
    return f"{n:+d} layer" + ("" if abs(n) == 1 else "s")


def compare_taps(declared: TapSpec, captured: Sequence[Tap], *, fix: Optional[str] = None) -> List[Finding]:
    """Name every difference between the taps a draft was trained on and those a capture delivers, in slot order.

    The fc consumes slots by position, so with equal counts slots are compared one to one; with unequal counts the
    draft cannot run at all, and layer taps are paired in order (when their counts match) to show the shift. An
    empty list means the capture is exactly the trained one. ``fix`` (default: :func:`wanted_capture`) is attached
    to every finding.
    """
    cap: Tuple[Tap, ...] = tuple(captured)
    for t in cap:
        if not isinstance(t, (Embedding, LayerOutput)):
            raise tap_error(f"captured {t!r} is not a tap", CONV_CANONICAL)
    if fix is None:
        fix = wanted_capture(declared)
    H, K, n = declared.hidden_size, declared.K, len(cap)
    out: List[Finding] = []

    if n != K:
        out.append(Finding("error", "count-mismatch",
                           f"the draft was trained on K={K} taps {list(declared.taps)} (fc in_features {K}*{H} = "
                           f"{K * H}) but {n} are captured {list(cap)} ({n}*{H} = {n * H})", fix))

    emb_declared = declared.includes_embedding
    emb_captured = any(isinstance(t, Embedding) for t in cap)
    if emb_declared and not emb_captured:
        got = f"; slot 0 receives {cap[0]!r} instead" if n == K and n else ""
        out.append(Finding("error", "missing-embedding",
                           f"the draft was trained with Embedding in slot 0 but the embedding is not captured{got}",
                           fix))
    if emb_captured and not emb_declared:
        out.append(Finding("error", "unexpected-embedding",
                           "the embedding is captured but the draft was not trained on it", fix))

    if n == K:
        for s, (d, c) in enumerate(zip(declared.taps, cap)):
            if d == c or isinstance(d, Embedding) or isinstance(c, Embedding):
                continue  # embedding slots are reported above
            out.append(Finding("error", "shifted-tap",
                               f"slot {s} captures {c!r} but the draft was trained on {d!r}: shifted by "
                               f"{_layers(c.k - d.k)}", fix))
        return out

    d_layers = [(s, t) for s, t in enumerate(declared.taps) if isinstance(t, LayerOutput)]
    c_layers = [(s, t) for s, t in enumerate(cap) if isinstance(t, LayerOutput)]
    if len(d_layers) == len(c_layers):
        for (ds, d), (cs, c) in zip(d_layers, c_layers):
            if d != c:
                out.append(Finding("error", "shifted-tap",
                                   f"draft slot {ds} (trained on {d!r}) is served {c!r} from captured slot {cs}: "
                                   f"shifted by {_layers(c.k - d.k)}", fix))
    else:
        cset, dset = set(cap), set(declared.taps)
        for s, d in d_layers:
            if d not in cset:
                out.append(Finding("error", "missing-tap", f"draft slot {s} was trained on {d!r}, not captured", fix))
        for s, c in c_layers:
            if c not in dset:
                out.append(Finding("error", "unexpected-tap",
                                   f"captured slot {s} holds {c!r}, which the draft was not trained on", fix))
    return out


def wanted_capture(declared: TapSpec) -> str:
    """The capture a draft needs, in canonical taps, draft ids and (when it can name them) layer inputs."""
    lim = convention_limits(declared)
    return (f"capture {list(declared.taps)} = draft ids {declared.to_draft_ids()}"
            + (f" = layer inputs {list(lim[LAYER_INPUTS].indices)}" if lim[LAYER_INPUTS].ok else ""))
