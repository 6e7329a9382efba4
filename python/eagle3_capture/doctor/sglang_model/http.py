"""The doctor's HTTP client of a SGLang server: JSON in and out over urllib, every failure a one-line
:class:`~..common.DoctorError` naming the URL (an unreachable server, an HTTP error, a timeout, an answer that is not
JSON), and the two endpoints the doctor uses: ``/generate`` (SGLang's native API, prompts as token ids) and
``/server_info`` (the flags the server resolved)."""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence, Tuple

from ..common import DoctorError
from ..progress import bar as progress_bar
from .responses import Response, parse_response


def post_json(url: str, body: dict, timeout: float) -> object:
    """POST ``body`` as JSON to ``url``; the answer, parsed."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
                                 method="POST")
    return open_json(req, url, timeout)


def open_json(req, url: str, timeout: float) -> object:
    """The JSON answer to a prepared request, or a DoctorError saying what went wrong."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        raise DoctorError(f"--server {url}: HTTP {e.code} {e.reason}: {detail}") from None
    except urllib.error.URLError as e:
        raise DoctorError(f"--server {url}: cannot reach the server ({e.reason})") from None
    except (TimeoutError, OSError) as e:
        raise DoctorError(f"--server {url}: no answer within {timeout:g} s ({e})") from None
    except (http.client.HTTPException, ValueError) as e:  # a connection cut mid-answer, a malformed redirect
        raise DoctorError(f"--server {url}: no usable answer ({type(e).__name__}: {e})") from None
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise DoctorError(f"--server {url}: the answer is not JSON: {data[:120]!r}") from None


def server_flags(base: str, timeout: float) -> Optional[Tuple[int, int, int]]:
    """(num_steps, eagle_topk, num_draft_tokens) as the server resolved them (``/server_info``), or None when the
    server does not say."""
    req = urllib.request.Request(base.rstrip("/") + "/server_info", method="GET")
    try:
        info = open_json(req, base, timeout)
    except DoctorError:
        return None
    if not isinstance(info, dict):
        return None
    vals = [info.get(k) for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return tuple(vals)
    return None


def generate(base: str, prompts: Sequence[List[int]], new_tokens: int, timeout: float, concurrency: int,
             progress: bool) -> List[Response]:
    """Send each prompt to ``<base>/generate`` (greedy, ignore_eos, max_new_tokens); responses in prompt order."""
    url = base.rstrip("/") + "/generate"
    sampling = {"temperature": 0, "max_new_tokens": int(new_tokens), "ignore_eos": True}

    def one(i: int) -> Response:
        obj = post_json(url, {"input_ids": list(prompts[i]), "sampling_params": sampling}, timeout)
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        return parse_response(obj, f"--server {url}, prompt {i}", input_ids=list(prompts[i]))

    bar = progress_bar(len(prompts), "server", "prompt", progress)
    out: List[Optional[Response]] = [None] * len(prompts)
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(prompts)))) as pool:
        futures = {pool.submit(one, i): i for i in range(len(prompts))}
        try:
            for fut in futures:
                out[futures[fut]] = fut.result()
                bar.update(1)
        finally:
            for fut in futures:
                fut.cancel()
            bar.close()
    return out


__all__ = ["post_json", "open_json", "server_flags", "generate"]
