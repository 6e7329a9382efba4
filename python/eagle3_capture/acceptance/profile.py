"""The expected-acceptance profile: per draft position, the acceptance a draft should get against its target under
given server flags, with its sample size. ``doctor accept`` and ``doctor online`` write it (from the histogram of
correct drafts they predict); the plugin (``EAGLE3_CAPTURE_PROFILE``) and ``doctor watch --profile`` read it.

This module is the format's one owner. A JSON object::

    {"format": "eagle3-capture/acceptance-profile", "version": 1,
     "source": "doctor accept",            # or "doctor online"
     "draft": "...", "target": "...",      # as given to the doctor (informative)
     "created": "2026-12-03T16:00:00Z",
     "speculative": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
     "prompts": 8,
     "correct_drafts_histogram": [h0, h1, ...],   # verifies that accepted k drafts, summed over the prompts
     "verifies": sum(h), "accept_length": ...,
     "positions": [{"position": 1, "attempts": ..., "accepted": ..., "acceptance": ...}, ...]}

``positions`` (each row's attempts, accepted and acceptance) and ``accept_length`` are derived from the histogram
(positions.py) and checked against it on read, so a hand-edited file that contradicts itself is refused: an
acceptance of 1.5, a negative one, or one that is not accepted / attempts. Reading never trusts the file: a path that
is not a regular file, more than :data:`MAX_BYTES`, not JSON, nested deeper than :data:`MAX_DEPTH` (checked on the
raw text before it is decoded, so a file of 200000 ``[`` is one line, not a RecursionError), a number longer than
:data:`MAX_NUMBER_CHARS` characters (checked before it is converted: no 5000-digit integer reaches ``int()``), a NaN
or an infinity, a wrong format or version, a non-integer or negative count, flags out of range: each is a
:class:`ProfileError` with one line naming the file and saying what was expected and what was found.
:func:`read` is the one reader, for the plugin (``EAGLE3_CAPTURE_PROFILE``) and ``doctor watch --profile`` alike;
it raises nothing else.
"""
from __future__ import annotations

import itertools
import json
import math
import numbers
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .positions import accept_length, attempts_accepted

FORMAT = "eagle3-capture/acceptance-profile"
VERSION = 1
MAX_BYTES = 1 << 20
MAX_STEPS = 64
MAX_COUNT = 10 ** 15
MAX_DEPTH = 16          # a profile nests 3 deep (object > positions list > row)
MAX_NUMBER_CHARS = 40   # any count up to MAX_COUNT, or a float written with 17 significant digits and an exponent
SOURCES = ("doctor accept", "doctor online")


class ProfileError(ValueError):
    """A profile that cannot be used: the message is one line naming the file, what was expected and what was found."""


@dataclass(frozen=True)
class Speculative:
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    def text(self) -> str:
        return (f"--speculative-num-steps {self.num_steps} --speculative-eagle-topk {self.eagle_topk} "
                f"--speculative-num-draft-tokens {self.num_draft_tokens}")


@dataclass(frozen=True)
class Profile:
    source: str
    speculative: Speculative
    histogram: Tuple[int, ...]       # correct drafts per verify, num_steps + 1 bins
    prompts: int
    draft: str = ""
    target: str = ""
    created: str = ""
    path: str = ""                   # where it was read from

    @property
    def positions(self) -> int:
        return self.speculative.num_steps

    @property
    def verifies(self) -> int:
        return sum(self.histogram)

    def attempts_accepted(self) -> Tuple[List[int], List[int]]:
        return attempts_accepted(self.histogram, self.positions)

    def acceptance(self) -> List[Optional[float]]:
        """Per position: accepted / attempts (None where no verify reached it)."""
        att, acc = self.attempts_accepted()
        return [a / n if n else None for n, a in zip(att, acc)]

    @property
    def accept_length(self) -> float:
        return accept_length(self.histogram)

    def to_json(self) -> Dict[str, Any]:
        att, acc = self.attempts_accepted()
        return {"format": FORMAT, "version": VERSION, "source": self.source, "draft": self.draft,
                "target": self.target, "created": self.created,
                "speculative": {"num_steps": self.speculative.num_steps, "eagle_topk": self.speculative.eagle_topk,
                                "num_draft_tokens": self.speculative.num_draft_tokens},
                "prompts": self.prompts, "correct_drafts_histogram": list(self.histogram),
                "verifies": self.verifies, "accept_length": self.accept_length,
                "positions": [{"position": p + 1, "attempts": n, "accepted": a, "acceptance": (a / n if n else None)}
                              for p, (n, a) in enumerate(zip(att, acc))]}


