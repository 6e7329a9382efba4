"""Nothing the doctor sends may harm the server it checks (issue 32, kind 5). A token id outside the vocabulary kills
SGLang's scheduler (an IndexError in the embedding: every later request fails), so every request is checked here
before it goes out: each id an integer in [0, vocab) of the target's config, the input shorter than the server's
``max_req_input_len`` and input + new tokens within its ``context_length`` (both from ``/server_info``, where the
server reports them). A request that fails is one DoctorError naming it; none is sent."""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Optional, Sequence

from ..common import DoctorError


@dataclass(frozen=True)
class RequestLimits:
    """What a request to this server may hold: ``vocab`` (the target config's vocabulary; ids are refused without
    it), ``max_input`` (max_req_input_len: inputs must be shorter) and ``context`` (context_length: input + new
    tokens at most), None where the server does not report it; ``source`` says where they came from."""

    vocab: Optional[int]
    max_input: Optional[int] = None
    context: Optional[int] = None
    source: str = ""


def _positive_int(v) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def server_limits(base: str, timeout: float, vocab: Optional[int], vocab_source: str) -> RequestLimits:
    """The limits the server reports at ``/server_info`` (none when it does not answer it), with the vocabulary of
    the target's config (``vocab_source`` names it)."""
    from .http import open_json

    req = urllib.request.Request(base.rstrip("/") + "/server_info", method="GET")
    try:
        info = open_json(req, base, timeout)
    except DoctorError:
        info = None
    info = info if isinstance(info, dict) else {}
    return RequestLimits(vocab, _positive_int(info.get("max_req_input_len")), _positive_int(info.get("context_length")),
                         f"vocabulary {vocab} from {vocab_source}; the server's /server_info: max_req_input_len "
                         f"{info.get('max_req_input_len')}, context_length {info.get('context_length')}")


def check_request(ids: Sequence[int], new_tokens: int, limits: RequestLimits, what: str) -> None:
    """DoctorError (nothing sent) when ``ids`` + ``new_tokens`` could harm or be refused by the server; ``what``
    names the request (a prompt, a training sample)."""
    if limits.vocab is None:
        raise DoctorError(f"{what}: the target's vocabulary is not known, so its token ids cannot be checked before "
                          "they are sent (an id outside it kills SGLang's scheduler): give --target-config or "
                          "--target-checkpoint")
    bad = next((v for v in ids if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < limits.vocab), None)
    if bad is not None:
        raise DoctorError(f"{what}: token id {bad!r} is outside the target's vocabulary ({limits.vocab}); not sent "
                          "(it would kill the server's scheduler): token ids of another model?")
    n = len(ids)
    if limits.max_input is not None and n >= limits.max_input:
        raise DoctorError(f"{what}: {n} input tokens; the server takes fewer than its max_req_input_len "
                          f"{limits.max_input}: not sent (give a shorter input: --max-tokens, --new-tokens)")
    if limits.context is not None and n + new_tokens > limits.context:
        raise DoctorError(f"{what}: {n} input tokens + {new_tokens} new exceed the server's context_length "
                          f"{limits.context}: not sent (give fewer --new-tokens or a shorter input)")


def check_outputs(responses, vocab: Optional[int], server: str) -> None:
    """DoctorError when a response holds a token id outside the target's vocabulary: the server answered with
    another model's ids (or the target given is not the server's model). Said as such -- not as outputs that are
    'not lossless' -- and never sent back to the server in a later request."""
    if vocab is None:
        return
    for i, r in enumerate(responses):
        bad = next((v for v in r.output_ids if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < vocab),
                   None)
        if bad is not None:
            raise DoctorError(f"--server {server}, prompt {i}: output token id {bad!r} is outside the target's "
                              f"vocabulary ({vocab}): the server runs another model than the target given (or its "
                              "answers are not token ids of it)")


__all__ = ["RequestLimits", "server_limits", "check_request", "check_outputs"]
