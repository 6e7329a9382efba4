"""The SGLang plugin's settings (environment variables), validated once when SGLang loads the plugin, and its
logging.

Every setting is read and checked in :func:`read_settings` (called by ``plugin.register()``, i.e. at startup in every
SGLang process); the hooks then read the result (:func:`current`), never the environment. A malformed setting never
makes ``register()`` raise (SGLang's ``load_plugins()`` would log a traceback and serve stock SGLang without the
plugin): it is either ignored with one ERROR line saying what is ignored, the rest of the plugin staying on, or it
makes the plugin refuse to serve (``refusal``: one line, raised at model load, which stops the server).

========================================  ==========  ==============================================================
setting                                   default     a malformed value
========================================  ==========  ==============================================================
``EAGLE3_CAPTURE_DISABLE``                (none)      refuses: an unknown name was meant to turn something off
``EAGLE3_CAPTURE_SELFTEST`` log|raise     ``log``     refuses: the operator chose between stopping and logging
``EAGLE3_CAPTURE_DUMP`` <dir>             (off)       ERROR line, dump off (a file, not creatable, not writable)
``EAGLE3_CAPTURE_DUMP_MAX`` n             256         ERROR line, dump off: served forwards (records) per process
``EAGLE3_CAPTURE_DUMP_REQUESTS`` n        16          ERROR line, dump off: served requests followed per process
``EAGLE3_CAPTURE_DUMP_TOKENS`` n          16384       ERROR line, dump off: served rows (tokens) per process
``EAGLE3_CAPTURE_DUMP_BYTES`` size        4G          ERROR line, dump off: bytes written per process (all records)
``EAGLE3_CAPTURE_DUMP_STREAM``            declared    ERROR line, dump off: ``declared`` or ``all`` layer inputs
``EAGLE3_CAPTURE_DUMP_STREAM_TOKENS`` n   4096        ERROR line, dump off: rows of doctor forwards given a stream
``EAGLE3_CAPTURE_PROFILE`` <path>         (no alarm)  ERROR line at model load, alarm off (counting, export stay on):
                                                      unreadable, or made under other speculative flags
``EAGLE3_CAPTURE_PROFILE_REQUIRED`` 0|1   0           refuses: 1 refuses to serve, at model load, when the alarm
                                                      cannot run (no usable profile, a bad alarm setting)
``EAGLE3_CAPTURE_ALARM_DROP`` x           0.2         ERROR line, alarm off: the relative drop the CUSUM is tuned to
``EAGLE3_CAPTURE_ALARM_THRESHOLD`` nats   16          ERROR line, alarm off: the CUSUM's threshold h
``EAGLE3_CAPTURE_SELFTEST_EVERY`` n       10000       ERROR line, the default: re-run the self-test every n served
                                                      target forwards (0: never by count; at most 10**9)
``EAGLE3_CAPTURE_SELFTEST_SECONDS`` s     300         ERROR line, the default: re-run it when s seconds passed since
                                                      the last run (0: never by time; 1 to 604800, whole seconds)
========================================  ==========  ==============================================================

The acceptance settings are settings/alarm.py's (the profile file is read at the target's model load, when the
server's speculative flags are known); the false-alarm bound follows from the threshold (acceptance/drift.py).

The self-test's period (monitor/selftest.py; whichever of the two comes first) is not a guard: a malformed one costs
only the re-checks' timing, so it is ignored with one ERROR line and the default applies. Its bounds: a count up to
10**9 (more is a typo of many digits; a count of 1 is allowed, for tests, and costs a device sync on every capturing
forward); whole seconds from 1 (a sub-second period would re-check on nearly every forward) to one week (a longer one is
a typo: use 0 to turn the time trigger off).

A name of the environment that looks like one of the package's (``EAGLE3_CAPTURE_SELFTST``,
``EAGLE3_CAPTURE_DUMPDIR``, ``eagle3_capture_disable``; settings/typos.py finds them) but is none of its variables is
said in one line naming the closest known name: a near-miss of a guard (:data:`GUARDS`: ``EAGLE3_CAPTURE_SELFTEST``,
``EAGLE3_CAPTURE_DISABLE``, ``EAGLE3_CAPTURE_PROFILE_REQUIRED``) refuses, naming the guard meant (read as unset, it
would serve the opposite of what the operator chose), and so does a name exactly as near to two known names (which
was meant cannot be told); a name closest to a setting of the dump turns the dump off with an ERROR line (a misspelt
bound must never write more than asked); any other is ignored with an ERROR line.

``EAGLE3_CAPTURE_DISABLE``: comma-separated hooks to leave out; empty or unset installs every hook.

=================  =================================================================================================
name               what it turns off
=================  =================================================================================================
``taps``           reading the draft's tap ids through the tap spec (``set_eagle3_layers_to_capture`` of the
                   DeepseekV2 family, and the draft-config read that supplies the ids' convention): SGLang's own
                   rule applies again (``+1`` only when ``ids[0] == 1``)
``final_boundary`` capturing the final boundary ``LayerOutput(L-1)`` (before the final norm); with ``taps`` on, a
                   draft that declares that tap then fails at model load instead of losing it
``capture``        writing captures through ``eagle3_capture::capture_`` (SGLang's ``copy_`` is used instead)
``draft_fc``       the fused draft fc (``ops.draft_fc``) in the EAGLE-3 drafts
``gather``         the project's gatherer (``tp.PackedGatherer``) for the draft fc's column shards at TP > 1
                   (SGLang's ``_fc_gatherer`` is used instead); has no effect when ``draft_fc`` is off
``selftest``       the capture self-test on served forwards (monitor/selftest.py: at the first that captures, then
                   periodically and after a weight update) and its refusal of requests in ``raise`` mode
``acceptance``     counting per-position acceptance (``Req.update_spec_correct_drafts_histogram``), its export
                   and the drift alarm (monitor/live.py)
``all``            the whole plugin, the dump included: it registers nothing (same as ``SGLANG_PLUGINS`` without it);
                   an ``EAGLE3_CAPTURE_DUMP`` set beside it is said in the startup line and not used
=================  =================================================================================================

Sizes (``EAGLE3_CAPTURE_DUMP_BYTES``) are an integer number of bytes with an optional binary suffix: ``K``, ``M``,
``G``, ``T`` (or ``KiB`` ... ``TiB``). Counts are non-negative integers; 0 dumps nothing of that kind.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import FrozenSet, List, Mapping, Optional, Tuple

from ...dump_format import STREAM_DECLARED, STREAM_MODES
from . import alarm as alarm_settings
from .alarm import AlarmSettings
from .typos import unknown_names

ENV_DISABLE = "EAGLE3_CAPTURE_DISABLE"
ENV_SELFTEST = "EAGLE3_CAPTURE_SELFTEST"
ENV_DUMP = "EAGLE3_CAPTURE_DUMP"
ENV_DUMP_MAX = "EAGLE3_CAPTURE_DUMP_MAX"
ENV_DUMP_REQUESTS = "EAGLE3_CAPTURE_DUMP_REQUESTS"
ENV_DUMP_TOKENS = "EAGLE3_CAPTURE_DUMP_TOKENS"
ENV_DUMP_BYTES = "EAGLE3_CAPTURE_DUMP_BYTES"
ENV_DUMP_STREAM = "EAGLE3_CAPTURE_DUMP_STREAM"
ENV_DUMP_STREAM_TOKENS = "EAGLE3_CAPTURE_DUMP_STREAM_TOKENS"
ENV_SELFTEST_EVERY = "EAGLE3_CAPTURE_SELFTEST_EVERY"
ENV_SELFTEST_SECONDS = "EAGLE3_CAPTURE_SELFTEST_SECONDS"
DEFAULT_SELFTEST_EVERY = 10000   # served target forwards between re-checks
DEFAULT_SELFTEST_SECONDS = 300   # seconds between re-checks
MAX_SELFTEST_EVERY = 10 ** 9
MAX_SELFTEST_SECONDS = 7 * 24 * 3600
# the dump's budgets: (variable, DumpSettings field, default)
DUMP_COUNTS = ((ENV_DUMP_MAX, "max_records", 256), (ENV_DUMP_REQUESTS, "max_requests", 16),
               (ENV_DUMP_TOKENS, "max_tokens", 16384), (ENV_DUMP_STREAM_TOKENS, "stream_tokens", 4096))
DEFAULT_DUMP_BYTES = 4 << 30
DUMP_SETTINGS = (ENV_DUMP, ENV_DUMP_MAX, ENV_DUMP_REQUESTS, ENV_DUMP_TOKENS, ENV_DUMP_BYTES, ENV_DUMP_STREAM,
                 ENV_DUMP_STREAM_TOKENS)
ENV_PROFILE = alarm_settings.ENV_PROFILE
ENV_PROFILE_REQUIRED = alarm_settings.ENV_PROFILE_REQUIRED
ENV_ALARM_DROP = alarm_settings.ENV_ALARM_DROP
ENV_ALARM_THRESHOLD = alarm_settings.ENV_ALARM_THRESHOLD
SETTINGS = ((ENV_DISABLE, ENV_SELFTEST) + DUMP_SETTINGS + (ENV_SELFTEST_EVERY, ENV_SELFTEST_SECONDS)
            + alarm_settings.SETTINGS)
_DUMP_PREFIX = ENV_DUMP + "_"
# the settings whose misspelt name refuses to serve, and what the operator chose with each
GUARDS = {ENV_SELFTEST: "chooses whether a failed capture self-test stops the server",
          ENV_DISABLE: "chooses which hooks are off", **alarm_settings.GUARD}
MAX_COUNT = 10 ** 12  # far beyond any budget a process can spend; refuses a typo of many digits

TAPS = "taps"
FINAL_BOUNDARY = "final_boundary"
CAPTURE = "capture"
DRAFT_FC = "draft_fc"
GATHER = "gather"
SELFTEST = "selftest"
ACCEPTANCE = "acceptance"
HOOKS = (TAPS, FINAL_BOUNDARY, CAPTURE, DRAFT_FC, GATHER, SELFTEST, ACCEPTANCE)
ALL = "all"

logger = logging.getLogger("eagle3_capture.sglang")


def announce(level: str, msg: str) -> None:
    """Log one line the plugin promises, so that it reaches the server's log. SGLang loads plugins before it
    configures logging (the engine's and every scheduler's process): with no handler on the root logger yet, or one
    at WARNING, an INFO line would be dropped, so the line goes to stderr in SGLang's own format instead (unless the
    plugin's own logger was set above that level)."""
    lvl = getattr(logging, level.upper())
    if (logging.getLogger().handlers or logger.handlers) and logger.isEnabledFor(lvl):
        logger.log(lvl, msg)
        return
    # No handler yet, or one whose level would drop the line: importing SGLang's modules (the plugin reads the
    # installed release's internals at load) installs a root handler at WARNING before SGLang configures logging.
    if lvl < logger.getEffectiveLevel() and logger.level != logging.NOTSET:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    tag = "" if lvl == logging.INFO else f" {logging.getLevelName(lvl)}"
    try:
        sys.stderr.write(f"[{stamp}]{tag} {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not break the server
        pass


# ----------------------------------------------------------------------------------------------------------------
# Parsers of one value each: raise ValueError naming the variable, what was expected and what was found
# ----------------------------------------------------------------------------------------------------------------

def _env(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _disable_names(raw: str) -> List[str]:
    return [n.strip().lower() for n in raw.split(",") if n.strip()]


def disabled_hooks(environ: Optional[Mapping[str, str]] = None) -> FrozenSet[str]:
    """The hooks ``EAGLE3_CAPTURE_DISABLE`` turns off. Raises ValueError on a name it does not know."""
    raw = _env(environ).get(ENV_DISABLE, "")
    names = _disable_names(raw)
    unknown = [n for n in names if n not in HOOKS and n != ALL]
    if unknown:
        raise ValueError(f"{ENV_DISABLE}={raw!r}: unknown hook name(s) {unknown}; expected a comma-separated "
                         f"subset of {list(HOOKS)} or '{ALL}'")
    if ALL in names:
        return frozenset(HOOKS)
    return frozenset(names)


def _selftest_raise(raw: str) -> bool:
    v = raw.strip().lower()
    if v not in ("", "log", "raise"):
        raise ValueError(f"{ENV_SELFTEST}={raw!r}: expected 'log' or 'raise'")
    return v == "raise"


def selftest_every(raw: str) -> int:
    """``EAGLE3_CAPTURE_SELFTEST_EVERY``: served target forwards between re-checks, 0 (off) to 10**9."""
    v = raw.strip()
    if not re.fullmatch(r"[0-9]{1,10}", v) or int(v) > MAX_SELFTEST_EVERY:
        raise ValueError(f"{ENV_SELFTEST_EVERY}={raw!r}: expected a whole number of served forwards from 0 (never "
                         f"by count) to {MAX_SELFTEST_EVERY}")
    return int(v)


def selftest_seconds(raw: str) -> int:
    """``EAGLE3_CAPTURE_SELFTEST_SECONDS``: seconds between re-checks, 0 (off) or 1 to one week."""
    v = raw.strip()
    if not re.fullmatch(r"[0-9]{1,7}", v) or int(v) > MAX_SELFTEST_SECONDS:
        raise ValueError(f"{ENV_SELFTEST_SECONDS}={raw!r}: expected whole seconds from 1 to {MAX_SELFTEST_SECONDS} "
                         "(one week), or 0 (never by time)")
    return int(v)


def _count(name: str, raw: str) -> int:
    v = raw.strip()
    if not re.fullmatch(r"\d{1,13}", v) or int(v) > MAX_COUNT:
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer (at most {MAX_COUNT})")
    return int(v)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(name: str, raw: str) -> int:
    """Bytes from ``<int>`` or ``<int><K|M|G|T>`` (binary; ``KiB`` ... ``TiB`` too)."""
    m = re.fullmatch(r"(\d{1,13})\s*([KMGT]?)(?:iB)?", raw.strip(), flags=re.IGNORECASE)
    if m is None or (not m.group(2) and raw.strip()[-2:].lower() == "ib"):
        raise ValueError(f"{name}={raw!r}: expected a size in bytes, e.g. 4294967296, 512M or 4G (binary units)")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n > MAX_COUNT * (1 << 10):
        raise ValueError(f"{name}={raw!r}: larger than any disk ({n} bytes)")
    return n


def _stream_mode(raw: str) -> str:
    v = raw.strip().lower() or STREAM_DECLARED
    if v not in STREAM_MODES:
        raise ValueError(f"{ENV_DUMP_STREAM}={raw!r}: expected one of {list(STREAM_MODES)}")
    return v


def prepare_dump_dir(raw: str) -> str:
    """The dump directory as an absolute path, created if missing and checked writable (a file is written and
    removed). Raises ValueError saying why it cannot be used."""
    path = os.path.abspath(os.path.expanduser(raw.strip()))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{ENV_DUMP}={raw!r}: {path} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".eagle3_capture_probe_"):
            pass
    except OSError as e:
        raise ValueError(f"{ENV_DUMP}={raw!r}: {path} cannot be written ({e.strerror or e})") from None
    return path


# ----------------------------------------------------------------------------------------------------------------
# All settings at once
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DumpSettings:
    """The capture dump's directory and bounds (dump/forwards.py); each bound is per process."""

    directory: str
    max_records: int = 256      # served forwards (records), EAGLE3_CAPTURE_DUMP_MAX
    max_requests: int = 16      # served requests whose rows are dumped
    max_tokens: int = 16384     # served rows
    max_bytes: int = DEFAULT_DUMP_BYTES  # every record, the doctor's streams included
    stream: str = STREAM_DECLARED
    stream_tokens: int = 4096   # rows of forwards holding a doctor request, dumped with their stream


@dataclass(frozen=True)
class Settings:
    """Every setting as validated at registration. ``errors``: one ERROR line per ignored setting; ``refusal``:
    why the plugin refuses to serve (None: it serves)."""

    disabled: FrozenSet[str] = frozenset()
    selftest_raise: bool = False
    dump: Optional[DumpSettings] = None
    errors: Tuple[str, ...] = ()
    refusal: Optional[str] = None
    source: dict = field(default_factory=dict, compare=False)  # the raw values read (for the log)
    all_off: bool = False  # EAGLE3_CAPTURE_DISABLE=all: nothing of the plugin, the dump included
    alarm: AlarmSettings = AlarmSettings()  # the expected profile and the drift alarm's tuning
    selftest_every: int = DEFAULT_SELFTEST_EVERY      # served target forwards between re-checks (0: off)
    selftest_seconds: int = DEFAULT_SELFTEST_SECONDS  # seconds between re-checks (0: off)


def read_settings(environ: Optional[Mapping[str, str]] = None, *, prepare_dir: bool = True) -> Settings:
    """Validate every setting; never raises. `prepare_dir`: create and probe the dump directory (registration
    does; a pure parse for a report need not)."""
    env = _env(environ)
    raw = {k: env.get(k) for k in SETTINGS if env.get(k) is not None}
    refusals: List[str] = []
    errors: List[str] = []
    try:
        disabled = disabled_hooks(env)
    except ValueError as e:
        refusals.append(str(e))
        disabled = frozenset(HOOKS)
    all_off = ALL in _disable_names(env.get(ENV_DISABLE, "")) and not refusals
    try:
        selftest_raise = _selftest_raise(env.get(ENV_SELFTEST, ""))
    except ValueError as e:
        refusals.append(str(e))
        selftest_raise = False
    unknown = unknown_names(env, SETTINGS, GUARDS)
    for u in unknown:
        if u.guard:
            also = f" (the closest known name is {u.closest})" if u.closest != u.guard else ""
            refusals.append(f"{u.shown()} is not a setting of the plugin; it looks like a misspelt {u.guard}, "
                            f"which {GUARDS[u.guard]}{also}: serving with it unread would guess that choice")
        elif u.tie:
            refusals.append(f"{u.shown()} is not a setting of the plugin and is exactly as near to {u.closest} as to "
                            f"{u.tie}: which one was meant cannot be told, and serving with it unread would guess")
        elif not _of_the_dump(u) and not _of_the_alarm(u):
            errors.append(f"eagle3_capture: {u.name} is not a variable of eagle3-capture ({u.near()}); ignored")
    period = {}
    for name, parse, default in ((ENV_SELFTEST_EVERY, selftest_every, DEFAULT_SELFTEST_EVERY),
                                 (ENV_SELFTEST_SECONDS, selftest_seconds, DEFAULT_SELFTEST_SECONDS)):
        try:
            period[name] = parse(env[name]) if env.get(name) is not None else default
        except ValueError as e:  # the period is no guard: its default re-checks as well
            errors.append(f"eagle3_capture: {e}; ignored: the default {default} applies")
            period[name] = default
    unknown = [u for u in unknown if not u.guard and not u.tie]  # refused above: said once, there
    dump, dump_errors = _read_dump(env, prepare_dir and not all_off, [u for u in unknown if _of_the_dump(u)],
                                   all_off)
    errors += dump_errors
    alarm, alarm_errors, alarm_refusals = alarm_settings.read_alarm(
        env, [f"{u.name} is not a setting of the plugin ({u.near()})" for u in unknown if _of_the_alarm(u)])
    errors += alarm_errors
    refusals += alarm_refusals
    refusal = None
    if refusals:
        refusal = ("eagle3_capture: refusing to serve: " + "; ".join(refusals) + f" (fix or unset it; "
                   f"{ENV_DISABLE}=all turns the plugin off)")
    return Settings(disabled, selftest_raise, None if all_off else dump, tuple(errors), refusal, raw, all_off,
                    alarm, period[ENV_SELFTEST_EVERY], period[ENV_SELFTEST_SECONDS])


def _of_the_dump(u) -> bool:
    """An unknown name meant for the dump: one of its settings is the closest known name, or it starts like them."""
    return u.closest in DUMP_SETTINGS or u.name.upper().startswith(_DUMP_PREFIX)


def _of_the_alarm(u) -> bool:
    """An unknown name meant for the acceptance alarm: one of its settings is the closest known name."""
    return u.closest in alarm_settings.SETTINGS and not _of_the_dump(u)


def _read_dump(env: Mapping[str, str], prepare_dir: bool, unknown=(), all_off: bool = False
               ) -> Tuple[Optional[DumpSettings], List[str]]:
    directory = env.get(ENV_DUMP, "").strip()
    on = bool(directory) and not all_off
    tail = ("ignored: the capture dump is off in this process (the rest of the plugin is on)" if on
            else f"ignored ({ENV_DISABLE}=all: no dump)" if all_off
            else f"ignored ({ENV_DUMP} is not set: no dump)")
    problems: List[str] = []
    values = {}
    for name, key, default in DUMP_COUNTS:
        if env.get(name) is None:
            values[key] = default
            continue
        try:
            values[key] = _count(name, env[name])
        except ValueError as e:
            problems.append(str(e))
    try:
        values["max_bytes"] = (parse_size(ENV_DUMP_BYTES, env[ENV_DUMP_BYTES]) if env.get(ENV_DUMP_BYTES) is not None
                               else DEFAULT_DUMP_BYTES)
    except ValueError as e:
        problems.append(str(e))
    try:
        values["stream"] = _stream_mode(env.get(ENV_DUMP_STREAM, ""))
    except ValueError as e:
        problems.append(str(e))
    for u in unknown:
        problems.append(f"{u.name} is not a setting of the plugin ({u.near()})")
    if on and not problems and prepare_dir:
        try:
            directory = prepare_dump_dir(directory)
        except ValueError as e:
            problems.append(str(e))
    errors = [f"eagle3_capture: {p}; {tail}" for p in problems]
    if not on or problems:
        return None, errors
    return DumpSettings(directory=directory if prepare_dir else os.path.abspath(directory), **values), errors


_current: Optional[Settings] = None


def configure(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Read and validate the settings, and make them the ones the hooks use (plugin.register() calls this)."""
    global _current
    _current = read_settings(environ)
    return _current


def current() -> Settings:
    """The settings the hooks use: those of the last :func:`configure` (read from the environment if none ran)."""
    if _current is None:
        return configure()
    return _current


def enabled(hook: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {list(HOOKS)}")
    if environ is not None:
        return hook not in disabled_hooks(environ)
    return hook not in current().disabled


def selftest_raises(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a failed self-test raises (``EAGLE3_CAPTURE_SELFTEST=raise``) or logs (unset or ``log``); with an
    explicit `environ`, parses it (ValueError on a bad value)."""
    if environ is not None:
        return _selftest_raise(environ.get(ENV_SELFTEST, ""))
    return current().selftest_raise


def selftest_period() -> Tuple[int, int]:
    """(served target forwards, seconds) between re-runs of the self-test; 0 turns that trigger off."""
    s = current()
    return s.selftest_every, s.selftest_seconds


def dump_settings() -> Optional[DumpSettings]:
    """The dump's settings in force (None: off)."""
    return current().dump


__all__ = ["ENV_DISABLE", "ENV_SELFTEST", "ENV_DUMP", "ENV_DUMP_MAX", "ENV_DUMP_REQUESTS", "ENV_DUMP_TOKENS",
           "ENV_DUMP_BYTES", "ENV_DUMP_STREAM", "ENV_DUMP_STREAM_TOKENS", "ENV_SELFTEST_EVERY", "ENV_SELFTEST_SECONDS",
           "DEFAULT_SELFTEST_EVERY", "DEFAULT_SELFTEST_SECONDS", "MAX_SELFTEST_EVERY", "MAX_SELFTEST_SECONDS",
           "selftest_every", "selftest_seconds", "selftest_period", "DUMP_SETTINGS", "SETTINGS", "HOOKS", "ALL", "TAPS",
           "FINAL_BOUNDARY", "CAPTURE", "DRAFT_FC", "GATHER", "SELFTEST", "ACCEPTANCE", "DumpSettings", "Settings",
           "read_settings", "configure", "current", "enabled", "selftest_raises", "dump_settings",
           "disabled_hooks", "parse_size", "prepare_dump_dir", "announce", "logger", "GUARDS", "DUMP_SETTINGS",
           "ENV_PROFILE", "ENV_PROFILE_REQUIRED", "ENV_ALARM_DROP", "ENV_ALARM_THRESHOLD", "AlarmSettings"]
