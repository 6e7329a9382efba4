"""Acceptance while serving: at the target's model load, decide whether this process counts, read the expected
profile, start the flush thread; every ``drift.BLOCK_SECONDS`` the thread exports what was counted and feeds the
drift alarm.

Per flush (one block of the CUSUM): the difference of this process's histogram (acceptance_count.COUNTS) since the
last flush becomes attempts and acceptances per position (acceptance/positions.py); the counters
``spec_verifies``, ``spec_draft_attempts`` and ``spec_draft_accepted`` grow by them, so after the last flush they
equal the sum of the responses' ``spec_correct_drafts_histogram`` exactly. With a usable profile the DriftMonitor
gets the block; the gauges ``acceptance_drift`` (statistic / threshold) and ``acceptance_alarm`` follow it, and a
new alarm episode is one ERROR line (drift.Alarm.line()) and one more ``acceptance_alarms``. Without
``--enable-metrics`` nothing is exported; the counting and the alarm's lines are the same.

Lines (one each, from the process that counts):

- at model load: ``eagle3_capture: acceptance: counting on (attention-TP rank 0, ...); exported to SGLang's
  /metrics; profile <path> (<P> positions, accept length <x>); alarm on: drop 20%, threshold 16 nats, at most
  <b> false alarms per hour``, with ``alarm off (<why>)`` where it is off;
- an unusable profile: ``eagle3_capture: profile <path>: ...; the acceptance alarm is off (counting and export stay
  on)`` (ERROR); with ``EAGLE3_CAPTURE_PROFILE_REQUIRED=1`` it is instead the refusal ``eagle3_capture: refusing to
  serve: EAGLE3_CAPTURE_PROFILE_REQUIRED=1 and <why> ...``, raised at model load in every process.
"""
from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ...acceptance import names, positions as positions_mod, profile as profile_mod
from ...acceptance.drift import BLOCK_SECONDS, Alarm, DriftMonitor, DriftSettings
from ..settings import switches
from ..settings.alarm import ENV_PROFILE, ENV_PROFILE_REQUIRED, AlarmSettings
from . import exporter, histogram

EXPORTED = exporter.EXPORTED
SPECULATIVE_FLAGS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


class Flusher:
    """One process's export and alarm: :meth:`flush` takes the histogram's growth since the last flush."""

    def __init__(self, positions: int, monitor: Optional[DriftMonitor]):
        if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
            raise ValueError(f"positions: expected an integer >= 1, got {positions!r}")
        if monitor is not None and len(monitor.positions) != positions:
            raise ValueError(f"a drift monitor of {len(monitor.positions)} positions for {positions}")
        self.positions = positions
        self.monitor = monitor
        self.last: List[int] = []
        self.exported_positions = 0
        self.overflow_said = False
        self._lock = threading.Lock()  # the thread's flush and a last one at stop

    def start_series(self) -> None:
        """Every series at 0, so that a rate over it exists from the start (a counter at 0 adds nothing)."""
        exporter.inc(names.VERIFIES, {}, 0)
        self._series(self.positions)
        if self.monitor is not None:
            for p in self.monitor.positions:
                exporter.set_gauge(names.DRIFT, {names.POSITION: p.position}, 0.0)
                exporter.set_gauge(names.ALARM, {names.POSITION: p.position}, 0)

    def _series(self, upto: int) -> None:
        for p in range(self.exported_positions + 1, upto + 1):
            for counter in (names.ATTEMPTS, names.ACCEPTED, names.ALARMS):
                exporter.inc(counter, {names.POSITION: p}, 0)
        self.exported_positions = max(self.exported_positions, upto)

    def flush(self) -> List[Alarm]:
        """Export the counts since the last flush, feed the alarm; returns the alarms raised."""
        with self._lock:
            return self._flush()

    def _flush(self) -> List[Alarm]:
        snap = histogram.snapshot()
        delta = [s - (self.last[i] if i < len(self.last) else 0) for i, s in enumerate(snap)]
        self.last = snap
        while delta and delta[-1] == 0 and len(delta) > self.positions + 1:
            delta.pop()
        verifies = sum(delta)
        if verifies == 0:
            return []
        span = max(self.positions, len(delta) - 1)
        if span > self.positions and not self.overflow_said:
            self.overflow_said = True
            switches.announce("warning", f"eagle3_capture: a verify accepted {span} drafts, more than "
                                         f"--speculative-num-steps {self.positions}; positions beyond it are "
                                         "counted and exported, not tested by the alarm")
        attempts, accepted = positions_mod.attempts_accepted(delta, span)
        self._series(span)
        exporter.inc(names.VERIFIES, {}, verifies)
        for p in range(1, span + 1):
            if attempts[p - 1]:
                exporter.inc(names.ATTEMPTS, {names.POSITION: p}, attempts[p - 1])
            if accepted[p - 1]:
                exporter.inc(names.ACCEPTED, {names.POSITION: p}, accepted[p - 1])
        if self.monitor is None:
            return []
        alarms = self.monitor.update(attempts[:self.positions], accepted[:self.positions])
        for p in self.monitor.positions:
            exporter.set_gauge(names.DRIFT, {names.POSITION: p.position}, p.ratio)
            exporter.set_gauge(names.ALARM, {names.POSITION: p.position}, int(p.in_alarm))
        for a in alarms:
            exporter.inc(names.ALARMS, {names.POSITION: a.position}, 1)
            switches.announce("error", a.line())
        return alarms


