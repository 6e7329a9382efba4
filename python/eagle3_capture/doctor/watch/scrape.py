"""A server's ``/metrics`` read into the plugin's figures: GET ``<URL>/metrics``, the Prometheus text format parsed by
``prometheus_client.parser``, and the ``eagle3_capture:*`` samples (names: ``acceptance.names``) gathered into a
:class:`Snapshot`.

Several series of one metric are combined: counters are summed over every label but the ones kept (a server's
multiprocess collector, or several served models, give one series each), gauges take their largest value (an alarm
anywhere is an alarm; the plugin's processes agree on the expected figures). Everything is checked, since the body
is untrusted: a value that is not finite, a negative counter, a position that is not an integer in
1..:data:`MAX_POSITIONS`, a gauge out of its range -- each a one-line :class:`~..common.DoctorError`.
"""
from __future__ import annotations

import http.client
import math
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ...acceptance import names
from ..common import DoctorError, shown

MAX_POSITIONS = 64          # the profile's bound on draft steps
MAX_BODY_BYTES = 64 << 20   # a /metrics page; SGLang's is some hundred kilobytes
ENABLE = ("the server must run the eagle3-capture plugin with SGLang's --enable-metrics (its metrics are "
          f"{names.PREFIX}*)")


@dataclass
class Snapshot:
    """The plugin's figures on one reading of ``/metrics`` (counters summed, gauges at their largest)."""

    verifies: float = 0.0
    attempts: Dict[int, float] = field(default_factory=dict)       # per position
    accepted: Dict[int, float] = field(default_factory=dict)
    alarms: Dict[int, float] = field(default_factory=dict)         # the ALARMS counter, per position
    selftest_runs: Dict[str, float] = field(default_factory=dict)  # by result
    selftest_failures: float = 0.0
    expected: Dict[int, float] = field(default_factory=dict)       # EXPECTED_ACCEPTANCE gauges
    expected_accept_length: Optional[float] = None
    drift: Dict[int, float] = field(default_factory=dict)
    alarm: Dict[int, float] = field(default_factory=dict)
    capture_broken: Dict[str, float] = field(default_factory=dict)  # by tp_rank
    models: Tuple[str, ...] = ()

    def counters(self) -> Dict[str, float]:
        """Every counter by a flat key (for reset detection)."""
        out = {"verifies": self.verifies, "selftest_failures": self.selftest_failures}
        for key, d in (("attempts", self.attempts), ("accepted", self.accepted), ("alarms", self.alarms),
                       ("selftest_runs", self.selftest_runs)):
            out.update({f"{key}[{k}]": v for k, v in d.items()})
        return out

    def positions(self) -> Tuple[int, ...]:
        return tuple(sorted(set(self.attempts) | set(self.accepted) | set(self.expected) | set(self.drift)
                            | set(self.alarm) | set(self.alarms)))


def fetch(base: str, timeout: float) -> str:
    """The text of ``<base>/metrics``, or a DoctorError saying why there is none."""
    url = base.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout) as r:
            data = r.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as e:
        hint = f" ({ENABLE})" if e.code == 404 else ""
        raise DoctorError(f"--server {url}: HTTP {e.code} {e.reason}{hint}") from None
    except urllib.error.URLError as e:
        raise DoctorError(f"--server {url}: cannot reach the server ({e.reason})") from None
    except (TimeoutError, OSError) as e:
        raise DoctorError(f"--server {url}: no answer within {timeout:g} s ({e})") from None
    except (http.client.HTTPException, ValueError) as e:
        raise DoctorError(f"--server {url}: no usable answer ({type(e).__name__}: {e})") from None
    if len(data) > MAX_BODY_BYTES:
        raise DoctorError(f"--server {url}: more than {MAX_BODY_BYTES} bytes; expected a Prometheus /metrics page")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DoctorError(f"--server {url}: the answer is not UTF-8 text ({e}); expected the Prometheus text "
                          "format") from None


def _position(where: str, labels: Dict[str, str]) -> int:
    text = labels.get(names.POSITION)
    if text is None or not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_POSITIONS:
        raise DoctorError(f"{where}: label {names.POSITION}={shown(text)}; expected an integer draft position in "
                          f"1..{MAX_POSITIONS}")
    return int(text)


