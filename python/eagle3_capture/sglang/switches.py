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
``all``            every hook: the plugin registers nothing (same as ``SGLANG_PLUGINS`` without it)
=================  =================================================================================================

``EAGLE3_CAPTURE_DUMP=<dir>``: save what the target captured in its first eager forwards (see dump.py);
``EAGLE3_CAPTURE_DUMP_MAX`` (default 8) caps how many.

An unknown name in ``EAGLE3_CAPTURE_DISABLE`` is an error (a typo must not leave a hook on that the operator
meant to turn off): the plugin then registers nothing and SGLang logs the message.
"""
from __future__ import annotations

import logging
import os
from typing import FrozenSet, Mapping, Optional

ENV_DISABLE = "EAGLE3_CAPTURE_DISABLE"
ENV_DUMP = "EAGLE3_CAPTURE_DUMP"
ENV_DUMP_MAX = "EAGLE3_CAPTURE_DUMP_MAX"

TAPS = "taps"
FINAL_BOUNDARY = "final_boundary"
CAPTURE = "capture"
DRAFT_FC = "draft_fc"
GATHER = "gather"
HOOKS = (TAPS, FINAL_BOUNDARY, CAPTURE, DRAFT_FC, GATHER)
ALL = "all"

logger = logging.getLogger("eagle3_capture.sglang")


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
