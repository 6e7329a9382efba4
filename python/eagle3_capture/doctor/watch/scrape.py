"""A server's ``/metrics`` read into the plugin's figures: GET ``<URL>/metrics`` within one deadline, the page judged
whole by reading.py (complete, every expected series, consistent counters, one label rule) under the plugin's
:data:`SCHEMA` (names: ``acceptance.names``), and the ``eagle3_capture:*`` samples gathered into a :class:`Snapshot`.

Several series of one metric are combined: counters are summed over every label but the ones kept (several served
models give one series each), gauges take their largest value (an alarm anywhere is an alarm; the plugin's
processes agree on the expected figures). The snapshot keeps every counter series apart too (:attr:`Snapshot.series`),
so that a counter that went down is seen per series. A page that fails any rule is a one-line
:class:`~.reading.ReadingError` (a :class:`~..common.DoctorError`), never a figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ...acceptance import names
from . import reading
from .reading import MAX_BODY_BYTES, MAX_POSITIONS, ReadingError, Schema

ENABLE = ("the server must run the eagle3-capture plugin with SGLang's --enable-metrics (its metrics are "
          f"{names.PREFIX}*)")
GAUGE_RANGES = {names.EXPECTED_ACCEPTANCE: (0.0, 1.0), names.EXPECTED_ACCEPT_LENGTH: (1.0, MAX_POSITIONS + 1.0),
                names.DRIFT: (0.0, math.inf), names.ALARM: (0.0, 1.0), names.CAPTURE_BROKEN: (0.0, 1.0)}
# the plugin's metrics as one reading must hold them
SCHEMA = Schema(verifies=names.exported(names.VERIFIES), attempts=names.exported(names.ATTEMPTS),
                accepted=names.exported(names.ACCEPTED), position_label=names.POSITION, first_position=1,
                model_label=names.MODEL,
                other_counters=tuple(names.exported(n) for n in (names.ALARMS, names.SELFTEST_RUNS,
                                                                   names.SELFTEST_FAILURES)),
                gauges=GAUGE_RANGES,
                positional=(names.exported(names.ALARMS), names.EXPECTED_ACCEPTANCE, names.DRIFT, names.ALARM),
                prefix=names.PREFIX)


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
    series: Dict[tuple, float] = field(default_factory=dict)       # every counter series apart: (name, labels)

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

    def counted_positions(self) -> Tuple[int, ...]:
        """The positions the attempts / accepted counters name (1..P)."""
        return tuple(sorted(set(self.attempts) | set(self.accepted)))


def fetch(base: str, timeout: float) -> str:
    """The text of ``<base>/metrics``, complete within `timeout` seconds for the whole reading, or a ReadingError
    saying why there is none."""
    url = base.rstrip("/") + "/metrics"
    try:
        data = reading.fetch(url, timeout, hint=ENABLE)
    except ReadingError as e:
        raise ReadingError(f"--server {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReadingError(f"--server {url}: the answer is not UTF-8 text ({e}); expected the Prometheus text "
                           "format") from None


COUNTER_SAMPLES = {names.exported(n): n for n in names.COUNTERS}


def parse(text: str, where: str) -> Snapshot:
    """The plugin's figures in a ``/metrics`` page (``where`` names it in messages), judged whole first."""
    samples = reading.parse_samples(text, where)
    if not any(s.name.startswith(names.PREFIX) for s in samples):
        sglang = any(s.name.startswith("sglang:") for s in samples)
        raise ReadingError(f"{where}: no {names.PREFIX}* metrics"
                           + (" beside SGLang's own (is the plugin loaded?)" if sglang else "") + f"; {ENABLE}")
    if not any(s.name in SCHEMA.counters[:3] for s in samples):
        raise ReadingError(f"{where}: the plugin's metrics hold no acceptance counters ({SCHEMA.verifies}, ...): "
                           "acceptance counting is off on this server (no speculative decoding, or "
                           "EAGLE3_CAPTURE_DISABLE=acceptance); nothing to watch")
    read = reading.judge(samples, SCHEMA, where)
    snap = Snapshot(models=read.models)
    gauges: Dict[str, Dict[object, float]] = {}
    for key, s in read.samples.items():
        counter = COUNTER_SAMPLES.get(s.name)
        if counter is not None:
            snap.series[key] = s.value
            _count(snap, counter, s.labels, s.value)
            continue
        if s.name in (names.EXPECTED_ACCEPTANCE, names.DRIFT, names.ALARM):
            k = reading.position_of(s.labels.get(names.POSITION))
        elif s.name == names.CAPTURE_BROKEN:
            k = s.labels.get(names.TP_RANK, "")
        else:
            k = None
        per = gauges.setdefault(s.name, {})
        per[k] = max(per.get(k, -math.inf), s.value)
    for name, per in gauges.items():
        _set_gauge(snap, name, per)
    return snap


def counters_from(series: Dict[tuple, float]) -> Snapshot:
    """A snapshot holding only counters, from counter series values ((sample name, labels) -> value), summed as
    :func:`parse` sums them (the series.py watcher's base of an interval, taken series by series)."""
    snap = Snapshot()
    for key, v in series.items():
        name, labels = key
        snap.series[key] = v
        _count(snap, COUNTER_SAMPLES[name], dict(labels), v)
    return snap


def _count(snap: Snapshot, counter: str, labels: Dict[str, str], v: float) -> None:
    if counter == names.VERIFIES:
        snap.verifies += v
    elif counter in (names.ATTEMPTS, names.ACCEPTED, names.ALARMS):
        d = {names.ATTEMPTS: snap.attempts, names.ACCEPTED: snap.accepted, names.ALARMS: snap.alarms}[counter]
        p = reading.position_of(labels.get(names.POSITION))
        d[p] = d.get(p, 0.0) + v
    elif counter == names.SELFTEST_RUNS:
        r = labels.get(names.RESULT, "")
        snap.selftest_runs[r] = snap.selftest_runs.get(r, 0.0) + v
    elif counter == names.SELFTEST_FAILURES:
        snap.selftest_failures += v


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


__all__ = ["Snapshot", "fetch", "parse", "scrape", "counters_from", "SCHEMA", "MAX_POSITIONS", "MAX_BODY_BYTES",
           "ENABLE", "ReadingError"]
