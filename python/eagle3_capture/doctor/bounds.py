"""How big the doctor's work may get: every size a user gives is bounded by what the models allow or by a limit
stated here, and refused beyond it with one line (a DoctorError) before any long work starts -- instead of a run
that never ends or a crash.

* positions: the target is run over prompt + continuation (+ the draft steps scored past its end); a target's
  ``max_position_embeddings`` is as far as it goes (SGLang refuses requests past the context length it derives from
  it). A config without it gets :data:`POSITIONS_WITHOUT_CONFIG`.
* draft steps (``--steps``, ``--speculative-num-steps``): at most :data:`MAX_DRAFT_STEPS`. Each step is a draft
  forward over every position; EAGLE-3 drafts are trained for a handful of steps (SGLang's defaults are 3 and 5).
* eagle-topk: from 1 to the draft's vocabulary (each drafted row keeps its top k tokens).
* the draft tree: ``topk + (num_steps - 1) * topk**2`` candidates per position, at most
  :data:`MAX_TREE_CANDIDATES` (the replay keeps scores, tokens and parents of every candidate at every position).
* CPU threads: at most the machine's CPU count (``--threads``, in ``arg_types``); torch crashes on absurd counts.
* the server's ``--timeout``: at most :data:`MAX_TIMEOUT_S` (Python's socket timeouts overflow past ~9e9 s).
"""
from __future__ import annotations

from typing import Optional, Sequence

from .common import DoctorError

MAX_DRAFT_STEPS = 64
MAX_TREE_CANDIDATES = 1 << 14
POSITIONS_WITHOUT_CONFIG = 1 << 20
MAX_TIMEOUT_S = 86400.0  # a day per response


def max_positions(model) -> Optional[int]:
    """The target's ``max_position_embeddings`` (its text config's, for a multimodal wrapper), None when unknown.
    ``model``: a transformers model, or a checkpoint's config.json as a dict."""
    if isinstance(model, dict):
        cfg = model.get("text_config") if isinstance(model.get("text_config"), dict) else model
        v = cfg.get("max_position_embeddings")
    else:
        cfg = getattr(model, "config", None)
        cfg = getattr(cfg, "text_config", None) or cfg
        v = getattr(cfg, "max_position_embeddings", None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def check_positions(model, prompts: Sequence[Sequence[int]], new_tokens: int, steps: int, what: str) -> None:
    """The longest prompt + ``new_tokens`` + ``steps`` (the draft steps scored past the continuation's end) must fit
    the target's positions. ``model``: the target, or its checkpoint's config.json as a dict (either's
    max_position_embeddings), or the limit itself as an int, or None (unknown). ``what`` names
    the flag or file the new-token count came from."""
    limit = model if isinstance(model, int) and not isinstance(model, bool) else max_positions(model)
    source = "the target's max_position_embeddings"
    if limit is None:
        limit, source = POSITIONS_WITHOUT_CONFIG, "the doctor's limit for a target config without max_position_embeddings"
    longest = max((len(p) for p in prompts), default=0)
    need = longest + int(new_tokens) + int(steps)
    if need > limit:
        room = limit - longest - int(steps)
        raise DoctorError(f"{what}: the longest prompt ({longest} tokens) + {new_tokens} new tokens"
                          + (f" + {steps} draft steps" if steps else "") + f" = {need} positions, beyond {source} "
                          f"{limit}" + (f"; at most {room} new tokens fit" if room > 0 else
                                        "; shorter prompts or fewer draft steps"))


def check_steps(steps: Optional[int], what: str) -> None:
    if steps is not None and steps > MAX_DRAFT_STEPS:
        raise DoctorError(f"{what} {steps}: at most {MAX_DRAFT_STEPS} draft steps (each is a draft forward over every "
                          "position; EAGLE-3 drafts are trained for a handful)")


def check_speculative(steps: int, topk: int, draft_tokens: int, draft_vocab: int, what: str) -> None:
    """Flags a replay can run: num-steps 1..MAX_DRAFT_STEPS, eagle-topk 1..the draft's vocabulary, the tree's
    candidates at most MAX_TREE_CANDIDATES, num-draft-tokens from 2 to what the tree offers + 1."""
    if steps < 1:
        raise DoctorError(f"{what}: num-steps {steps}: the draft never runs (need --speculative-num-steps >= 1)")
    check_steps(steps, f"{what}: num-steps")
    if topk < 1:
        raise DoctorError(f"{what}: eagle-topk {topk}: must be >= 1 (1 is a chain)")
    if topk > draft_vocab:
        raise DoctorError(f"{what}: eagle-topk {topk}: more than the draft's vocabulary of {draft_vocab} tokens")
    if topk > 1:
        n_cand = topk + (steps - 1) * topk * topk
        if n_cand > MAX_TREE_CANDIDATES:
            raise DoctorError(f"{what}: a tree of eagle-topk {topk} x num-steps {steps} has {n_cand} candidates per "
                              f"position (topk + (steps-1)*topk^2), more than the replay's limit of "
                              f"{MAX_TREE_CANDIDATES}")
        if not 2 <= draft_tokens <= n_cand + 1:
            raise DoctorError(f"{what}: num-draft-tokens {draft_tokens} with num-steps {steps} and eagle-topk {topk}: "
                              f"SGLang draws the tree's {draft_tokens - 1} non-root tokens from {n_cand} candidates; "
                              f"it needs 2 <= num-draft-tokens <= {n_cand + 1}")


__all__ = ["MAX_DRAFT_STEPS", "MAX_TREE_CANDIDATES", "POSITIONS_WITHOUT_CONFIG", "MAX_TIMEOUT_S", "max_positions",
           "check_positions", "check_steps", "check_speculative"]
