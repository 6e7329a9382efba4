"""Nothing the doctor sends may harm the server it checks (issue 32, kind 5). A token id outside the vocabulary kills
SGLang's scheduler (an IndexError in the embedding: every later request fails), so every request is checked here
before it goes out: each id an integer in [0, vocab), the input shorter than the server's ``max_req_input_len`` and
input + new tokens within its ``context_length`` (both from ``/server_info``, where the server reports them). A
request that fails is one DoctorError naming it; none is sent.

The vocabulary is not taken from one source (issue 42): the local ones (the target's config or checkpoint, the
draft's config, which names its target's vocabulary) must agree, and the server is asked for its own before any
``/generate`` that carries the doctor's ids (:func:`server_vocab`): one request whose ``logit_bias`` names token id
-1, which SGLang refuses in its tokenizer manager (``SamplingParams.verify``, releases 0.5.12 to 0.5.23, read in
their sources) before anything reaches the scheduler, with the line ``logit_bias must has keys in [0, V-1]``: its
vocabulary V. The probe cannot harm a server that did not check it either: a bias of 0 on the last column changes
nothing, and its one input id is 0. Where the sources disagree nothing is sent, and the line says which said what.
Every id the server sends back is checked against the same vocabulary (:func:`check_outputs`, and the teacher-forced
pass's ``input_top_logprobs`` in target_side/server_side.py)."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

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


PROBE = {"input_ids": [0], "sampling_params": {"temperature": 0, "max_new_tokens": 1, "logit_bias": {"-1": 0.0}}}
REVEALED = re.compile(r"logit_bias must ha(?:s|ve) keys in \[0, (\d{1,12})\]")


def server_vocab(base: str, timeout: float) -> Tuple[Optional[int], str]:
    """(the vocabulary the server reveals, how it was found), or (None, why not): see the module's text."""
    url = base.rstrip("/") + "/generate"
    req = urllib.request.Request(url, data=json.dumps(PROBE).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return None, f"it accepted a logit_bias on token id -1 (HTTP {r.status}): no vocabulary check to read"
    except urllib.error.HTTPError as e:
        try:
            body = e.read(4096).decode("utf-8", "replace")
        except OSError:
            body = ""
        m = REVEALED.search(body)
        if m:
            return int(m.group(1)) + 1, f"its answer to a logit_bias on token id -1: keys in [0, {m.group(1)}]"
        return None, f"HTTP {e.code} to a logit_bias on token id -1, without its vocabulary ({body[:120]!r})"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, f"no answer to the vocabulary probe ({getattr(e, 'reason', e)})"


def agreed_vocab(sources: Sequence[Tuple[str, Optional[int]]]) -> Tuple[Optional[int], str]:
    """The vocabulary every source that gives one agrees on, and who says it; DoctorError naming each when they
    disagree (nothing is sent then)."""
    known = [(name, v) for name, v in sources if v is not None]
    if len({v for _, v in known}) > 1:
        raise DoctorError("the target's vocabulary is not agreed: " + "; ".join(f"{n} says {v}" for n, v in known)
                          + ": nothing sent (a checkpoint, config or draft of another model?)")
    if not known:
        return None, "no local source"
    return known[0][1], " and ".join(n for n, _ in known)


def server_limits(base: str, timeout: float, vocab: Optional[int], vocab_source: str,
                  others: Sequence[Tuple[str, Optional[int]]] = ()) -> RequestLimits:
    """The limits of requests to this server: the vocabulary every local source (``vocab`` from ``vocab_source``,
    and ``others``: (name, vocabulary) pairs) and the server itself agree on (:func:`server_vocab`; DoctorError,
    nothing sent, where they disagree), and what the server reports at ``/server_info`` (none when it does not
    answer it)."""
    from .http import open_json

    local, said = agreed_vocab([(vocab_source, vocab)] + list(others))
    served, how = server_vocab(base, timeout)
    if served is not None and local is not None and served != local:
        raise DoctorError(f"--server {base}: the server's vocabulary is {served} ({how}); {said} says {local}: the "
                          "server runs another model than the one given (or the config given is not the served "
                          "model's): nothing sent")
    if served is not None:
        vocab, source = served, (f"{said} and the server ({how})" if local is not None else f"the server ({how})")
    else:
        vocab, source = local, f"{said} (the server did not reveal its own: {how})"
    req = urllib.request.Request(base.rstrip("/") + "/server_info", method="GET")
    try:
        info = open_json(req, base, timeout)
    except DoctorError:
        info = None
    info = info if isinstance(info, dict) else {}
    return RequestLimits(vocab, _positive_int(info.get("max_req_input_len")), _positive_int(info.get("context_length")),
                         f"vocabulary {vocab} from {source}; the server's /server_info: max_req_input_len "
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


def check_ids(ids, vocab: Optional[int], what: str) -> None:
    """DoctorError when an id the server sent back is not a token id of the vocabulary (None: not checked)."""
    if vocab is None:
        return
    bad = next((v for v in ids if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < vocab), None)
    if bad is not None:
        raise DoctorError(f"{what}: token id {bad!r} is outside the target's vocabulary ({vocab}): the server runs "
                          "another model than the target given (or its answers are not token ids of it); nothing of "
                          "its answer is used or sent back")


__all__ = ["RequestLimits", "server_limits", "server_vocab", "agreed_vocab", "check_request", "check_outputs",
           "check_ids", "PROBE", "REVEALED"]
