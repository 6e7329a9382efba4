"""One reading of a server's ``/metrics``, judged whole before any figure is taken from it. Engine-neutral: what the
reading must hold is a :class:`Schema` (the sample names of the verify and per-position counters, the position
label and its first value, the gauges and their ranges), so a reader of another engine's metrics passes its own.

A reading is refused -- a :class:`ReadingError`, one line saying why, never a figure -- when:

- the answer is not complete: it did not arrive within the reading's deadline (:func:`fetch`: the deadline is for
  the whole reading, connection, headers and body; a server that drips bytes fails it), or its body is shorter than
  its ``Content-Length`` (a page cut at a line boundary parses, and would lose series);
- it is not the Prometheus text format, or a sample appears twice (the same name and labels: summing them would
  double a rate);
- a label breaks the one rule for positions (:func:`position_of`: a canonical decimal integer, so ``"01"`` is refused
  as ``"1.0"`` and ``" 1"`` are);
- a value is not finite, a counter is negative, a gauge is out of its range;
- an expected series is missing: the verify counter, and for every position 1..P the attempts and accepted counters
  (P: the largest position any of them names; a gap, or a position with one counter and not the other, is a
  missing series);
- the counters contradict each other, per model: at a position, accepted > attempts; attempts at position k+1 >
  accepted at k (position k+1 is reached only through an accepted k); attempts at the first position > verifies.
  Together these bound the accept length by positions + 1.

The plugin's flush raises verifies first, then attempts and accepted position by position, so a reading taken in the
middle of a flush still satisfies every relation above; they are exact, not statistical.
"""
from __future__ import annotations

import http.client
import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..common import DoctorError, shown

MAX_BODY_BYTES = 64 << 20   # a /metrics page; SGLang's is some hundred kilobytes
MAX_POSITIONS = 64          # the profile's bound on draft steps


class ReadingError(DoctorError):
    """A reading that cannot be judged: the message is one line naming the page and why."""


@dataclass(frozen=True)
class Schema:
    """What one engine's acceptance metrics look like on ``/metrics`` (sample names as exposed, counters with their
    ``_total``)."""

    verifies: str                            # verifies (one per request and verify)
    attempts: str                            # per position: verifies that reached it
    accepted: str                            # per position: verifies that accepted it
    position_label: str = "position"
    first_position: int = 1                  # the label value of the first draft position
    model_label: str = "model_name"
    other_counters: Tuple[str, ...] = ()     # further counters of the engine's (checked >= 0, not required)
    gauges: Mapping[str, Tuple[float, float]] = field(default_factory=dict)  # name -> (lo, hi)
    positional: Tuple[str, ...] = ()         # other samples that carry the position label
    prefix: str = ""                         # the engine's metric prefix (to say "no metrics of it")

    @property
    def counters(self) -> Tuple[str, ...]:
        return (self.verifies, self.attempts, self.accepted) + self.other_counters

    def names_position(self, sample: str) -> bool:
        return sample in (self.attempts, self.accepted) or sample in self.positional


Labels = Tuple[Tuple[str, str], ...]


@dataclass
class Sample:
    name: str
    labels: Dict[str, str]
    value: float

    @property
    def key(self) -> Tuple[str, Labels]:
        return self.name, tuple(sorted(self.labels.items()))


@dataclass
class Reading:
    """The samples of one judged reading (only the schema's), keyed by name and labels, with positions parsed."""

    samples: Dict[Tuple[str, Labels], Sample]
    positions: Dict[str, List[int]]          # per model: the positions 1..P its counters name
    models: Tuple[str, ...]
    others: int = 0                          # samples of other names (the engine's own, the process's)

    def counters(self, schema: Schema) -> Dict[Tuple[str, Labels], float]:
        return {k: s.value for k, s in self.samples.items() if s.name in schema.counters}


# ----------------------------------------------------------------------------------------------------------------
# the one label rule
# ----------------------------------------------------------------------------------------------------------------

_CANONICAL = re.compile(r"0|[1-9][0-9]{0,5}")


def position_of(text: Optional[str], first: int = 1, where: str = "") -> int:
    """The draft position a label value names, counted from 1: a canonical decimal integer (no sign, no leading
    zero, no space, no decimal point), ``first`` naming the first position. ReadingError otherwise."""
    if text is None or not _CANONICAL.fullmatch(text) or not first <= int(text) < first + MAX_POSITIONS:
        raise ReadingError(f"{where}label position={shown(text)}; expected a draft position written as a decimal "
                           f"integer in {first}..{first + MAX_POSITIONS - 1} without sign, leading zero or spaces")
    return int(text) - first + 1


