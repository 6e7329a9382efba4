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
            unit = self.unit + ("s" if self.total != 1 and len(self.unit) > 2 else "")  # "prompts", but "it"
            self.file.write(f"{self.desc}: {self.n}/{self.total} {unit} in {time.perf_counter() - self.start:.1f} s"
                            f"{extra}\n")
            self.file.flush()

    def set_postfix(self, **values) -> None:
        self.postfix = values


def on_terminal(file: Optional[TextIO] = None) -> bool:
    """Whether ``file`` (default stderr) is a terminal: where a bar redrawn in place belongs (a library's own bars,
    e.g. transformers' weight loading, are turned off elsewhere)."""
    out = sys.stderr if file is None else file
    isatty = getattr(out, "isatty", None)
    return bool(isatty is not None and isatty())


def bar(total: int, desc: str, unit: str, enabled: bool = True, file: Optional[TextIO] = None):
    """A progress bar for a phase of ``total`` steps: tqdm on a terminal, :class:`PhaseLine` elsewhere, :class:`NoBar`
    when not ``enabled``. Each has ``update(n)``, ``set_postfix(**values)`` and ``close()``."""
    if not enabled:
        return NoBar()
    out = sys.stderr if file is None else file
    if on_terminal(out):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=False, file=out)
    return PhaseLine(total, desc, unit, out)


__all__ = ["on_terminal", "bar", "NoBar", "PhaseLine"]
