"""Names of the environment that look like the plugin's settings but are none of them (``EAGLE3_CAPTURE_SELFTST``,
``EAGLE3_CAPTURE_DISABLED``, ``EAGLE3_CAPTURE_DUMPDIR``, ``eagle3_capture_dump``, ...): each is found, with the closest
known name, so that settings/switches.py can say so in one line instead of ignoring it.

A misspelt setting is read as unset, which for most settings only loses what was asked (a dump, a tuning value).
For the settings that guard a safety choice (switches.GUARDS: ``EAGLE3_CAPTURE_SELFTEST``, ``EAGLE3_CAPTURE_DISABLE``,
``EAGLE3_CAPTURE_PROFILE_REQUIRED``, and any later one) it serves the opposite of what the operator chose: a misspelt
``EAGLE3_CAPTURE_SELFTEST=raise`` logs a broken capture instead of stopping the server, a misspelt
``EAGLE3_CAPTURE_DISABLE`` keeps on a hook meant to be off, ``EAGLE3_CAPTURE_PROFILE_REQ=1`` serves without the
alarm it asked for. Such a name is a *guard typo*, and the plugin refuses to serve on it, as it does on a malformed
value of those settings.

A name is a near-miss of a guard G (:func:`near_guard`) when its compact form is close to G's (difflib ratio at least
:data:`GUARD_RATIO`), when its words are G's words in any order, each written out or shortened to its first three
letters or more (``REQUIRED_PROFILE``, ``PROFILE_REQ``), or run together in another order (``TEST_SELF``), or when it
starts like G (``SELF...``, ``DISAB...``). It is a
guard typo when G is its closest known name, or when G is about as close as the closest (within
:data:`GUARD_MARGIN`), or when its words are G's: ``EAGLE3_CAPTURE_PROFILE_REQ`` is a shade closer to
``EAGLE3_CAPTURE_PROFILE`` than to ``EAGLE3_CAPTURE_PROFILE_REQUIRED``, and is refused naming the latter. A name that
is clearly closer to another setting (``EAGLE3_CAPTURE_SELFTEST_EVERYY``) is that setting's typo. A name equally
near two known names (the same ratio) cannot be read as either: that is refused too (``tie``).

Pure Python (no torch, no SGLang).
"""
from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

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
GUARD_MARGIN = 0.1  # a guard this close to the closest known name's ratio is as likely meant
NEAR_RATIO = 0.5  # below this the closest name is given as a mere nearest
TIE = 1e-9        # ratios this close are equal (a tie between two known names)
MIN_ABBREV = 3    # a word shortened to this many first letters or more still names the word
REORDER_RATIO = 0.9  # words run together in another order: nearly the guard's own letters
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


def _words(name: str) -> List[str]:
    """The upper-case words of `name` after the package prefix (the whole compact tail as one word where the prefix
    and a word run together)."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    tail = _tail(name) or _compact(name)
    for n in range(len(words) + 1):
        if "".join(words[n:]) == tail:
            return words[n:]
    return [tail]


def _word_like(written: str, word: str) -> bool:
    return (written == word or (len(written) >= MIN_ABBREV and word.startswith(written))
            or difflib.SequenceMatcher(None, written, word, autojunk=False).ratio() >= GUARD_RATIO)


def same_words(name: str, known: str) -> bool:
    """Whether `name`'s words are `known`'s, in any order, each written out, shortened or slightly misspelt (at
    most 4 words are compared: no setting has more)."""
    a, b = _words(name), _words(known)
    if len(a) > 4 or len(b) > 4:
        return False
    whole = "".join(b)
    if len(a) > 1 and any(difflib.SequenceMatcher(None, "".join(p), whole, autojunk=False).ratio() >= REORDER_RATIO
                          for p in itertools.permutations(a)):  # TEST_SELF for SELFTEST
        return True
    return len(a) == len(b) and any(all(_word_like(x, y) for x, y in zip(a, p)) for p in itertools.permutations(b))


def _ratio(name: str, known: str) -> float:
    t = _tail(name)
    tail = t if t is not None else _compact(name)
    return difflib.SequenceMatcher(None, tail, _tail(known) or _compact(known), autojunk=False).ratio()


def near_guard(name: str, guard: str) -> bool:
    """Whether `name` is a near-miss of the guard setting `guard` (see the module's text)."""
    g = _tail(guard) or ""
    tail = _tail(name) or ""
    return (_ratio(name, guard) >= GUARD_RATIO or same_words(name, guard)
            or tail.startswith(_GUARD_STARTS.get(g, ("\0",))))


@dataclass(frozen=True)
class Unknown:
    """A name of the environment that looks like the package's and is not a known one."""

    name: str
    value: str
    closest: str          # the closest known name
    ratio: float          # how close (difflib's ratio of the compact names after the prefix, 0..1)
    guard: Optional[str] = None  # the guard setting it is a typo of (None: not a guard typo)
    tie: Optional[str] = None    # another known name exactly as close as `closest` (None: no tie)

    def shown(self) -> str:
        v = self.value if len(self.value) <= 40 else self.value[:37] + "..."
        return f"{self.name}={v!r}"

    def near(self) -> str:
        """'the closest known name is X' (or that none is close)."""
        if self.ratio >= NEAR_RATIO:
            return f"closest known name: {self.closest}"
        return f"no known name is close; the nearest is {self.closest}"


def ranked(name: str, known: Iterable[str]) -> List[Tuple[str, float]]:
    """Every known name with difflib's ratio of its compact tail to `name`'s, closest first (equal ratios in the
    order given)."""
    return sorted(((k, _ratio(name, k)) for k in known), key=lambda kr: -kr[1])


def closest(name: str, known: Iterable[str]) -> Tuple[str, float]:
    """(the known name closest to `name`, difflib's ratio of their compact tails): ties go to the earlier name."""
    return ranked(name, known)[0]


def guard_meant(name: str, ranks: Sequence[Tuple[str, float]], guards: Iterable[str]) -> Optional[str]:
    """The guard `name` is a typo of (see the module's text), None when it is none's."""
    best, r1 = ranks[0]
    ratio = dict(ranks)
    near = [g for g in guards if near_guard(name, g)]
    if best in near:
        return best
    meant = [g for g in near if same_words(name, g) or ratio.get(g, 0.0) >= r1 - GUARD_MARGIN]
    return max(meant, key=lambda g: ratio.get(g, 0.0)) if meant else None


def unknown_names(environ: Mapping[str, str], settings: Iterable[str], guards: Iterable[str]) -> List[Unknown]:
    """Every name of `environ` that looks like the package's (see the module's text) and is neither one of
    `settings` nor of :data:`OTHER_VARIABLES`, in name order. `guards`: the settings whose typo refuses."""
    known = list(settings) + [v for v in OTHER_VARIABLES if v not in settings]
    guards = list(guards)
    out = []
    for name in sorted(environ):
        if name in known or _tail(name) is None:
            continue
        ranks = ranked(name, known)
        (near, r1), (second, r2) = ranks[0], ranks[1] if len(ranks) > 1 else ("", -1.0)
        guard = guard_meant(name, ranks, guards)
        tie = second if guard is None and r1 >= NEAR_RATIO and r1 - r2 < TIE else None
        out.append(Unknown(name, environ[name], near, r1, guard, tie))
    return out


__all__ = ["PREFIX", "OTHER_VARIABLES", "GUARD_RATIO", "GUARD_MARGIN", "NEAR_RATIO", "Unknown", "closest", "ranked",
           "near_guard", "same_words", "guard_meant", "unknown_names"]
