"""``doctor watch``: a running server's acceptance, live, in the terminal -- read from its Prometheus ``/metrics``
(the plugin's ``eagle3_capture:*`` metrics, served by SGLang with ``--enable-metrics``), refreshed every
``--interval`` seconds.

Per draft position: the acceptance over the last interval and since the watch started, the expected acceptance
(``--profile``, else the server's own expected gauges), the server's drift statistic and alarm; overall verifies
per second and the accept length, live against expected; the capture self-test. With ``--profile`` the drift
monitor of ``acceptance.drift`` also runs here, on the scraped counts, one block per interval (its false-alarm bound
is per interval: positions * 3600 / interval * e^-h an hour). The parts are ``doctor/watch/``.

``run`` prints the live view on stdout as it goes (that is the command's work); its report is the summary that the
CLI prints at the end, after ``--count`` refreshes or Ctrl-C.

Each reading is judged whole (``watch/reading.py``: complete within its deadline and its Content-Length, every
expected series, consistent counters, one label rule) and against the last good one (``watch/series.py``: a reset
is a restart, anything else that goes down or goes missing is not); a reading that fails is a failed reading with
its one-line reason, never a figure. The deadline is per reading (connection, headers and body together):
``min(10, max(2, --interval))`` seconds, so a server that drips its answer fails the reading.

Exit codes (:func:`exit_code`): 0 every reading after the first was judged and no alarm was seen; 1 an alarm was
seen (the server's alarm gauge, drift statistic or alarm counter, a broken capture, the client-side monitor); 3 no
alarm was seen but some reading could not be judged (a failed reading: the server away, a partial or contradictory
page), so "fine" cannot be said; 2 on bad input (a bad URL or profile; the first reading failing: a server
unreachable at the start, without the plugin's metrics, or with a page that fails the rules above).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

from .. import arg_types as at
from .. import options
from ..common import EXIT_FINDINGS, EXIT_NOT_JUDGED, EXIT_OK, DoctorError
from ..options import flag

INTERVAL_RANGE = (0.1, 3600.0)
DEFAULT_INTERVAL = 5.0

DESCRIPTION = ("Reads the plugin's metrics from a running server's /metrics (SGLang with --enable-metrics) every "
               "--interval seconds and shows, per draft position, the acceptance over the last interval and since "
               "the start against the expected profile, the server's drift statistic and alarm, verifies per second, "
               "the accept length and the capture self-test. With --profile the drift monitor also runs here, one "
               "block per interval. Each reading is judged whole (complete within its deadline of min(10, max(2, "
               "interval)) s and its Content-Length, every expected series, consistent counters) before any figure "
               "is taken from it. Exit codes: 0 every reading judged and no alarm; 1 an alarm was seen (the "
               "server's, a broken capture, or the monitor's); 3 no alarm seen but some reading could not be judged "
               "(failed: unreachable, partial, contradictory); 2 bad input, or the first reading failed.")


@dataclass(frozen=True, kw_only=True)
class Options:
    server: str = flag("--server", required=True, metavar="URL", type=at.url,
                       help="http://host:port of the running SGLang server")
    profile: Optional[str] = flag("--profile", metavar="PROFILE.json",
                                  help="the expected-acceptance profile (doctor accept|online --profile-out); "
                                       "default: the server's own (its expected-acceptance gauges), if it serves one")
    interval: float = flag("--interval", type=at.finite_float(*INTERVAL_RANGE), default=DEFAULT_INTERVAL, metavar="S",
                           help="seconds between refreshes (default 5; 0.1 .. 3600)")
    count: Optional[int] = flag("--count", type=at.POSITIVE, metavar="N",
                                help="refreshes after the first reading, then exit (default: until Ctrl-C)")
    plot: Optional[str] = flag("--plot", metavar="OUT.png", type=at.png_file,
                               help="a PNG of live acceptance per interval against the expected lines, alarms "
                                    "marked; rewritten at every refresh")
    json: Optional[str] = options.json_out("write the series (every refresh) as JSON at exit")
    no_progress: bool = options.no_progress("no status line on stderr")


@dataclass
class WatchReport:
    server: str
    interval: float
    profile: Optional[str]
    expected_source: str               # profile | server | none
    refreshes: list                    # watch.series.Refresh, in order
    events: list                       # watch.series.AlarmEvent
    restarts: int
    ended: str                         # count | interrupted (Ctrl-C or SIGTERM)
    seconds: float
    false_alarms_per_hour: Optional[float] = None   # the client-side monitor's bound (with --profile)
    monitored: int = 0
    threshold: Optional[float] = None
    plot: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    @property
    def alarm(self) -> bool:
        return bool(self.events)

    @property
    def failed(self) -> int:
        """Readings that could not be judged."""
        return sum(r.error is not None for r in self.refreshes)

    @property
    def last(self):
        good = [r for r in self.refreshes if r.error is None]
        return good[-1] if good else None

    def to_json(self) -> dict:
        return {"server": self.server, "interval": self.interval, "profile": self.profile,
                "expected_source": self.expected_source, "ended": self.ended, "seconds": round(self.seconds, 3),
                "restarts": self.restarts, "alarm": self.alarm, "failed_readings": self.failed,
                "client_monitor": None if self.false_alarms_per_hour is None else {
                    "block_seconds": self.interval, "threshold": self.threshold, "positions": self.monitored,
                    "false_alarms_per_hour_bound": self.false_alarms_per_hour},
                "alarms": [e.to_json() for e in self.events], "refreshes": [r.to_json() for r in self.refreshes],
                "plot": self.plot, "notes": self.notes}


def _check(opts: Options) -> None:
    from ..sglang_model.server_url import server_url

    if not isinstance(opts.server, str):
        raise DoctorError(f"--server: expected an http(s) URL, got {type(opts.server).__name__}")
    server_url(opts.server)
    lo, hi = INTERVAL_RANGE
    iv = opts.interval
    if isinstance(iv, bool) or not isinstance(iv, (int, float)) or not math.isfinite(iv) or not lo <= iv <= hi:
        raise DoctorError(f"--interval: expected seconds in [{lo:g}, {hi:g}], got {iv!r}")
    if opts.count is not None and (isinstance(opts.count, bool) or not isinstance(opts.count, int) or opts.count < 1):
        raise DoctorError(f"--count: expected an integer >= 1, got {opts.count!r}")


def _read_profile(path: Optional[str]):
    if path is None:
        return None
    from ...acceptance.profile import ProfileError, read

    try:
        return read(path)
    except ProfileError as e:
        raise DoctorError(f"--profile: {e}") from None


def _stop_on_sigterm():
    """SIGTERM (a service manager, `timeout`) ends the watch as Ctrl-C does: with the summary, the series and the
    plot. Installed only from the main thread (Python's rule); returns what puts the old handler back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, old)


def run(opts: Options, out=None) -> WatchReport:
    from ..watch.scrape import scrape
    from ..watch.series import Watcher
    from ..watch.view import View

    _check(opts)
    out = out if out is not None else sys.stdout
    base = opts.server.rstrip("/")
    prof = _read_profile(opts.profile)
    timeout = reading_deadline(opts.interval)
    watcher = Watcher(prof, opts.interval)
    t0 = time.monotonic()
    first = scrape(base, timeout)  # unreachable, not Prometheus, no plugin metrics, a bad page: bad input, exit 2
    expected_source = "profile" if prof is not None else ("server" if first.expected else "none")
    client = watcher.monitor is not None
    header = [f"eagle3-capture doctor watch: {base}/metrics every {opts.interval:g} s"
              + (f", {opts.count} refreshes" if opts.count else ", until Ctrl-C"),
              "expected acceptance: " + {"profile": f"--profile {prof.path if prof else ''}",
                                         "server": "the server's profile (its expected-acceptance gauges)",
                                         "none": "no profile (give --profile, or serve one: "
                                                 "EAGLE3_CAPTURE_PROFILE)"}[expected_source]]
    if client:
        m = watcher.monitor
        header.append(f"client-side drift monitor: one block per interval of {opts.interval:g} s, threshold "
                      f"{m.settings.threshold:g}; false alarms at most {m.false_alarms_per_hour():.3g} per hour "
                      f"(the bound is per interval: {sum(p.monitored for p in m.positions)} positions x "
                      f"{3600 / opts.interval:g} intervals an hour x e^-{m.settings.threshold:g})")
    view = View(out, header, expected_source, client)
    if not opts.no_progress:
        print(f"watching {base}/metrics; Ctrl-C stops with a summary", file=sys.stderr)
    ended = "count"
    last_good = t0

    def plot() -> None:
        if opts.plot is None:
            return
        from ..watch.plot import acceptance_plot

        expected = {row.position: row.expected for r in watcher.refreshes[-1:] for row in r.rows}
        try:
            acceptance_plot(opts.plot, watcher.refreshes, watcher.events, expected,
                            f"{base}: live acceptance per {opts.interval:g} s interval")
        except (OSError, ValueError) as e:
            raise DoctorError(f"--plot {opts.plot}: cannot be written ({e})") from None

    restore = _stop_on_sigterm()
    try:
        view.show(watcher.update(first, 0.0, None))
        plot()
        i = 0
        while opts.count is None or i < opts.count:
            i += 1
            time.sleep(max(0.0, t0 + i * opts.interval - time.monotonic()))
            now = time.monotonic()
            try:
                refresh = watcher.update(scrape(base, timeout), now - t0, now - last_good)
            except DoctorError as e:  # a failed reading: said, never a figure
                view.show(watcher.failed(now - t0, str(e)))
            else:
                view.show(refresh)
                last_good = now
            plot()
    except KeyboardInterrupt:
        ended = "interrupted"
    finally:
        restore()
    plot()
    m = watcher.monitor
    return WatchReport(base, opts.interval, prof.path if prof else None, expected_source, watcher.refreshes,
                       watcher.events, watcher.restarts, ended, time.monotonic() - t0,
                       m.false_alarms_per_hour() if m else None, sum(p.monitored for p in m.positions) if m else 0,
                       m.settings.threshold if m else None, opts.plot, list(watcher.once_notes))


def reading_deadline(interval: float) -> float:
    """Seconds one reading may take, connection to last byte."""
    return min(10.0, max(2.0, interval))


def render(rep: WatchReport) -> str:
    failed = rep.failed
    lines = ["", f"watched {rep.server}/metrics for {rep.seconds:.1f} s: {len(rep.refreshes) - 1} refreshes after "
                 f"the first reading ({'stopped by Ctrl-C / SIGTERM' if rep.ended == 'interrupted' else 'count reached'})"
             + (f"; {failed} reading(s) could not be judged" if failed else "")
             + (f"; {rep.restarts} server restart(s) seen (counters reset)" if rep.restarts else "")]
    last = rep.last
    if last is not None:
        src = {"profile": f"--profile {rep.profile}", "server": "the server's profile", "none": "no profile"}
        lines.append(f"since start: {last.total_verifies} verifies, accept length "
                     f"{'-' if last.accept_length_since_start is None else f'{last.accept_length_since_start:.3f}'}"
                     f" (expected {'-' if last.expected_accept_length is None else f'{last.expected_accept_length:.3f}'}"
                     f"; expected from {src[rep.expected_source]})")
        for row in last.rows:
            ss = "-" if row.since_start is None else f"{row.since_start:.3f} ({row.total_accepted}/{row.total_attempts})"
            ex = "-" if row.expected is None else f"{row.expected:.3f}"
            lines.append(f"  position {row.position}: acceptance {ss}, expected {ex}")
        lines.append(f"self-test: {last.total_selftest_runs} runs, {last.total_selftest_failures} failures while "
                     "watched" + (f"; capture broken on tp rank(s) {', '.join(last.capture_broken)}"
                                  if last.capture_broken else ""))
    if rep.false_alarms_per_hour is not None:
        lines.append(f"client-side drift monitor: blocks of one interval ({rep.interval:g} s), threshold "
                     f"{rep.threshold:g}, {rep.monitored} positions: at most {rep.false_alarms_per_hour:.3g} false "
                     "alarms per hour (a bound per interval, not per second)")
    if rep.events:
        lines.append(f"alarms seen: {len(rep.events)}")
        lines += [f"  +{e.t:.1f}s (refresh {e.refresh}): {e.line}" for e in rep.events]
    else:
        lines.append("alarms seen: none")
    if rep.plot:
        lines.append(f"plot: {rep.plot}")
    lines += [f"note: {n}" for n in rep.notes]
    if failed:
        first = next(r for r in rep.refreshes if r.error is not None)
        lines.append(f"failed readings: {failed} (first, refresh {first.index}: {first.error})")
    if rep.alarm:
        lines.append("verdict: ALARM")
    elif failed:
        lines.append(f"verdict: no alarm in the readings judged; {failed} of {len(rep.refreshes)} could not be "
                     "judged (exit 3)")
    else:
        lines.append("verdict: no alarm")
    return "\n".join(lines)


def exit_code(rep: WatchReport) -> int:
    """1 an alarm, else 3 when a reading could not be judged, else 0 (see the module's text)."""
    if rep.alarm:
        return EXIT_FINDINGS
    return EXIT_NOT_JUDGED if rep.failed else EXIT_OK


__all__ = ["DESCRIPTION", "Options", "run", "WatchReport", "render", "exit_code", "reading_deadline", "INTERVAL_RANGE",
           "DEFAULT_INTERVAL"]
