"""Successive readings of ``/metrics`` turned into what the watch shows: per draft position the acceptance over the
last interval and since the watch started (deltas of the attempts / accepted counters), the expected figure, the
server's drift and alarm; verifies per second and the accept length; the self-test; and every alarm seen.

Each reading arrives judged whole on its own (reading.py); here it is judged against the last good one:

- a verify counter that went down is a *restart* (the server's counters began again at 0): the interval's counts are
  then, series by series, the values of the counters that went down (what was counted since the restart) and the
  growth of the others, as Prometheus' ``increase()`` takes them, and the refresh says so; the set of series may
  change with it. A restart whose counters have already grown past their old
  values is not seen (Prometheus cannot see it either);
- any other counter that went down, or a series of the last reading missing from this one, while the verify counter
  did not go down, is no restart: the readings are not of one server's counters, and the reading fails
  (:class:`~.reading.ReadingError`, one line), never a figure;
- an interval whose counts contradict each other although both readings were consistent on their own (the earlier
  one was taken in the middle of one of the server's flushes, between two of its counters: a window of
  microseconds a second) shows no figure, feeds nothing to the client-side monitor and is left out of the
  since-start figures (the refresh says so); the next interval starts from this reading.

Alarms, each recorded once when it starts: the server's ALARM gauge at 1 (or its drift statistic at its threshold:
the gauge follows it), its ALARMS counter increasing, its CAPTURE_BROKEN gauge at 1, and -- with a profile -- the
client-side drift monitor (``acceptance.drift``) fed one block per interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ...acceptance.drift import DriftMonitor, DriftSettings
from ...acceptance.profile import Profile
from .reading import ReadingError
from .scrape import SCHEMA, Snapshot, counters_from


@dataclass
class PositionRow:
    position: int
    attempts: Optional[int]              # this interval (None before the first interval)
    accepted: Optional[int]
    total_attempts: int                  # since the watch started
    total_accepted: int
    expected: Optional[float]
    drift: Optional[float]               # the server's statistic / threshold
    alarm: Optional[bool]                # the server's alarm gauge
    client: Optional[float] = None       # the client-side monitor's statistic / threshold

    @property
    def live(self) -> Optional[float]:
        return self.accepted / self.attempts if self.attempts else None

    @property
    def since_start(self) -> Optional[float]:
        return self.total_accepted / self.total_attempts if self.total_attempts else None

    def to_json(self) -> dict:
        return {"position": self.position, "attempts": self.attempts, "accepted": self.accepted,
                "live": _r(self.live), "total_attempts": self.total_attempts, "total_accepted": self.total_accepted,
                "since_start": _r(self.since_start), "expected": _r(self.expected), "server_drift": _r(self.drift),
                "server_alarm": self.alarm, "client_drift": _r(self.client)}


@dataclass
class AlarmEvent:
    t: float                # seconds since the watch started
    refresh: int
    source: str             # server-alarm | server-alarms-counter | capture-broken | client-monitor
    position: Optional[int]
    line: str

    def to_json(self) -> dict:
        return {"t": round(self.t, 3), "refresh": self.refresh, "source": self.source, "position": self.position,
                "line": self.line}


@dataclass
class Refresh:
    index: int                          # 0: the first reading (no interval yet)
    t: float                            # seconds since the watch started
    dt: Optional[float]                 # seconds since the last good reading
    verifies: Optional[int]             # this interval
    total_verifies: int
    rows: List[PositionRow]
    expected_accept_length: Optional[float]
    total_accepted_drafts: int
    accepted_drafts: Optional[int]
    selftest_runs: Dict[str, int]       # this interval, by result
    selftest_failures: Optional[int]    # this interval
    total_selftest_runs: int
    total_selftest_failures: int
    capture_broken: List[str]           # tp ranks whose capture is broken
    restart: bool = False
    alarms: List[AlarmEvent] = field(default_factory=list)     # the alarms that started at this refresh
    in_alarm: List[str] = field(default_factory=list)         # what is in alarm now
    notes: List[str] = field(default_factory=list)
    error: Optional[str] = None         # the reading failed (the server went away): nothing else is filled in

    @property
    def verifies_per_s(self) -> Optional[float]:
        return self.verifies / self.dt if self.verifies is not None and self.dt else None

    @property
    def accept_length(self) -> Optional[float]:
        """1 + accepted drafts per verify over the interval (the sum over positions of accepted = sum k h[k])."""
        return 1.0 + self.accepted_drafts / self.verifies if self.verifies else None

    @property
    def accept_length_since_start(self) -> Optional[float]:
        return 1.0 + self.total_accepted_drafts / self.total_verifies if self.total_verifies else None

    def to_json(self) -> dict:
        return {"refresh": self.index, "t": round(self.t, 3), "dt": _r(self.dt), "error": self.error,
                "restart": self.restart, "verifies": self.verifies, "total_verifies": self.total_verifies,
                "verifies_per_s": _r(self.verifies_per_s), "accept_length": _r(self.accept_length),
                "accept_length_since_start": _r(self.accept_length_since_start),
                "expected_accept_length": _r(self.expected_accept_length),
                "positions": [r.to_json() for r in self.rows],
                "selftest": {"runs": self.selftest_runs, "failures": self.selftest_failures,
                             "total_runs": self.total_selftest_runs, "total_failures": self.total_selftest_failures,
                             "capture_broken_ranks": self.capture_broken},
                "alarms": [a.to_json() for a in self.alarms], "in_alarm": self.in_alarm, "notes": self.notes}


def _r(v):
    return None if v is None else round(float(v), 6)


def _count(v: float) -> int:
    return int(round(v))


class Watcher:
    """Feeds on readings (:meth:`update`) and keeps the series."""

    def __init__(self, profile: Optional[Profile], interval: float):
        self.profile = profile
        self.expected_profile = profile.acceptance() if profile is not None else None
        self.monitor = (DriftMonitor.from_profile(profile, DriftSettings(block_seconds=interval))
                        if profile is not None else None)
        self.prev: Optional[Snapshot] = None
        self.refreshes: List[Refresh] = []
        self.totals: Dict[str, int] = {}
        self.restarts = 0
        self.said: set = set()          # notes said once
        self.once_notes: List[str] = []  # ... and their text, for the summary
        self.active: Dict[Tuple[str, object], bool] = {}  # alarm states, to record each start once

    # ------------------------------------------------------------------------------------------------------------
    @property
    def events(self) -> List[AlarmEvent]:
        return [a for r in self.refreshes for a in r.alarms]

    def positions(self, snap: Optional[Snapshot]) -> List[int]:
        ps = set(range(1, self.profile.positions + 1)) if self.profile is not None else set()
        if snap is not None:
            ps |= set(snap.positions())
        for r in self.refreshes[-1:]:
            ps |= {row.position for row in r.rows}
        return sorted(ps)

    def expected_at(self, p: int, snap: Snapshot) -> Optional[float]:
        if self.expected_profile is not None:
            return self.expected_profile[p - 1] if p <= len(self.expected_profile) else None
        return snap.expected.get(p)

    def expected_accept_length(self, snap: Snapshot) -> Optional[float]:
        if self.profile is not None:
            return self.profile.accept_length
        return snap.expected_accept_length

    def failed(self, t: float, error: str) -> Refresh:
        """A reading that failed: recorded, and the next good one is compared with the last good one."""
        r = Refresh(len(self.refreshes), t, None, None, self.totals.get("verifies", 0), [], None,
                    self.totals.get("drafts", 0), None, {}, None, self.totals.get("runs", 0),
                    self.totals.get("failures", 0), [], error=error)
        self.refreshes.append(r)
        return r

    def _note_once(self, notes: List[str], key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            notes.append(text)
            self.once_notes.append(text)

    def restarted(self, snap: Snapshot) -> bool:
        """Whether `snap` follows a restart of the server (a verify counter went down); ReadingError when it
        contradicts the last good reading otherwise (see the module's text)."""
        prev = self.prev
        if prev is None:
            return False
        down = sorted(k for k, v in snap.series.items() if k in prev.series and v < prev.series[k])
        if any(k[0] == SCHEMA.verifies for k in down):
            return True
        if down:
            k = down[0]
            raise ReadingError(f"{_series(k)} went down from {prev.series[k]:g} to {snap.series[k]:g} while "
                               f"{SCHEMA.verifies} did not (a restart starts every counter again): not one server's "
                               "counters; not judged")
        gone = sorted(k for k in prev.series if k not in snap.series)
        if gone:
            raise ReadingError(f"{len(gone)} series of the last reading missing from this one ({_series(gone[0])}"
                               f"{', ...' if len(gone) > 1 else ''}) without a restart: a partial reading; not judged")
        return False

    def update(self, snap: Snapshot, t: float, dt: Optional[float]) -> Refresh:
        """One reading, judged against the last good one first (ReadingError: nothing of it is kept)."""
        restart = self.restarted(snap)
        prev = self.prev
        notes: List[str] = []
        if prev is not None:
            # per series, as Prometheus' increase(): a series that went down counts from 0 (its process restarted)
            base = counters_from({k: (prev.series[k] if k in prev.series and v >= prev.series[k] else 0.0)
                                  for k, v in snap.series.items()})
            skipped = _contradiction(snap, base)
            if skipped is not None:
                return self._skipped(snap, t, dt, skipped)
            if restart:
                self.restarts += 1
                down = sorted(k for k, v in snap.series.items() if k in prev.series and v < prev.series[k])
                notes.append(f"counters went down ({', '.join(_series(k) for k in down[:3])}"
                             f"{', ...' if len(down) > 3 else ''}): the server restarted; this interval counts what "
                             "it counted since")
        positions = self.positions(snap)
        if len(snap.models) > 1:
            self._note_once(notes, "models", f"the server reports several models {list(snap.models)}: their "
                                             "counts are summed")
        if self.profile is not None:
            extra = [p for p in snap.positions() if p > self.profile.positions]
            if extra:
                self._note_once(notes, "extra", f"the server counts draft positions {extra}, beyond the profile's "
                                                f"{self.profile.positions} (num_steps): not in the profile, not "
                                                "monitored here; was the profile made for these server flags?")
            counted = sorted(snap.attempts)
            if counted and counted[-1] < self.profile.positions:
                self._note_once(notes, "fewer", f"the server counts draft positions up to {counted[-1]}, the profile "
                                                f"has {self.profile.positions} (num_steps): was it made for these "
                                                "server flags?")
            differ = [p for p, v in snap.expected.items() if self.expected_at(p, snap) is not None and
                      abs(v - self.expected_at(p, snap)) > 1e-6]
            if differ:
                self._note_once(notes, "differ", f"the server's expected acceptance differs from --profile at "
                                                 f"position(s) {differ}: it serves another profile")
        rows: List[PositionRow] = []
        att_block, acc_block = [], []
        for p in positions:
            if prev is None:
                n = a = None
            else:
                n = _count(snap.attempts.get(p, 0.0) - base.attempts.get(p, 0.0))
                a = _count(snap.accepted.get(p, 0.0) - base.accepted.get(p, 0.0))
                self.totals[f"att{p}"] = self.totals.get(f"att{p}", 0) + n
                self.totals[f"acc{p}"] = self.totals.get(f"acc{p}", 0) + a
            rows.append(PositionRow(p, n, a, self.totals.get(f"att{p}", 0), self.totals.get(f"acc{p}", 0),
                                    self.expected_at(p, snap), snap.drift.get(p), _server_alarm(snap, p)))
            if self.profile is not None and p <= self.profile.positions:
                att_block.append(n or 0)
                acc_block.append(a or 0)
        verifies = drafts = None
        runs: Dict[str, int] = {}
        failures = None
        if prev is not None:
            verifies = _count(snap.verifies - base.verifies)
            drafts = sum(r.accepted for r in rows)
            runs = {k: _count(v - base.selftest_runs.get(k, 0.0)) for k, v in snap.selftest_runs.items()}
            failures = _count(snap.selftest_failures - base.selftest_failures)
            for key, v in (("verifies", verifies), ("drafts", drafts), ("runs", sum(runs.values())),
                           ("failures", failures)):
                self.totals[key] = self.totals.get(key, 0) + v
        broken = sorted(k for k, v in snap.capture_broken.items() if v >= 0.5)
        r = Refresh(len(self.refreshes), t, dt, verifies, self.totals.get("verifies", 0), rows,
                    self.expected_accept_length(snap), self.totals.get("drafts", 0), drafts, runs, failures,
                    self.totals.get("runs", 0), self.totals.get("failures", 0), broken, restart, notes=notes)
        self._alarms(r, snap, base if prev is not None else None, att_block, acc_block)
        self.prev = snap
        self.refreshes.append(r)
        return r

    def _skipped(self, snap: Snapshot, t: float, dt: Optional[float], why: str) -> Refresh:
        """A reading whose interval contradicts itself: said, no figure, nothing counted; the next interval starts
        from this reading."""
        rows = [PositionRow(p, None, None, self.totals.get(f"att{p}", 0), self.totals.get(f"acc{p}", 0),
                            self.expected_at(p, snap), snap.drift.get(p), _server_alarm(snap, p))
                for p in self.positions(snap)]
        r = Refresh(len(self.refreshes), t, dt, None, self.totals.get("verifies", 0), rows,
                    self.expected_accept_length(snap), self.totals.get("drafts", 0), None, {}, None,
                    self.totals.get("runs", 0), self.totals.get("failures", 0),
                    sorted(k for k, v in snap.capture_broken.items() if v >= 0.5),
                    notes=[f"{why}: the reading before was taken during one of the server's flushes (between two "
                           "of its counters); no figure for this interval, and its counts are left out of the "
                           "since-start figures"])
        self.refreshes.append(r)
        self.prev = snap
        return r

    def _alarms(self, r: Refresh, snap: Snapshot, base: Optional[Snapshot], att: Sequence[int],
                acc: Sequence[int]) -> None:
        def state(source: str, key: object, position: Optional[int], on: bool, line: str, now: str) -> None:
            key = (source, key)
            if on:
                r.in_alarm.append(now)
                if not self.active.get(key):
                    r.alarms.append(AlarmEvent(r.t, r.index, source, position, line))
            self.active[key] = on

        for row in r.rows:
            on = bool(row.alarm)
            state("server-alarm", row.position, row.position, on,
                  f"the server's acceptance alarm is on at draft position {row.position} (drift "
                  f"{row.drift if row.drift is not None else float('nan'):.3g} of its threshold)",
                  f"server alarm at position {row.position}")
        if base is not None:
            for p, v in sorted(snap.alarms.items()):
                raised = _count(v - base.alarms.get(p, 0.0))
                if raised > 0:  # a counter: every increase is a new alarm, even one already over
                    r.alarms.append(AlarmEvent(r.t, r.index, "server-alarms-counter", p,
                                               f"the server raised {raised} acceptance alarm(s) at draft position {p} "
                                               "this interval"))
        for rank in sorted(snap.capture_broken):
            on = snap.capture_broken[rank] >= 0.5
            state("capture-broken", rank, None, on,
                  f"the capture self-test failed on tp rank {rank or '?'}: the capture is broken",
                  f"capture broken on tp rank {rank or '?'}")
        if self.monitor is not None and base is not None:
            for alarm in self.monitor.update(att, acc):
                r.alarms.append(AlarmEvent(r.t, r.index, "client-monitor", alarm.position,
                                           "client-side monitor: " + alarm.line()))
            for row in r.rows:
                if row.position <= len(self.monitor.positions):
                    pd = self.monitor.positions[row.position - 1]
                    row.client = pd.ratio if pd.monitored else None
                    if pd.in_alarm:
                        r.in_alarm.append(f"client monitor alarm at position {row.position}")


def _series(key) -> str:
    name, labels = key
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")


def _server_alarm(snap: Snapshot, p: int) -> Optional[bool]:
    """The server's alarm at position p: its gauge, or its drift statistic at or over the threshold (the gauge
    follows the statistic within a flush); None when it shows neither."""
    if p not in snap.alarm and p not in snap.drift:
        return None
    return snap.alarm.get(p, 0.0) >= 0.5 or snap.drift.get(p, 0.0) >= 1.0


def _contradiction(snap: Snapshot, base: Snapshot) -> Optional[str]:
    """Why the interval from `base` to `snap` contradicts itself (None: it does not): per position, accepted <=
    attempts, attempts after position 1 <= accepted at the one before, attempts at 1 <= verifies."""
    verifies = snap.verifies - base.verifies
    before = verifies
    for p in sorted(set(snap.attempts) | set(snap.accepted)):
        n = snap.attempts.get(p, 0.0) - base.attempts.get(p, 0.0)
        a = snap.accepted.get(p, 0.0) - base.accepted.get(p, 0.0)
        if a > n:
            return f"position {p}: {a:g} accepted of {n:g} attempts this interval"
        if n > before:
            return (f"position {p}: {n:g} attempts this interval after " +
                    (f"{before:g} verifies" if p == 1 else f"{before:g} accepted at position {p - 1}"))
        before = a
    return None


__all__ = ["Watcher", "Refresh", "PositionRow", "AlarmEvent"]
