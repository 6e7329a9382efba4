"""Progress of the doctor's long phases on stderr: a tqdm bar on a terminal, and elsewhere (a log file, a pipe, CI)
one line per phase when it completes -- a bar redrawn with carriage returns is, in a file, one line of thousands of
characters (``make demo``'s training bar was)."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class NoBar:
    """Progress turned off (``--no-progress``): the bar's methods, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass


class PhaseLine(NoBar):
    """A phase's progress where stderr is not a terminal: counted, and said in one line when the count reaches the
    total (``training the draft: 400/400 it in 41.2 s, loss 1.23``). A phase cut short by an error says nothing,
    so that a bad input still ends in its one error line."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO):
        self.total, self.desc, self.unit, self.file = int(total), desc, unit, file
        self.n = 0
        self.postfix: dict = {}
        self.start = time.perf_counter()
        self.said = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self.total and not self.said:
            self.said = True
            extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
            self.file.write(f"{self.desc}: {self.n}/{self.total} {self.unit} in "
                            f"{time.perf_counter() - self.start:.1f} s{extra}\n")
            self.file.flush()

    def set_postfix(self, **values) -> None:
        self.postfix = values


def bar(total: int, desc: str, unit: str, enabled: bool = True, file: Optional[TextIO] = None):
    """A progress bar for a phase of ``total`` steps: tqdm on a terminal, :class:`PhaseLine` elsewhere, :class:`NoBar`
    when not ``enabled``. Each has ``update(n)``, ``set_postfix(**values)`` and ``close()``."""
    if not enabled:
        return NoBar()
    out = sys.stderr if file is None else file
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False, file=out)
    return PhaseLine(total, desc, unit, out)


__all__ = ["bar", "NoBar", "PhaseLine"]
