"""Environment switches and logging of the SGLang plugin.

``EAGLE3_CAPTURE_DISABLE``: comma-separated hooks to leave out (read when SGLang loads the plugin, i.e. at
startup in every SGLang process); empty or unset installs every hook.

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
``selftest``       the capture self-test on the first capturing forward (selftest.py)
``all``            every hook: the plugin registers nothing (same as ``SGLANG_PLUGINS`` without it)
=================  =================================================================================================

``EAGLE3_CAPTURE_SELFTEST=raise``: a failed self-test raises instead of logging one ERROR line.

``EAGLE3_CAPTURE_DUMP=<dir>``: save what the target captured in its first eager forwards (see dump.py);
``EAGLE3_CAPTURE_DUMP_MAX`` (default 8) caps how many.

An unknown name in ``EAGLE3_CAPTURE_DISABLE`` is an error (a typo must not leave a hook on that the operator
meant to turn off): the plugin then registers nothing and SGLang logs the message.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import FrozenSet, Mapping, Optional

ENV_DISABLE = "EAGLE3_CAPTURE_DISABLE"
ENV_DUMP = "EAGLE3_CAPTURE_DUMP"
ENV_DUMP_MAX = "EAGLE3_CAPTURE_DUMP_MAX"
ENV_SELFTEST = "EAGLE3_CAPTURE_SELFTEST"

TAPS = "taps"
FINAL_BOUNDARY = "final_boundary"
CAPTURE = "capture"
DRAFT_FC = "draft_fc"
GATHER = "gather"
SELFTEST = "selftest"
HOOKS = (TAPS, FINAL_BOUNDARY, CAPTURE, DRAFT_FC, GATHER, SELFTEST)
ALL = "all"

logger = logging.getLogger("eagle3_capture.sglang")


def announce(level: str, msg: str) -> None:
    """Log one line the plugin promises, so that it reaches the server's log. SGLang loads plugins before it
    configures logging (the engine's and every scheduler's process): with no handler on the root logger yet, an
    INFO line would be dropped, so the line goes to stderr in SGLang's own format instead."""
    lvl = getattr(logging, level.upper())
    if logging.getLogger().handlers or logger.handlers:
        logger.log(lvl, msg)
        return
    if lvl < logger.getEffectiveLevel() and logger.level != logging.NOTSET:
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    tag = "" if lvl == logging.INFO else f" {logging.getLevelName(lvl)}"
    try:
        sys.stderr.write(f"[{stamp}]{tag} {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not break the server
        pass


def disabled_hooks(environ: Optional[Mapping[str, str]] = None) -> FrozenSet[str]:
    """The hooks ``EAGLE3_CAPTURE_DISABLE`` turns off. Raises ValueError on a name it does not know."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_DISABLE, "")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in HOOKS and n != ALL]
    if unknown:
        raise ValueError(f"{ENV_DISABLE}={raw!r}: unknown hook name(s) {unknown}; expected a comma-separated "
                         f"subset of {list(HOOKS)} or '{ALL}'")
    if ALL in names:
        return frozenset(HOOKS)
    return frozenset(names)


def enabled(hook: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {list(HOOKS)}")
    return hook not in disabled_hooks(environ)


def selftest_raises(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a failed self-test raises (``EAGLE3_CAPTURE_SELFTEST=raise``) or logs (unset or ``log``)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_SELFTEST, "").strip().lower()
    if raw not in ("", "log", "raise"):
        raise ValueError(f"{ENV_SELFTEST}={raw!r}: expected 'log' or 'raise'")
    return raw == "raise"


def dump_dir(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    env = os.environ if environ is None else environ
    d = env.get(ENV_DUMP, "").strip()
    return d or None


def dump_max(environ: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if environ is None else environ
    raw = env.get(ENV_DUMP_MAX, "").strip()
    if not raw:
        return 8
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_DUMP_MAX}={raw!r}: expected a non-negative integer") from None
    if n < 0:
        raise ValueError(f"{ENV_DUMP_MAX}={raw!r}: expected a non-negative integer")
    return n