@dataclass(frozen=True)
class Plan:
    """What model load decided for this process."""

    counting: bool
    positions: int
    profile: Optional[profile_mod.Profile]
    monitor: Optional[DriftMonitor]
    line: str                          # the model-load line ("" where this process says nothing)
    errors: Tuple[str, ...] = ()       # ERROR lines (an unusable profile)
    refusal: Optional[str] = None


def _server_flags(server_args) -> Optional[profile_mod.Speculative]:
    vals = [getattr(server_args, f, None) for f in SPECULATIVE_FLAGS]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        return None
    return profile_mod.Speculative(*vals)


def _profile_problem(alarm: AlarmSettings, flags: Optional[profile_mod.Speculative]
                     ) -> Tuple[Optional[profile_mod.Profile], Optional[str], bool]:
    """(the profile, why the alarm cannot run, whether that why is an ERROR line)."""
    if alarm.drift is None:
        return None, f"a malformed acceptance setting ({alarm.problem})", False  # said at registration
    if alarm.profile is None:
        return None, f"no profile ({ENV_PROFILE} is not set)", False
    try:
        prof = profile_mod.read(alarm.profile)
    except profile_mod.ProfileError as e:
        return None, str(e), True
    except Exception as e:  # noqa: BLE001 - read() raises only ProfileError; anything else still names the file
        why = " ".join(str(e).split())[:200]
        return None, f"profile {alarm.profile}: cannot be read ({type(e).__name__}: {why})", True
    if flags is None:
        return prof, (f"profile {prof.path}: this server's speculative flags are not all integers "
                      f"({', '.join(SPECULATIVE_FLAGS)}): not comparable"), True
    if prof.speculative != flags:
        return prof, (f"profile {prof.path} was made with {prof.speculative.text()}, this server runs with "
                      f"{flags.text()}: not comparable"), True
    return prof, None, False


