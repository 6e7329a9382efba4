"""vLLM's speculative-decoding counters (``v1/spec_decode/metrics.py`` in vllm 0.32.0, on ``/metrics`` in Prometheus
text): ``vllm:spec_decode_num_drafts_total`` (verifies), ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}``
(verifies whose draft token at 0-based position j was accepted), one series per engine (label ``engine``), summed
here. vLLM reports nothing per request (no acceptance, no hidden states in a response), so a measurement is the
difference of two scrapes over a window in which only the measured requests ran.

The scheduler counts (``v1/core/sched/scheduler.py update_from_output``) once per verify of a request that had draft
tokens scheduled: drafts += 1, draft tokens += the tokens scheduled, accepted += sampled - 1, and per position j
< accepted. The doctor's replay of the loop (doctor/sglang_model/serving.py ``walk``: prefill token, then verifies
of a chain of k until the request's tokens are out, the last verify counted whole) gives the same counters from its
histogram of accepted tokens per verify: :func:`predicted_counters`. The scheduler never trims the draft tokens of a
verify to the request's max_tokens (only to max_model_len), so a request's last verify counts its k draft tokens
even when it finishes mid-draft, as the replay counts it. Checked counter for counter against vLLM 0.32.0's offline
loop and OpenAI server (tests/vllm_engine).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from ..common import DoctorError

_SERIES = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class SpecCounters:
    """Verifies, draft tokens, accepted tokens and accepted tokens per 0-based position."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: List[int] = field(default_factory=list)

    def __sub__(self, other: "SpecCounters") -> "SpecCounters":
        n = max(len(self.per_pos), len(other.per_pos))
        a = self.per_pos + [0] * (n - len(self.per_pos))
        b = other.per_pos + [0] * (n - len(other.per_pos))
        out = SpecCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                           self.accepted - other.accepted, [x - y for x, y in zip(a, b)])
        if min([out.drafts, out.draft_tokens, out.accepted] + out.per_pos, default=0) < 0:
            raise DoctorError(f"vLLM's counters went down between two scrapes ({other} -> {self}): the server was "
                              "restarted in between")
        return out

    @property
    def accept_length(self) -> float:
        """1 + accepted / verifies: vLLM's mean acceptance length (tokens per verify)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")


def _count(value: str, what: str) -> int:
    try:
        v = float(value)
    except ValueError:
        raise DoctorError(f"vLLM /metrics: {what} has the value {value!r}, not a number") from None
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise DoctorError(f"vLLM /metrics: {what} = {value}, expected a non-negative whole count")
    return int(v)


def parse_spec_counters(text: str) -> SpecCounters:
    """The counters in a ``/metrics`` text (every engine's series summed). A DoctorError when the text carries none
    of them: a server without speculative decoding, or not vLLM."""
    if not isinstance(text, str):
        raise DoctorError(f"vLLM /metrics: expected the response text, got {type(text).__name__}")
    totals: Dict[str, int] = {}
    per_pos: Dict[int, int] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name in _SERIES:
            totals[_SERIES[name]] = totals.get(_SERIES[name], 0) + _count(value, name)
        elif name == _PER_POS:
            p = _POSITION.search(labels)
            if p is None:
                raise DoctorError(f"vLLM /metrics: {name}{labels} has no position label")
            pos = int(p.group(1))
            per_pos[pos] = per_pos.get(pos, 0) + _count(value, f"{name}{labels}")
    if not totals and not per_pos:
        raise DoctorError("vLLM /metrics carries no vllm:spec_decode_* counter: is speculative decoding on, and "
                          "is this a vLLM server?")
    n = max(per_pos) + 1 if per_pos else 0
    return SpecCounters(totals.get("drafts", 0), totals.get("draft_tokens", 0), totals.get("accepted", 0),
                        [per_pos.get(j, 0) for j in range(n)])


def predicted_counters(histogram: Sequence[int], k: int) -> SpecCounters:
    """vLLM's counters for a chain of ``k`` speculative tokens, from the doctor's histogram of accepted draft tokens
    per verify (``histogram[n]``: verifies that accepted n)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DoctorError(f"k (num_speculative_tokens) must be a positive integer, got {k!r}")
    hist = [int(c) for c in histogram]
    if any(c < 0 for c in hist) or len(hist) > k + 1:
        raise DoctorError(f"a histogram of accepted tokens per verify for k = {k} has at most {k + 1} non-negative "
                          f"entries, got {list(histogram)}")
    drafts = sum(hist)
    return SpecCounters(drafts, drafts * k, sum(n * c for n, c in enumerate(hist)),
                        [sum(hist[j + 1:]) for j in range(k)])