def make(source: str, speculative: Speculative, histogram: Sequence[int], prompts: int, draft: str = "",
         target: str = "") -> Profile:
    """A profile from a predicted histogram (validated as a read one is)."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r}: expected one of {list(SOURCES)}")

    def count(x):  # numpy / torch integers as ints; anything else is left for from_json to refuse
        return int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else x

    # only the primary fields: from_json checks them all (an empty or too long histogram is a ProfileError, not
    # a ValueError out of the derived fields) and derives the rest
    data = {"format": FORMAT, "version": VERSION, "source": source, "draft": draft, "target": target,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "speculative": {"num_steps": count(speculative.num_steps), "eagle_topk": count(speculative.eagle_topk),
                            "num_draft_tokens": count(speculative.num_draft_tokens)},
            "prompts": count(prompts), "correct_drafts_histogram": [count(x) for x in histogram]}
    return from_json(data, "<new profile>")


def write(profile: Profile, path: str) -> str:
    """Write atomically (a temporary file in the same directory, then renamed); returns the absolute path. Raises
    ProfileError when the directory is missing or not writable."""
    path = os.path.abspath(os.path.expanduser(path))
    d = os.path.dirname(path)
    if os.path.isdir(path):
        raise ProfileError(f"profile {path}: is a directory; expected a file path")
    if not os.path.isdir(d):
        raise ProfileError(f"profile {path}: the directory {d} does not exist")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(profile.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ProfileError(f"profile {path}: cannot be written ({e.strerror or e})") from None
    return path


def read(path: str) -> Profile:
    """Read and validate a profile file (ProfileError on anything wrong, and nothing else)."""
    shown = path
    if not isinstance(path, str) or not path.strip():
        raise ProfileError(f"profile {path!r}: an empty path; expected the path of a JSON file written by "
                           "`eagle3-capture doctor accept|online --profile-out`")
    try:
        path = os.path.abspath(os.path.expanduser(path))
        st = os.stat(path)
    except (OSError, ValueError) as e:
        raise ProfileError(f"profile {shown}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    import stat as _stat
    if not _stat.S_ISREG(st.st_mode):
        raise ProfileError(f"profile {path}: not a regular file; expected a JSON file written by "
                           "`eagle3-capture doctor accept|online --profile-out`")
    if st.st_size > MAX_BYTES:
        raise ProfileError(f"profile {path}: {st.st_size} bytes; a profile is a small JSON file (at most "
                           f"{MAX_BYTES} bytes)")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:  # grew since the stat
            raise ProfileError(f"more than {MAX_BYTES} bytes; a profile is a small JSON file")
        data = loads(raw.decode("utf-8"))
    except OSError as e:
        raise ProfileError(f"profile {path}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile {path}: not JSON ({e}); expected a file written by "
                           "`eagle3-capture doctor accept|online --profile-out`") from None
    except ProfileError as e:
        raise ProfileError(f"profile {path}: {e}") from None
    return from_json(data, path)


def _no_constant(name: str):
    raise ProfileError(f"{name} in the file; expected finite numbers only")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text, strings skipped (an unterminated string is left to
    the decoder, which refuses it)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub('""', text))
    steps = (1 if c in "[{" else -1 for c in brackets)
    return max(itertools.accumulate(steps, initial=0))


def _number(kind):
    def parse(text: str):
        if len(text) > MAX_NUMBER_CHARS:
            raise ProfileError(f"a number of {len(text)} characters ({text[:12]}...); expected counts up to "
                               f"{MAX_COUNT} and plain decimals")
        v = kind(text)
        if isinstance(v, float) and not math.isfinite(v):
            raise ProfileError(f"the number {text} is not finite as a float; expected finite numbers only")
        return v
    return parse


def loads(text: str) -> Any:
    """JSON text decoded within bounds: nesting at most :data:`MAX_DEPTH` (checked before decoding: the decoder
    recurses), numbers at most :data:`MAX_NUMBER_CHARS` characters (checked before conversion), no NaN / Infinity;
    ProfileError (without the file's name) when a bound is passed, json.JSONDecodeError when it is not JSON."""
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise ProfileError(f"nested {depth} deep; a profile nests {MAX_DEPTH} deep at most (3 as written)")
    return json.loads(text, parse_constant=_no_constant, parse_int=_number(int), parse_float=_number(float))


def _int(where: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProfileError(f"{where}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def from_json(data: Any, path: str) -> Profile:
    """Validate a decoded profile (ProfileError naming `path`)."""
    def fail(msg: str):
        raise ProfileError(f"profile {path}: {msg}")

    if not isinstance(data, dict):
        fail(f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        fail(f"format {data.get('format')!r}; expected {FORMAT!r}")
    if data.get("version") != VERSION:
        fail(f"version {data.get('version')!r}; this eagle3-capture reads version {VERSION}")
    source = data.get("source")
    if source not in SOURCES:
        fail(f"source {source!r}; expected one of {list(SOURCES)}")
    spec = data.get("speculative")
    if not isinstance(spec, dict):
        fail(f"'speculative' is {type(spec).__name__}; expected an object with num_steps, eagle_topk, "
             "num_draft_tokens")
    try:
        s = Speculative(_int("speculative.num_steps", spec.get("num_steps"), 1, MAX_STEPS),
                        _int("speculative.eagle_topk", spec.get("eagle_topk"), 1, 1024),
                        _int("speculative.num_draft_tokens", spec.get("num_draft_tokens"), 2, 1 << 16))
        hist = data.get("correct_drafts_histogram")
        if not isinstance(hist, list) or not hist:
            raise ProfileError(f"correct_drafts_histogram: expected a non-empty list of counts, got {hist!r:.80}")
        if len(hist) > s.num_steps + 1:
            raise ProfileError(f"correct_drafts_histogram has {len(hist)} bins; with num_steps {s.num_steps} a "
                               f"verify accepts 0..{s.num_steps} drafts ({s.num_steps + 1} bins)")
        h = [_int(f"correct_drafts_histogram[{i}]", v, 0, MAX_COUNT) for i, v in enumerate(hist)]
        h += [0] * (s.num_steps + 1 - len(h))
        if sum(h) == 0:
            raise ProfileError("correct_drafts_histogram counts no verify; a profile needs a sample")
        prompts = _int("prompts", data.get("prompts"), 1, MAX_COUNT)
    except ProfileError as e:
        fail(str(e))
    for key in ("draft", "target", "created"):
        if not isinstance(data.get(key, ""), str):
            fail(f"{key}: expected a string, got {type(data.get(key)).__name__}")
    p = Profile(source, s, tuple(h), prompts, data.get("draft", ""), data.get("target", ""),
                data.get("created", ""), path)
    _check_derived(p, data, fail)
    return p


def _check_derived(p: Profile, data: Dict[str, Any], fail) -> None:
    """The derived fields, when present, must agree with the histogram."""
    if "verifies" in data and data["verifies"] != p.verifies:
        fail(f"verifies {data['verifies']!r} but the histogram sums to {p.verifies}")
    al = data.get("accept_length")
    if al is not None and (not isinstance(al, (int, float)) or isinstance(al, bool) or not math.isfinite(al)
                           or abs(al - p.accept_length) > 1e-9 * max(1.0, p.accept_length)):
        fail(f"accept_length {al!r} but the histogram gives {p.accept_length:.6f}")
    rows = data.get("positions")
    if rows is None:
        return
    att, acc = p.attempts_accepted()
    if not isinstance(rows, list) or len(rows) != p.positions:
        fail(f"positions: expected a list of {p.positions} rows (one per draft step), got {rows!r:.80}")
    for i, r in enumerate(rows):
        want = (i + 1, att[i], acc[i])
        got = (r.get("position"), r.get("attempts"), r.get("accepted")) if isinstance(r, dict) else None
        if got is None or any(isinstance(v, bool) or not isinstance(v, int) for v in got) or got != want:
            fail(f"positions[{i}] is {r!r:.120}; the histogram gives position {i + 1}: attempts {att[i]}, "
                 f"accepted {acc[i]}")
        if "acceptance" in r:
            _check_acceptance(i, r["acceptance"], att[i], acc[i], fail)


def _check_acceptance(i: int, a: Any, attempts: int, accepted: int, fail) -> None:
    """A row's acceptance: accepted / attempts of the histogram (None where no verify reached the position)."""
    if attempts == 0:
        if a is not None:
            fail(f"positions[{i}].acceptance is {a!r}; no verify reached position {i + 1} (attempts 0): expected "
                 "null")
        return
    want = accepted / attempts
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
        fail(f"positions[{i}].acceptance is {a!r:.40}; an acceptance is a share in [0, 1] (the histogram gives "
             f"{want:.6f})")
    if abs(a - want) > 1e-9:
        fail(f"positions[{i}].acceptance is {a!r}; the histogram gives {accepted}/{attempts} = {want:.6f}")


__all__ = ["FORMAT", "VERSION", "MAX_BYTES", "MAX_DEPTH", "MAX_NUMBER_CHARS", "SOURCES", "Profile", "ProfileError",
           "Speculative", "make", "read", "write", "from_json", "loads"]
