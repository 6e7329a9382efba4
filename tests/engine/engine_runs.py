"""The engine tests' server runs, started ahead of the tests that read them and run a few at a time.

Each run (a server configuration and what the tests do with it while it serves: `doctor online`, the acceptance
window, ...) is a function of the runs it needs. A run costs one to fifteen minutes of SGLang's serving loop, and one
server uses about one core of two (the scheduler, interpreted Triton kernels, the client and the doctor take turns):
two at a time keep both cores busy. The tests stay as they were; each fixture asks for its run's result.

- At the start of the session the module's fixture `runs` starts every run the selected tests need (a `-k` that
  selects a few tests starts only theirs), longest first, so the two longest overlap with each other and the short
  ones fill in behind them; each run is started once its own prerequisites are done.
- ``E3_ENGINE_PARALLEL`` (default 2): how many runs at a time. 1 runs them one after another, as before.
- A run that fails raises its error in every test that reads it, as a failed session fixture would.
"""
from __future__ import annotations

import heapq
import json
import os
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Sequence, Set, Tuple

import pytest

PARALLEL_ENV = "E3_ENGINE_PARALLEL"
RUN_TAG = "_e3_engine_run"   # on a run fixture's function: the run it reads


@dataclass
class Run:
    name: str
    fn: Callable          # fn(*results of needs)
    needs: Tuple[str, ...]
    priority: int         # lower starts first among the runs that are ready
    future: Future = field(default_factory=Future)
    wanted: bool = False
    queued: bool = False
    started: float = 0.0
    seconds: float = 0.0


class Runs:
    """Runs by name, each started once, at most `parallel` at a time, by priority among those whose prerequisites
    are done."""

    def __init__(self, parallel: int):
        if parallel < 1:
            raise ValueError(f"{PARALLEL_ENV} must be >= 1, got {parallel}")
        self.parallel = parallel
        self._runs: Dict[str, Run] = {}
        self._ready: List[Tuple[int, int, str]] = []   # heap of (priority, order, name)
        self._order = 0
        self._cv = threading.Condition()
        self._threads: List[threading.Thread] = []
        self._closed = False

    @classmethod
    def from_env(cls) -> "Runs":
        raw = os.environ.get(PARALLEL_ENV, "2")
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"{PARALLEL_ENV} must be an integer >= 1, got {raw!r}") from None
        return cls(n)

    def add(self, name: str, fn: Callable, needs: Sequence[str] = (), priority: int = 50) -> None:
        if name in self._runs:
            raise ValueError(f"run {name!r} added twice")
        self._runs[name] = Run(name, fn, tuple(needs), priority)

    def names(self) -> List[str]:
        return list(self._runs)

    def want(self, names: Iterable[str]) -> None:
        """Start these runs (and what they need) as soon as they can start."""
        with self._cv:
            for name in names:
                self._want(name)
            self._release()
        self._spawn()

    def get(self, name: str):
        """The run's result, started now if it was not (its error raised if it failed)."""
        self.want([name])
        return self._runs[name].future.result()

    def seconds(self) -> Dict[str, float]:
        """How long each finished run took, from its start."""
        return {r.name: round(r.seconds, 1) for r in self._runs.values() if r.future.done()}

    def close(self) -> None:
        """End the workers; a run still going (an interrupted session) has its servers stopped first."""
        if any(r.queued and not r.future.done() for r in self._runs.values()):
            from engine_fixtures import stop_every_server

            stop_every_server()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    # ------------------------------------------------------------------------------------------------------------

    def _want(self, name: str) -> None:
        if name not in self._runs:
            raise KeyError(f"no run named {name!r} (known: {sorted(self._runs)})")
        run = self._runs[name]
        if run.wanted:
            return
        run.wanted = True
        for dep in run.needs:
            self._want(dep)

    def _release(self) -> None:
        """Queue every wanted run whose prerequisites are done (called with the lock held)."""
        for run in self._runs.values():
            if run.wanted and not run.queued and all(self._runs[d].future.done() for d in run.needs):
                run.queued = True
                heapq.heappush(self._ready, (run.priority, self._order, run.name))
                self._order += 1
        self._cv.notify_all()

    def _spawn(self) -> None:
        with self._cv:
            while len(self._threads) < self.parallel:
                t = threading.Thread(target=self._worker, name=f"engine-run-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._ready and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                _, _, name = heapq.heappop(self._ready)
            run = self._runs[name]
            run.started = time.time()
            try:
                deps = [self._runs[d].future.result() for d in run.needs]  # done: they were released
                result = run.fn(*deps)
            except BaseException as e:  # the run's failure is every reader's error
                run.seconds = time.time() - run.started
                run.future.set_exception(e)
            else:
                run.seconds = time.time() - run.started
                run.future.set_result(result)
            with self._cv:
                self._release()


# ----------------------------------------------------------------------------------------------------------------
# one Runs per pytest session, shared by the engine test modules
# ----------------------------------------------------------------------------------------------------------------

_SESSION: dict = {"runs": None, "defined": set()}


def runs_for_session(request, pair, define: Callable) -> Runs:
    """The session's Runs; `define(runs, pair)` adds a module's runs once, and every one of them that a selected
    test reads (through a `run_fixture`) starts now."""
    s = _SESSION
    if s["runs"] is None:
        s["runs"] = Runs.from_env()
        root = pair.root

        def end():
            runs = s["runs"]
            runs.close()
            s["runs"], s["defined"] = None, set()
            took = runs.seconds()
            with open(os.path.join(root, "runs_seconds.json"), "w") as f:
                json.dump(took, f, indent=1)
            print(f"\nengine runs ({runs.parallel} at a time), seconds each: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(took.items(), key=lambda kv: -kv[1])),
                  file=sys.stderr)

        request.session.config.add_cleanup(end)
    runs = s["runs"]
    if define not in s["defined"]:
        before = set(runs.names())
        define(runs, pair)
        s["defined"].add(define)
        added = set(runs.names()) - before
        runs.want(sorted(needed_by(request.session.items) & added))
    return runs


def needed_by(items) -> Set[str]:
    """The runs the selected tests read: their fixtures made by `run_fixture`, and those a parametrized test reads
    by name with request.getfixturevalue (a parameter whose value is the name of a run fixture it can see)."""
    names = set()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for name in item.fixturenames:
            defs = info.name2fixturedefs.get(name)
            if defs and getattr(defs[-1].func, RUN_TAG, None) == name:
                names.add(name)
        params = getattr(getattr(item, "callspec", None), "params", {})
        for value in params.values():
            if isinstance(value, str) and getattr(getattr(item.module, value, None), RUN_TAG, None) == value:
                names.add(value)
    return names


def run_fixture(name: str, define: Callable):
    """A session fixture named like the run `name` (added by `define`), whose value is the run's result."""

    def fixture(request, pair):
        return runs_for_session(request, pair, define).get(name)

    setattr(fixture, RUN_TAG, name)
    return pytest.fixture(scope="session", name=name)(fixture)
