"""Who wrote a dump directory's records, and under which capture declaration.

Replicas behind one load balancer often share one dump volume: their records then sit side by side, and a doctor
that pooled them would let a correct replica's records hide a miswired one's. :func:`inventory` groups the records
it is given (the caller picks them: the doctor reads only its own requests' records where it can) by *capture
declaration* -- the taps the draft declares (``declared``) and the layer inputs the server captured
(``layers_to_capture``) -- and names the writing processes of each (``server``, ``host``, ``pid``: version 3;
version-2 records carry no process id, only the pid in their file name, which replicas in separate PID namespaces
share).

One writer per DP group and per restart is normal, so several writers with one declaration are only a note; two
declarations in one directory are a finding the fingerprint and ``doctor online`` report, each declaration with its
writers and records.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from .contract import V2_FILE_RE
from .reader import DumpRecord, writer_key

_SHOWN = 4  # writers or records named per declaration before "and N more"


@dataclass(frozen=True)
class Declaration:
    """What a record says the server captured for its draft (the grouping key: ``declared`` and
    ``layers_to_capture``; the draft ids are shown, not compared)."""

    declared: Optional[Tuple[str, ...]]
    layers_to_capture: Optional[Tuple[int, ...]]
    draft_ids: Optional[Tuple[int, ...]] = field(default=None, compare=False)

    def text(self) -> str:
        dec = "no declared taps" if self.declared is None else f"declared [{', '.join(self.declared)}]"
        if self.draft_ids is not None:
            dec += f" (draft ids {list(self.draft_ids)})"
        cap = ("capture unknown" if self.layers_to_capture is None else
               f"captured at layer inputs {list(self.layers_to_capture)}")
        return f"{dec}, {cap}"


@dataclass(frozen=True)
class Writer:
    """A process that wrote records: ``key`` is its server id (version 3) or stands for what is known of it."""

    key: str
    host: Optional[str]
    pid: Optional[int]
    version: int

    def text(self) -> str:
        if self.version >= 3:
            return f"server {self.key} (host {self.host}, pid {self.pid})"
        if self.pid is not None:
            return (f"a version-{self.version} writer with pid {self.pid} in its file names (no server id: replicas in "
                    "separate PID namespaces share pids)")
        return f"a version-{self.version} writer (no server id)"


def writer_of(rec: DumpRecord) -> Writer:
    if rec.server is not None:
        return Writer(rec.server, rec.host, rec.pid, rec.version)
    m = V2_FILE_RE.match(os.path.basename(rec.path))
    return Writer(writer_key(rec), None, int(m.group(1)) if m else None, rec.version)


def declaration_of(rec: DumpRecord) -> Declaration:
    return Declaration(None if rec.declared is None else tuple(rec.declared),
                       None if rec.layers_to_capture is None else tuple(rec.layers_to_capture),
                       None if rec.draft_ids is None else tuple(rec.draft_ids))


@dataclass
class Group:
    """The records of one capture declaration, with their writers (in the order first seen)."""

    declaration: Declaration
    writers: Dict[str, Writer] = field(default_factory=dict)
    records: List[str] = field(default_factory=list)
    expected: Optional[bool] = None   # the captured layer inputs are the ones the caller expects (None: not known)

    def text(self, source: str = "") -> str:
        ws = list(self.writers.values())
        who = "; ".join(w.text() for w in ws[:_SHOWN]) + (f"; and {len(ws) - _SHOWN} more" if len(ws) > _SHOWN else "")
        files = ", ".join(os.path.basename(p) for p in self.records[:2]) + (", ..." if len(self.records) > 2 else "")
        tag = "" if self.expected is None else \
            f" -- {'the' if self.expected else 'NOT the'} layer inputs {source or 'expected'} declares"
        return f"{self.declaration.text()}{tag}: {len(self.records)} record(s) ({files}) by {who}"


@dataclass
class DumpInventory:
    groups: List[Group]
    writers: Dict[str, Writer]
    records: int
    expected_source: str = ""

    @property
    def several_declarations(self) -> bool:
        return len(self.groups) > 1

    @property
    def several_writers(self) -> bool:
        return len(self.writers) > 1

    def mixed(self) -> Optional[str]:
        """One line naming each declaration with its writers and records, when there are several (None: one)."""
        if not self.several_declarations:
            return None
        parts = "; ".join(f"({i + 1}) {g.text(self.expected_source)}" for i, g in enumerate(self.groups))
        return (f"the records come from {len(self.groups)} capture declarations, i.e. servers that do not capture "
                f"alike (replicas behind one balancer, or a restart with another draft): {parts}; a verdict over "
                "them together would let one hide the other: check each server's records apart (the file names "
                "carry host and server id)")

    def note(self) -> Optional[str]:
        """One line when several processes wrote records of one declaration (None otherwise)."""
        if self.several_declarations or not self.several_writers:
            return None
        ws = list(self.writers.values())
        who = "; ".join(w.text() for w in ws[:_SHOWN]) + (f"; and {len(ws) - _SHOWN} more" if len(ws) > _SHOWN else "")
        return (f"the records come from {len(ws)} writing processes with one capture declaration "
                f"({self.groups[0].declaration.text()}): {who} (replicas, DP groups or restarts)")

    def to_json(self) -> dict:
        return {"records": self.records, "expected_from": self.expected_source or None,
                "writers": [{"server": w.key, "host": w.host, "pid": w.pid, "version": w.version}
                            for w in self.writers.values()],
                "declarations": [{"declared": _list(g.declaration.declared),
                                  "draft_ids": _list(g.declaration.draft_ids),
                                  "layers_to_capture": _list(g.declaration.layers_to_capture),
                                  "expected": g.expected, "records": len(g.records),
                                  "servers": list(g.writers)} for g in self.groups],
                "mixed": self.mixed(), "note": self.note()}


def _list(t):
    return None if t is None else list(t)


def inventory(records: Iterable[DumpRecord], expected: Optional[List[int]] = None,
              expected_source: str = "") -> DumpInventory:
    """The records grouped by capture declaration, each with its writers. ``expected``: the layer inputs the caller
    expects the served slots to be (a declaration's ``layers_to_capture`` is then tagged as equal or not)."""
    groups: Dict[Declaration, Group] = {}
    writers: Dict[str, Writer] = {}
    n = 0
    for rec in records:
        n += 1
        d = declaration_of(rec)
        g = groups.get(d)
        if g is None:
            g = groups[d] = Group(d, expected=None if expected is None or d.layers_to_capture is None
                                  else list(d.layers_to_capture) == list(expected))
        w = writer_of(rec)
        writers.setdefault(w.key, w)
        g.writers.setdefault(w.key, w)
        g.records.append(rec.path)
    return DumpInventory(list(groups.values()), writers, n, expected_source)


__all__ = ["Declaration", "Writer", "Group", "DumpInventory", "writer_of", "declaration_of", "inventory"]
