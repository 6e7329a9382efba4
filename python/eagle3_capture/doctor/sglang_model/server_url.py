"""The ``--server`` of ``doctor online``: an ``http(s)://host[:port][/path]`` URL of a running SGLang server, checked
before any request (urllib raises a bare ValueError or ``http.client.InvalidURL`` on a malformed one, mid-run),
or a JSONL file of recorded responses."""
from __future__ import annotations

import os
import urllib.parse

from ..common import DoctorError

SCHEMES = ("http://", "https://")


def is_url(text: str) -> bool:
    return isinstance(text, str) and text.lower().startswith(SCHEMES)


def server_url(text: str) -> str:
    """The base URL (no trailing slash) of a well-formed ``http(s)://host[:port][/path]``, else a DoctorError
    saying what is wrong with it."""
    want = "expected http(s)://HOST[:PORT][/PATH] of a running SGLang server"
    bad = next((ch for ch in text if ch.isspace() or ord(ch) < 32 or ord(ch) == 127), None)
    if bad is not None:
        raise DoctorError(f"--server {text!r}: a URL holds no whitespace or control characters (found {bad!r}); "
                          f"{want}")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # ValueError for a port that is not a number in 0..65535
        host = parts.hostname
    except ValueError as e:
        raise DoctorError(f"--server {text!r}: not a URL ({e}); {want}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise DoctorError(f"--server {text!r}: scheme {parts.scheme!r}; {want}")
    if not host:
        raise DoctorError(f"--server {text!r}: no host; {want}")
    if port is not None and not 1 <= port <= 65535:
        raise DoctorError(f"--server {text!r}: port {port} is not in 1..65535")
    if parts.query or parts.fragment:
        raise DoctorError(f"--server {text!r}: a query or fragment has no place in the server's base URL; {want}")
    return text.rstrip("/")


def server_source(text: str) -> str:
    """A checked URL, or the path of an existing recorded-responses file."""
    if is_url(text):
        return server_url(text)
    if not os.path.exists(text):
        raise DoctorError(f"--server {text!r}: neither an http(s):// URL nor an existing JSONL file of recorded "
                          "responses")
    if os.path.isdir(text):
        raise DoctorError(f"--server {text!r}: a directory, not a JSONL file of recorded responses")
    return text


__all__ = ["is_url", "server_url", "server_source"]
