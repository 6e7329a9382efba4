"""The acceptance alarm's settings: the expected profile, whether serving needs it, and the drift test's tuning.

Parsed once at registration by switches.read_settings (which owns the whole table of settings); the profile file
itself is read at the target's model load, when the server's speculative flags are known (monitor/live.py).

- ``EAGLE3_CAPTURE_PROFILE`` <path>: the profile ``doctor accept|online --profile-out`` wrote. Unset: no alarm
  (counting and export stay on).
- ``EAGLE3_CAPTURE_PROFILE_REQUIRED`` 0|1: 1 refuses to serve, at model load, when the alarm cannot run (no
  profile, one that cannot be read, one made under other speculative flags, a malformed alarm setting, the
  ``acceptance`` hook off). A malformed value refuses too: the operator chose between serving blind and not serving.
- ``EAGLE3_CAPTURE_ALARM_DROP`` (relative drop the test is tuned to, drift.DROP_RANGE, default drift.DEFAULT_DROP),
  ``EAGLE3_CAPTURE_ALARM_THRESHOLD`` (nats, drift.THRESHOLD_RANGE, default drift.DEFAULT_THRESHOLD): malformed ->
  one ERROR line and the alarm off (a test tuned otherwise than asked must not run).

Pure Python (no SGLang, no torch).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

from ...acceptance.drift import DEFAULT_DROP, DEFAULT_THRESHOLD, DROP_RANGE, THRESHOLD_RANGE, DriftSettings

ENV_PROFILE = "EAGLE3_CAPTURE_PROFILE"
ENV_PROFILE_REQUIRED = "EAGLE3_CAPTURE_PROFILE_REQUIRED"
ENV_ALARM_DROP = "EAGLE3_CAPTURE_ALARM_DROP"
ENV_ALARM_THRESHOLD = "EAGLE3_CAPTURE_ALARM_THRESHOLD"
SETTINGS = (ENV_PROFILE, ENV_PROFILE_REQUIRED, ENV_ALARM_DROP, ENV_ALARM_THRESHOLD)
# the one that guards a choice (a typo of its name refuses, as a malformed value does)
GUARD = {ENV_PROFILE_REQUIRED: "chooses whether the server may serve without a usable acceptance profile"}
ALARM_OFF = "ignored: the acceptance alarm is off in this process (counting and export stay on)"
MAX_PATH = 4096


@dataclass(frozen=True)
class AlarmSettings:
    """``profile``: the path as given (None: unset); ``drift``: the test's tuning, None when a malformed setting
    turned the alarm off (``problem`` says which, already logged at registration)."""

    profile: Optional[str] = None
    required: bool = False
    drift: Optional[DriftSettings] = DriftSettings()
    problem: Optional[str] = None


def parse_required(raw: str) -> bool:
    v = raw.strip()
    if v not in ("", "0", "1"):
        raise ValueError(f"{ENV_PROFILE_REQUIRED}={raw!r}: expected 0 or 1")
    return v == "1"


def parse_number(name: str, raw: str, bounds: Tuple[float, float]) -> float:
    lo, hi = bounds
    v = raw.strip()
    # a plain decimal number: no 'nan', 'inf', '1_0', hex or the like that float() would take
    if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?", v):
        raise ValueError(f"{name}={raw!r}: expected a number in [{lo:g}, {hi:g}]")
    x = float(v)
    if not math.isfinite(x) or not lo <= x <= hi:
        raise ValueError(f"{name}={raw!r}: expected a number in [{lo:g}, {hi:g}]")
    return x


def parse_profile_path(raw: str) -> str:
    v = raw.strip()
    if not v or len(v) > MAX_PATH or "\0" in v:
        raise ValueError(f"{ENV_PROFILE}={raw[:60]!r}: expected the path of a profile file written by "
                         "`eagle3-capture doctor accept|online --profile-out`")
    return v


def read_alarm(env: Mapping[str, str], unknown_problems: List[str]) -> Tuple[AlarmSettings, List[str], List[str]]:
    """(settings, ERROR lines, refusals) from the environment; `unknown_problems`: misspelt names whose closest
    known name is one of the alarm's (each turns the alarm off)."""
    errors: List[str] = []
    refusals: List[str] = []
    required = False
    try:
        required = parse_required(env.get(ENV_PROFILE_REQUIRED, ""))
    except ValueError as e:
        refusals.append(str(e))
    problems: List[str] = []
    profile = None
    if env.get(ENV_PROFILE) is not None:
        try:
            profile = parse_profile_path(env[ENV_PROFILE])
        except ValueError as e:
            problems.append(str(e))
    drop, threshold = DEFAULT_DROP, DEFAULT_THRESHOLD
    if env.get(ENV_ALARM_DROP) is not None:
        try:
            drop = parse_number(ENV_ALARM_DROP, env[ENV_ALARM_DROP], DROP_RANGE)
        except ValueError as e:
            problems.append(str(e))
    if env.get(ENV_ALARM_THRESHOLD) is not None:
        try:
            threshold = parse_number(ENV_ALARM_THRESHOLD, env[ENV_ALARM_THRESHOLD], THRESHOLD_RANGE)
        except ValueError as e:
            problems.append(str(e))
    problems += unknown_problems
    errors += [f"eagle3_capture: {p}; {ALARM_OFF}" for p in problems]
    if problems:
        return AlarmSettings(profile, required, None, problems[0]), errors, refusals
    return AlarmSettings(profile, required, DriftSettings(drop=drop, threshold=threshold)), errors, refusals


__all__ = ["ENV_PROFILE", "ENV_PROFILE_REQUIRED", "ENV_ALARM_DROP", "ENV_ALARM_THRESHOLD", "SETTINGS", "GUARD",
           "ALARM_OFF", "AlarmSettings", "parse_required", "parse_number", "parse_profile_path", "read_alarm"]
