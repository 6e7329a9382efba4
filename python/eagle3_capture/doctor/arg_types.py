"""Value types of the doctor's flags: each turns the command-line string into the value or raises
``argparse.ArgumentTypeError`` saying what it expected and what it got, so that argparse ends the command with one
line naming the flag and exit code 2 -- before any model is loaded or any work is done.

Output paths are checked the same way: an output file must not be a directory or a special file (a device), an
output directory must not be a file, and the nearest existing folder above either must be a directory a file can
be created in (tried for real: as root, ``os.access`` says yes everywhere). Sizes are bounded here where the bound
is known before any model loads (threads: the CPU count) and in ``bounds`` where it comes from the models.
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from typing import Callable, Optional

SEED_MAX = 2 ** 63 - 1  # torch.manual_seed takes a signed 64-bit value


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {v}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def seed(text: str) -> int:
    try:
        v = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer seed in 0..2**63-1, got {text!r}") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer seed in 0..2**63-1, got {v}")
    return v


def finite_float(low: Optional[float] = None, high: Optional[float] = None, *, low_open: bool = False,
                 high_open: bool = False) -> Callable[[str], float]:
    """A finite float in the interval given (open at an end where that end's flag says so)."""
    lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    want = f"a number in {lo}, {hi}" if lo and hi else (f"a number > {low:g}" if lo and low_open else
                                                        f"a number >= {low:g}" if lo else "a finite number")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        if low is not None and (v < low or (low_open and v == low)):
            raise argparse.ArgumentTypeError(f"expected {want}, got {v:g}")
        if high is not None and (v > high or (high_open and v == high)):
            raise argparse.ArgumentTypeError(f"expected {want}, got {v:g}")
        return v

    parse.__name__ = want
    return parse


def _nearest_existing(path: str) -> str:
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return d


def _can_create_in(d: str) -> bool:
    """Whether a file can be created in directory d, tried for real: os.access says yes to root everywhere, also
    on /proc and /sys, where creating a file fails."""
    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".eagle3-capture-probe-"):
            pass
    except OSError:
        return False
    return True


def _writable_parent(path: str) -> None:
    d = _nearest_existing(path)
    if not os.path.isdir(d):
        raise argparse.ArgumentTypeError(f"{path!r}: {d} is a file, not a directory to write into")
    if not os.access(d, os.W_OK | os.X_OK) or not _can_create_in(d):
        raise argparse.ArgumentTypeError(f"{path!r}: directory {d} is not writable")


def output_file(text: str) -> str:
    """A file path to write: not a directory, not a device or another special file (the writers replace the path
    with a new file: a device node would be gone), in a directory a file can be created in."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file path to write")
    if os.path.exists(text) and not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a regular file (a device, pipe or socket); "
                                         "expected a file path to write")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not writable")
    _writable_parent(text)
    return text


def png_file(text: str) -> str:
    """An output file whose name ends in .png (the figure is written as a PNG whatever the name says)."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in .png, got {text!r}")
    return output_file(text)


def output_dir(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a directory path, got ''")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file; expected a directory to write into")
    if os.path.isdir(text):
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"directory {text!r} is not writable")
        if not _can_create_in(text):
            raise argparse.ArgumentTypeError(f"directory {text!r} is not writable")
    else:
        _writable_parent(os.path.join(text, "x"))
    return text


def threads(text: str) -> int:
    """CPU threads: 1 .. this machine's CPU count (torch crashes on absurd counts; more threads than CPUs only
    spin against each other)."""
    cores = os.cpu_count() or 1
    try:
        v = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{cores} (this machine's CPUs), got {text!r}"
                                         ) from None
    if not 1 <= v <= cores:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{cores} (this machine's CPUs), got {v}")
    return v


def server(text: str) -> str:
    """``doctor online --server``: a well-formed http(s) URL (its base, no trailing slash) or an existing
    recorded-responses file. The only check of it: the command takes the value as checked."""
    from .sglang_model.server_url import server_source

    return _as_type_error(server_source, text)


def url(text: str) -> str:
    """``doctor fingerprint --server``: a well-formed http(s) URL of a running server (its base)."""
    from .sglang_model.server_url import server_url

    return _as_type_error(server_url, text)


def _as_type_error(check: Callable[[str], str], text: str) -> str:
    """``check(text)``, its DoctorError as argparse's error (which names the flag itself)."""
    from .common import DoctorError

    try:
        return check(text)
    except DoctorError as e:
        raise argparse.ArgumentTypeError(str(e).replace(f"--server {text!r}: ", "")) from None


def sglang_version(text: str) -> str:
    """``--sglang-version``: a release this package models (sglang_releases.KNOWN_VERSIONS)."""
    from ..sglang_releases import release

    try:
        return release(text).version
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def vllm_version(text: str) -> str:
    """``--vllm-version``: a vLLM release this package models (vllm_rules.VLLM_KNOWN_VERSIONS)."""
    from ..vllm_rules import vllm_release

    try:
        return vllm_release(text).version
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


ENGINES = ("sglang", "vllm")


def engine(text: str) -> str:
    """``doctor check --engine``: sglang or vllm."""
    if text not in ENGINES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(ENGINES)}, got {text!r}")
    return text


POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)
THREADS = threads

__all__ = ["int_at_least", "seed", "finite_float", "output_file", "png_file", "output_dir", "threads", "server", "url",
           "sglang_version", "vllm_version", "engine", "ENGINES", "POSITIVE", "NON_NEGATIVE", "THREADS", "SEED_MAX"]
