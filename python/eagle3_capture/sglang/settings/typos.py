"""Names of the environment that look like the plugin's settings but are none of them (``EAGLE3_CAPTURE_SELFTST``,
``EAGLE3_CAPTURE_DISABLED``, ``EAGLE3_CAPTURE_DUMPDIR``, ``eagle3_capture_dump``, ...): each is found, with the closest
known name, so that settings/switches.py can say so in one line instead of ignoring it.

A misspelt setting is read as unset, which for most settings only loses what was asked (a dump, a tuning value).
For the two settings that guard a safety choice it serves the opposite of what the operator chose: a misspelt
``EAGLE3_CAPTURE_SELFTEST=raise`` logs a broken capture instead of stopping the server, a misspelt
``EAGLE3_CAPTURE_DISABLE`` keeps on a hook meant to be off. Such a name is a *guard typo*, and the plugin refuses to
serve on it, as it does on a malformed value of those two settings.

Pure Python (no torch, no SGLang).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Tuple

PREFIX = "EAGLE3_CAPTURE_"

# Variables of this package read outside the plugin's settings (switches.SETTINGS): known, so never reported.
# tests/plugin/test_sglang_setting_names.py checks this against every EAGLE3_CAPTURE_* literal in the package and
# setup.py.
OTHER_VARIABLES = (
    "EAGLE3_CAPTURE_GATHER_BACKEND", "EAGLE3_CAPTURE_GATHER_SIGNAL",    # gather_backend.py
    "EAGLE3_CAPTURE_GATHER_BLOCKS", "EAGLE3_CAPTURE_DECODE_MAX_ROWS",   # tuning.py
    "EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS", "EAGLE3_CAPTURE_FUSED_NORM_THREADS",
    "EAGLE3_CAPTURE_FORCE_CPU", "EAGLE3_CAPTURE_REQUIRE_CUDA",          # setup.py (build time)
)

# Names written without separators and in upper case; a name "looks like" the package's when its compact form
# starts with one of these (EAGLE3_CAPTURE_, eagle3_capture_, EAGLE3CAPTURE_, EAGLE_CAPTURE_).
_PREFIXES = ("EAGLE3CAPTURE", "EAGLECAPTURE")
# A compact name close to a guard's (difflib ratio), or starting like one, is a guard typo when that guard is also
# its closest known name.
GUARD_RATIO = 0.75
NEAR_RATIO = 0.5  # below this the closest name is given as a mere nearest
_GUARD_STARTS = {"SELFTEST": ("SELF",), "DISABLE": ("DISAB",)}


def _compact(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", name.upper())


def _tail(name: str) -> Optional[str]:
    """The compact part after the package prefix, None when `name` does not look like the package's."""
    c = _compact(name)
    for p in _PREFIXES:
        if c.startswith(p):
            return c[len(p):]
    return None


@dataclass(frozen=True)
class Unknown:
    """A name of the environment that looks like the package's and is not a known one."""

    name: str
    value: str
    closest: str          # the closest known name
    ratio: float          # how close (difflib's ratio of the compact names after the prefix, 0..1)
    guard: bool           # a typo of a guard (closest is one of `guards` and close enough)

    def shown(self) -> str:
        v = self.value if len(self.value) <= 40 else self.value[:37] + "..."
        return f"{self.name}={v!r}"

    def near(self) -> str:
        """'the closest known name is X' (or that none is close)."""
        if self.ratio >= NEAR_RATIO:
            return f"closest known name: {self.closest}"
        return f"no known name is close; the nearest is {self.closest}"


def closest(name: str, known: Iterable[str]) -> Tuple[str, float]:
    """(the known name closest to `name`, difflib's ratio of their compact tails): ties go to the earlier name."""
    t = _tail(name)
    tail = t if t is not None else _compact(name)
    best, score = "", -1.0
    for k in known:
        r = difflib.SequenceMatcher(None, tail, _tail(k), autojunk=False).ratio()
        if r > score:
            best, score = k, r
    return best, score


def unknown_names(environ: Mapping[str, str], settings: Iterable[str], guards: Iterable[str]) -> List[Unknown]:
    """Every name of `environ` that looks like the package's (see the module's text) and is neither one of
    `settings` nor of :data:`OTHER_VARIABLES`, in name order. `guards`: the settings whose typo refuses."""
    known = list(settings) + [v for v in OTHER_VARIABLES if v not in settings]
    guard_tails = {_tail(g): g for g in guards}
    out = []
    for name in sorted(environ):
        if name in known or _tail(name) is None:
            continue
        near, ratio = closest(name, known)
        g = guard_tails.get(_tail(near))
        tail = _tail(name) or ""
        guard = g is not None and (ratio >= GUARD_RATIO or tail.startswith(_GUARD_STARTS.get(_tail(g), ("\0",))))
        out.append(Unknown(name, environ[name], near, ratio, guard))
    return out


__all__ = ["PREFIX", "OTHER_VARIABLES", "GUARD_RATIO", "NEAR_RATIO", "Unknown", "closest", "unknown_names"]
