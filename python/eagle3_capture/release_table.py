"""What every serving engine's release table shares: how versions sort, the step tables the facts are kept in, and
the shape of a table, so that SGLang's (``sglang_releases/``) and the next engine's read alike.

An engine's table is one package that owns everything this project knows of that engine's releases, and everything
else reads it (detection, the doctor, the docs tables, the Makefile's matrix): no second list. It exposes

* ``ENGINE`` (its name in messages), ``KNOWN_VERSIONS`` (oldest first), ``OLDEST``, ``NEWEST``;
* ``RELEASES``: one record per version, built from step tables (``(first release with the value, value)``, oldest
  first, read with :func:`since`), with at least ``version``, ``plugin_supported`` (this project's plugin serves
  it, read against its source and tested on it) and ``cpu_blocker`` (why it cannot run on the CPU machine, one
  line; None when it runs there);
* ``release(version)`` (a ValueError naming the range for anything else), ``assumed_release(version)`` (given,
  else the installed one, else the newest) and ``supported()`` (the versions the plugin serves).

Pure Python: nothing here imports an engine.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")


def version_key(text: str) -> Optional[Tuple[int, int, int, int]]:
    """Sort key of a release version (N.N.N or N.N.N.postN; a .post sorts after its release), None if not one."""
    m = _VERSION_RE.match(text)
    if m is None:
        return None
    post = -1 if m.group(4) is None else int(m.group(4))
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), post


def since(steps: Sequence[Tuple[str, T]], version: str) -> Optional[T]:
    """The value of a step table (first version, value), oldest first, at ``version``."""
    key = version_key(version)
    value = None
    for first, v in steps:
        if version_key(first) <= key:
            value = v
    return value


def span_text(versions: Sequence[str], sep: str = " through ") -> str:
    """``first<sep>last`` of consecutive versions (one version alone when there is one)."""
    if not versions:
        return "none"
    return versions[0] if len(versions) == 1 else f"{versions[0]}{sep}{versions[-1]}"


__all__ = ["version_key", "since", "span_text"]