def _families(text: str, where: str):
    """The parsed families, or a DoctorError: prometheus_client's parser raises whatever its code meets on a
    malformed page (ValueError, IndexError, KeyError, ...), so every exception of the parse is a bad page here."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except Exception as e:  # noqa: BLE001 - see the docstring
        raise DoctorError(f"{where}: not the Prometheus text format ({type(e).__name__}: {shown(str(e), 120)})"
                          ) from None


def parse(text: str, where: str) -> Snapshot:
    """The plugin's figures in a ``/metrics`` page (``where`` names it in messages)."""
    families = _families(text, where)
    if not any(f.name.startswith(names.PREFIX) for f in families):
        sglang = any(f.name.startswith("sglang:") for f in families)
        raise DoctorError(f"{where}: no {names.PREFIX}* metrics"
                          + (" beside SGLang's own (is the plugin loaded?)" if sglang else "") + f"; {ENABLE}")
    snap = Snapshot()
    models = set()
    gauges: Dict[str, Dict[object, float]] = {}
    for fam in families:
        for s in fam.samples:
            if not s.name.startswith(names.PREFIX) or s.name.endswith("_created"):
                continue
            v = s.value
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise DoctorError(f"{where}: {s.name}{shown(s.labels)} = {v!r}; expected a finite number")
            if names.MODEL in s.labels:
                models.add(s.labels[names.MODEL])
            _take(snap, gauges, s.name, s.labels, float(v), where)
    for name, per in gauges.items():
        _set_gauge(snap, name, per)
    snap.models = tuple(sorted(models))
    return snap


COUNTER_SAMPLES = {names.exported(n): n for n in names.COUNTERS}
GAUGE_RANGES = {names.EXPECTED_ACCEPTANCE: (0.0, 1.0), names.EXPECTED_ACCEPT_LENGTH: (1.0, MAX_POSITIONS + 1.0),
                names.DRIFT: (0.0, math.inf), names.ALARM: (0.0, 1.0), names.CAPTURE_BROKEN: (0.0, 1.0)}


def _take(snap: Snapshot, gauges, sample: str, labels: Dict[str, str], v: float, where: str) -> None:
    counter = COUNTER_SAMPLES.get(sample)
    if counter is not None:
        if v < 0:
            raise DoctorError(f"{where}: counter {sample}{shown(labels)} = {v:g}; a counter is never negative")
        if counter == names.VERIFIES:
            snap.verifies += v
        elif counter in (names.ATTEMPTS, names.ACCEPTED, names.ALARMS):
            d = {names.ATTEMPTS: snap.attempts, names.ACCEPTED: snap.accepted, names.ALARMS: snap.alarms}[counter]
            p = _position(f"{where}: {sample}", labels)
            d[p] = d.get(p, 0.0) + v
        elif counter == names.SELFTEST_RUNS:
            r = labels.get(names.RESULT, "")
            snap.selftest_runs[r] = snap.selftest_runs.get(r, 0.0) + v
        elif counter == names.SELFTEST_FAILURES:
            snap.selftest_failures += v
        return
    if sample in GAUGE_RANGES:
        lo, hi = GAUGE_RANGES[sample]
        if not lo <= v <= hi:
            raise DoctorError(f"{where}: {sample}{shown(labels)} = {v:g}; expected a value in [{lo:g}, {hi:g}]")
        if sample in (names.EXPECTED_ACCEPTANCE, names.DRIFT, names.ALARM):
            key = _position(f"{where}: {sample}", labels)
        elif sample == names.CAPTURE_BROKEN:
            key = labels.get(names.TP_RANK, "")
        else:
            key = None
        per = gauges.setdefault(sample, {})
        per[key] = max(per.get(key, -math.inf), v)
    # other eagle3_capture samples (a newer plugin's) are left alone


def _set_gauge(snap: Snapshot, name: str, per: Dict[object, float]) -> None:
    if name == names.EXPECTED_ACCEPTANCE:
        snap.expected = dict(per)
    elif name == names.DRIFT:
        snap.drift = dict(per)
    elif name == names.ALARM:
        snap.alarm = dict(per)
    elif name == names.CAPTURE_BROKEN:
        snap.capture_broken = dict(per)
    elif name == names.EXPECTED_ACCEPT_LENGTH:
        snap.expected_accept_length = per[None]


def scrape(base: str, timeout: float) -> Snapshot:
    """Fetch and parse ``<base>/metrics``."""
    return parse(fetch(base, timeout), f"--server {base.rstrip('/')}/metrics")


__all__ = ["Snapshot", "fetch", "parse", "scrape", "MAX_POSITIONS", "MAX_BODY_BYTES", "ENABLE"]