# ----------------------------------------------------------------------------------------------------------------
# fetching: one deadline for the whole reading, the body checked against its Content-Length
# ----------------------------------------------------------------------------------------------------------------

def fetch(url: str, deadline_s: float, hint: str = "") -> bytes:
    """The body of GET `url`, complete, within `deadline_s` seconds from now for the whole reading (connect,
    headers, body); ReadingError saying why there is none. `hint` is added to an HTTP 404's line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ReadingError(f"{url}: expected an http(s) URL")
    end = time.monotonic() + deadline_s
    timed_out = threading.Event()
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    kw = {"context": ssl.create_default_context()} if parts.scheme == "https" else {}
    try:
        conn = conn_cls(parts.hostname, parts.port, timeout=deadline_s, **kw)
    except ValueError as e:  # a port out of range
        raise ReadingError(f"{url}: {e}") from None

    sock = None

    def cut() -> None:  # the deadline: whatever the socket is waiting for ends now
        timed_out.set()
        for s in (sock, conn.sock):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    watchdog = threading.Timer(deadline_s, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        sock = conn.sock  # kept: http.client lets go of it once the answer says Connection: close
        if timed_out.is_set():
            raise TimeoutError("connecting took the whole deadline")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain"})
        r = conn.getresponse()
        if r.status != 200:
            reason = f"HTTP {r.status} {r.reason}" + (f" ({hint})" if hint and r.status == 404 else "")
            raise ReadingError(f"{url}: {reason}")
        declared = r.getheader("Content-Length")
        data = r.read(MAX_BODY_BYTES + 1)
        if len(data) > MAX_BODY_BYTES:
            raise ReadingError(f"{url}: more than {MAX_BODY_BYTES} bytes; expected a Prometheus /metrics page")
        if timed_out.is_set():
            raise ReadingError(f"{url}: the reading did not complete within {deadline_s:g} s (the server sent part "
                               "of it and then stalled or dripped)")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                raise ReadingError(f"{url}: Content-Length {shown(declared)} is not a number") from None
            if len(data) != n:
                raise ReadingError(f"{url}: {len(data)} of the {n} bytes its Content-Length promises: a cut-short "
                                   "answer, not judged")
        return data
    except ReadingError:
        raise
    except (socket.timeout, TimeoutError) as e:
        raise ReadingError(f"{url}: no complete reading within {deadline_s:g} s ({e or 'timed out'})") from None
    except (http.client.IncompleteRead, http.client.HTTPException, OSError, ValueError) as e:
        if timed_out.is_set() or time.monotonic() >= end:
            raise ReadingError(f"{url}: the reading did not complete within {deadline_s:g} s (the server sent part "
                               "of it and then stalled or dripped)") from None
        if isinstance(e, ConnectionRefusedError) or isinstance(e, socket.gaierror):
            raise ReadingError(f"{url}: cannot reach the server ({e})") from None
        raise ReadingError(f"{url}: no usable answer ({type(e).__name__}: {shown(str(e), 120)})") from None
    finally:
        watchdog.cancel()
        conn.close()
        if sock is not None:
            sock.close()


# ----------------------------------------------------------------------------------------------------------------
# judging a page whole
# ----------------------------------------------------------------------------------------------------------------

def parse_samples(text: str, where: str) -> List[Sample]:
    """Every sample of a page in the Prometheus text format; ReadingError on anything that is not."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # noqa: BLE001 - the parser raises whatever its code meets on a malformed page
        raise ReadingError(f"{where}: not the Prometheus text format ({type(e).__name__}: {shown(str(e), 120)})"
                           ) from None
    return [Sample(s.name, dict(s.labels), s.value) for f in families for s in f.samples]


