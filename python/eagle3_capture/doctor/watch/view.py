"""The watch on a terminal: each refresh as a block of lines -- the interval's verifies per second and accept length
against the expected one, a row per draft position (live acceptance over the interval, since the watch started,
expected, the server's drift and alarm, the client-side monitor), the self-test, and the alarms. On a terminal the
screen is cleared and redrawn; elsewhere (a pipe, a log) the blocks follow one another, nothing is cleared."""
from __future__ import annotations

import time
from typing import List, Optional, TextIO

from .series import Refresh

CLEAR = "\x1b[H\x1b[2J"


def _f(v: Optional[float], fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _drift(v: Optional[float]) -> str:
    return "-" if v is None else (f"{v:.2f}" if v < 1000 else ">999")


def _ratio(a: Optional[int], n: Optional[int]) -> str:
    if n is None:
        return "-"
    return f"{a / n:.3f} ({a}/{n})" if n else "- (0/0)"


def refresh_lines(r: Refresh, expected_source: str, client: bool) -> List[str]:
    stamp = time.strftime("%H:%M:%S")
    head = f"[{stamp} +{r.t:.1f}s] refresh {r.index}"
    if r.error is not None:
        return [f"{head}: no reading ({r.error}); the next one is compared with the last good one"]
    lines = []
    if r.verifies is None and r.index == 0:
        lines.append(f"{head}: first reading taken; live figures from the next refresh")
    elif r.verifies is None:
        lines.append(f"{head}: no figure for this interval (see the note)")
    else:
        lines.append(f"{head}: {r.verifies} verifies in {r.dt:.1f} s ({_f(r.verifies_per_s, '.1f')}/s); accept "
                     f"length {_f(r.accept_length)} live, {_f(r.accept_length_since_start)} since start, "
                     f"{_f(r.expected_accept_length)} expected" + ("  [RESTART]" if r.restart else ""))
    lines.append(f"  pos  {'live (interval)':<20} {'since start':<22} {'expected':<9} {'drift':<6} {'alarm':<6}"
                 + (" client" if client else ""))
    for row in r.rows:
        exp = _f(row.expected) if row.expected is not None else ("no profile" if expected_source == "none" else "-")
        alarm = "-" if row.alarm is None else ("ALARM" if row.alarm else "ok")
        lines.append(f"  {row.position:>3}  {_ratio(row.accepted, row.attempts):<20} "
                     f"{_ratio(row.total_accepted, row.total_attempts):<22} {exp:<9} {_drift(row.drift):<6} "
                     f"{alarm:<6}" + (f" {_drift(row.client)}" if client else ""))
    if not r.rows:
        lines.append("  (no draft position counted yet: no speculative traffic)")
    st = (f"  self-test: {r.total_selftest_runs} runs, {r.total_selftest_failures} failures since start"
          + (f" (this interval: {', '.join(f'{v} {k}' for k, v in sorted(r.selftest_runs.items()) if v) or 'none'})"
             if r.verifies is not None else "")
          + ("; CAPTURE BROKEN on tp rank(s) " + ", ".join(r.capture_broken) if r.capture_broken else
             "; capture ok"))
    lines.append(st)
    lines += [f"  ALARM: {a.line}" for a in r.alarms]
    if r.in_alarm and not r.alarms:
        lines.append(f"  still in alarm: {'; '.join(r.in_alarm)}")
    lines += [f"  note: {n}" for n in r.notes]
    return lines


class View:
    """Writes each refresh to ``out``: redrawn on a terminal, appended elsewhere."""

    def __init__(self, out: TextIO, header: List[str], expected_source: str, client: bool):
        self.out, self.header, self.expected_source, self.client = out, header, expected_source, client
        isatty = getattr(out, "isatty", None)
        self.tty = bool(isatty and isatty())
        if not self.tty:
            self._write(header)

    def _write(self, lines: List[str]) -> None:
        self.out.write("\n".join(ln.rstrip() for ln in lines) + "\n")
        self.out.flush()

    def show(self, r: Refresh) -> None:
        lines = refresh_lines(r, self.expected_source, self.client)
        if self.tty:
            self.out.write(CLEAR)
            lines = self.header + [""] + lines + ["", "Ctrl-C to stop (a summary follows)"]
        self._write(lines)


__all__ = ["View", "refresh_lines", "CLEAR"]