def plan(server_args, alarm: AlarmSettings, counting_rank: Tuple[Optional[bool], str]) -> Plan:
    """Decide, without side effects, what this process does (tests call it with any server args)."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    flags = _server_flags(server_args)
    counts, rank_text = counting_rank
    if algorithm is None or flags is None:
        why = "no speculative decoding" if algorithm is None else "the speculative flags are not set"
        refusal = (f"eagle3_capture: refusing to serve: {ENV_PROFILE_REQUIRED}=1 and {why}: no acceptance to "
                   "watch" if alarm.required else None)
        said = "" if counts is False else f"eagle3_capture: acceptance: nothing to count ({why})"
        return Plan(False, 0, None, None, said, (), refusal)
    prof, problem, is_error = _profile_problem(alarm, flags)
    refusal = None
    if problem is not None and alarm.required:
        refusal = (f"eagle3_capture: refusing to serve: {ENV_PROFILE_REQUIRED}=1 and {problem} (fix it, or unset "
                   f"{ENV_PROFILE_REQUIRED} to serve without the alarm)")
    if counts is None:
        return Plan(False, flags.num_steps, None, None, "",
                    (f"eagle3_capture: acceptance: counting off in this process: {rank_text} (which process's "
                     "responses carry the histograms is unknown)",), refusal)
    if not counts:
        return Plan(False, flags.num_steps, None, None, "", (), refusal)
    monitor = None
    if problem is None:
        monitor = DriftMonitor.from_profile(prof, alarm.drift or DriftSettings())
        s = monitor.settings
        alarm_text = (f"profile {prof.path} ({prof.positions} positions, accept length {prof.accept_length:.2f}, "
                      f"{prof.verifies} verifies); alarm on: drop {s.drop:.0%}, threshold {s.threshold:g} nats, "
                      f"{sum(p.monitored for p in monitor.positions)} positions tested, at most "
                      f"{monitor.false_alarms_per_hour():.1e} false alarms per hour")
    else:
        alarm_text = f"alarm off: {problem}"
    errors = (f"eagle3_capture: {problem}; the acceptance alarm is off (counting and export stay on)",) \
        if is_error and refusal is None else ()
    export = exporter.why_off() or EXPORTED
    line = f"eagle3_capture: acceptance: counting on ({rank_text}); {export}; {alarm_text}"
    return Plan(True, flags.num_steps, prof if problem is None else None, monitor, line, errors, refusal)


# ----------------------------------------------------------------------------------------------------------------
# The running process's flush thread
# ----------------------------------------------------------------------------------------------------------------

_flusher: Optional[Flusher] = None
_thread: Optional[threading.Thread] = None
_stop = threading.Event()
_atexit = False


def at_model_load(server_args, alarm: AlarmSettings) -> Optional[str]:
    """At the target's model load, after exporter.configure: decide, say it, start counting and the flush thread.
    Returns the refusal line (the caller raises it) or None."""
    global _atexit
    p = plan(server_args, alarm, histogram.output_rank())
    if p.refusal is not None:
        return p.refusal
    stop()
    for line in p.errors:
        switches.announce("error", line)
    if p.line:
        switches.announce("info", p.line)
    if not p.counting:
        return None
    if p.profile is not None:
        for pos, rate in enumerate(p.profile.acceptance(), start=1):
            if rate is not None:
                exporter.set_gauge(names.EXPECTED_ACCEPTANCE, {names.POSITION: pos}, rate)
        exporter.set_gauge(names.EXPECTED_ACCEPT_LENGTH, {}, p.profile.accept_length)
    start(p.positions, p.monitor)
    if not _atexit:
        _atexit = True
        atexit.register(stop)
    return None


def start(positions: int, monitor: Optional[DriftMonitor], *, thread: bool = True) -> Flusher:
    """Count from now on and flush every BLOCK_SECONDS (`thread` False: the caller flushes, tests)."""
    global _flusher, _thread
    stop()
    f = Flusher(positions, monitor)
    f.last = histogram.snapshot()
    f.start_series()
    _flusher = f
    histogram.start(positions)
    if thread:
        _stop.clear()
        _thread = threading.Thread(target=_loop, args=(f,), name="eagle3_capture-acceptance", daemon=True)
        _thread.start()
    return f


def _loop(f: Flusher) -> None:
    while not _stop.wait(BLOCK_SECONDS):
        try:
            f.flush()
        except Exception as e:  # never into serving: said once, and counting stops
            histogram.stop()
            switches.announce("error", f"eagle3_capture: the acceptance flush failed ({type(e).__name__}: {e}); "
                                       "counting, export and the alarm stop in this process")
            return


def flush() -> List[Alarm]:
    """Flush now (the thread does every second); [] when not counting."""
    return _flusher.flush() if _flusher is not None else []


def stop() -> None:
    """Stop the thread after a last flush (at exit, or before a new start)."""
    global _thread, _flusher
    _stop.set()
    if _thread is not None:
        _thread.join(timeout=5 * BLOCK_SECONDS)
        _thread = None
    if _flusher is not None:
        try:
            _flusher.flush()
        except Exception:
            pass  # at exit: the process is going; a failing flush was said by the thread already
    _flusher = None
    histogram.stop()


def flusher() -> Optional[Flusher]:
    return _flusher


__all__ = ["Flusher", "Plan", "plan", "at_model_load", "start", "flush", "stop", "flusher", "SPECULATIVE_FLAGS"]