def judge(samples: Sequence[Sample], schema: Schema, where: str) -> Reading:
    """The schema's samples of a reading, every rule of the module's text checked; ReadingError on the first
    broken one."""
    kept: Dict[Tuple[str, Labels], Sample] = {}
    others = 0
    wanted = set(schema.counters) | set(schema.gauges) | set(schema.positional)
    for s in samples:
        if s.name not in wanted:
            others += 1
            continue
        label = f"{s.name}{shown(s.labels, 160)}"
        if s.key in kept:
            raise ReadingError(f"{where}: {label} appears twice in one reading (summing them would double its "
                               "rate); not judged")
        v = s.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ReadingError(f"{where}: {label} = {v!r}; expected a finite number")
        if s.name in schema.counters and v < 0:
            raise ReadingError(f"{where}: counter {label} = {v:g}; a counter is never negative")
        if s.name in schema.gauges:
            lo, hi = schema.gauges[s.name]
            if not lo <= v <= hi:
                raise ReadingError(f"{where}: {label} = {v:g}; expected a value in [{lo:g}, {hi:g}]")
        if schema.names_position(s.name):
            position_of(s.labels.get(schema.position_label), schema.first_position, f"{where}: {s.name}: ")
        kept[s.key] = s
    if not any(s.name in schema.counters for s in kept.values()):
        raise ReadingError(f"{where}: no {schema.prefix or schema.verifies}* counters in it")
    return Reading(kept, _check_counters(kept, schema, where), _models(kept, schema), others)


def _models(kept, schema: Schema) -> Tuple[str, ...]:
    return tuple(sorted({s.labels.get(schema.model_label, "") for s in kept.values()
                         if schema.model_label in s.labels}))


def _per_model(kept, schema: Schema, name: str) -> Dict[str, Dict[int, float]]:
    """model -> position -> the counter's value, summed over any further labels (None position: no label)."""
    out: Dict[str, Dict[int, float]] = {}
    for s in kept.values():
        if s.name == name:
            p = position_of(s.labels.get(schema.position_label), schema.first_position) \
                if schema.names_position(name) else 0
            d = out.setdefault(s.labels.get(schema.model_label, ""), {})
            d[p] = d.get(p, 0.0) + s.value
    return out


def _check_counters(kept, schema: Schema, where: str) -> Dict[str, List[int]]:
    verifies = _per_model(kept, schema, schema.verifies)
    attempts = _per_model(kept, schema, schema.attempts)
    accepted = _per_model(kept, schema, schema.accepted)
    models = sorted(set(verifies) | set(attempts) | set(accepted))
    positions = {}
    for m in models:
        who = f"{where}: " + (f"model {m!r}: " if m else "")
        if m not in verifies:
            raise ReadingError(f"{who}no {schema.verifies} series beside the per-position counters: a series is "
                               "missing from this reading; not judged")
        att, acc = attempts.get(m, {}), accepted.get(m, {})
        top = max(list(att) + list(acc) + [0])
        missing = [f"{schema.attempts}{{position={p + schema.first_position - 1}}}" for p in range(1, top + 1)
                   if p not in att] + \
                  [f"{schema.accepted}{{position={p + schema.first_position - 1}}}" for p in range(1, top + 1)
                   if p not in acc]
        if missing:
            raise ReadingError(f"{who}{len(missing)} series missing ({', '.join(missing[:3])}"
                               f"{', ...' if len(missing) > 3 else ''}) of positions 1..{top}: a partial reading; "
                               "not judged")
        v = verifies[m][0]
        for p in range(1, top + 1):
            shown_p = p + schema.first_position - 1
            if acc[p] > att[p]:
                raise ReadingError(f"{who}position {shown_p}: {acc[p]:g} accepted of {att[p]:g} attempts: a draft "
                                   "cannot be accepted more often than it was verified; impossible counters, not "
                                   "judged")
            before = v if p == 1 else acc[p - 1]
            if att[p] > before:
                what = f"{before:g} verifies" if p == 1 else f"{before:g} accepted at position {shown_p - 1}"
                raise ReadingError(f"{who}position {shown_p}: {att[p]:g} attempts after {what}: a position is "
                                   "reached only through every earlier one accepted; impossible counters, not "
                                   "judged")
        positions[m] = list(range(1, top + 1))
    return positions


def read_page(text: str, schema: Schema, where: str) -> Reading:
    """A page's text parsed and judged whole."""
    return judge(parse_samples(text, where), schema, where)


__all__ = ["ReadingError", "Schema", "Sample", "Reading", "position_of", "fetch", "parse_samples", "judge",
           "read_page", "MAX_BODY_BYTES", "MAX_POSITIONS"]
