"""Timing the SGLang plugin's hooks inside SGLang's real forwards (benchmarks only; nothing here is used by the
package).

SGLang's HookRegistry replaces each hooked attribute by a wrapper that keeps the hook in a closure cell and the
function it wraps in ``__wrapped__`` (``sglang/srt/plugins/hook_registry.py: _wrap_fn``). The tools here rest on that:

* :class:`PluginHooks` finds the cell of every hook the plugin registered and can put another version's hook
  functions in them (:meth:`PluginHooks.use`): a baseline copy of the package loaded beside the current one
  (:func:`load_baseline`), so the two versions' hooks alternate forward by forward in one process, on the same model
  and the same inputs (timings on a shared machine drift by tens of percent between processes).
* :class:`StockSwitch` puts SGLang's original functions back on every attribute the plugin hooked (and on every
  module binding the registry re-pointed) while active: stock SGLang, interleaved with the plugin the same way.
* :class:`HookTimer` puts a shim in each cell that records the hook's own time per call: the time of the hook minus
  the time spent in the original it calls. What the shim itself adds (a closure, two clock reads, one frame) is
  measured on a pass-through hook and subtracted (:meth:`HookTimer.calibrate`).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pkgutil
import statistics
import sys
import time
import types
from typing import Callable, Dict, List, Tuple

_clock = time.perf_counter_ns


def _hook_cell(wrapper, hook):
    """The closure cell of a registry wrapper that holds `hook` (None if `wrapper` is not its wrapper)."""
    for cell in getattr(wrapper, "__closure__", None) or ():
        try:
            if cell.cell_contents is hook:
                return cell
        except ValueError:
            pass
    return None


def _resolve(path: str):
    obj_path, attr = path.rsplit(".", 1)
    obj = pkgutil.resolve_name(obj_path)
    return obj, attr, (obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr))


# Plugin modules by their path since the plugin has folders -> their flat name before (a baseline copy may be older).
FLAT_NAMES = {"settings.switches": "switches", "dump.forwards": "dump", "monitor.selftest": "selftest"}


class Version:
    """One copy of the package: its plugin's hook table and its modules."""

    def __init__(self, label: str, package: str):
        self.label, self.package = label, package
        self.plugin = importlib.import_module(f"{package}.sglang.plugin")

    def mod(self, name: str):
        """The plugin module ``name`` (its path under sglang/), or, in a copy of the package older than the plugin's
        folders, the flat module of the same role."""
        try:
            return importlib.import_module(f"{self.package}.sglang.{name}")
        except ModuleNotFoundError:
            return importlib.import_module(f"{self.package}.sglang.{FLAT_NAMES[name]}")

    def hooks(self) -> Dict[Tuple[str, str], Callable]:
        """(dotted path, hook name) -> hook function, over every group of the plugin's table."""
        return {(path, fn.__name__): fn for group in self.plugin.HOOKS.values() for path, fn in group}

    def settle(self) -> None:
        """This version's settings read again from the environment, its dump state reset, its self-test done (so
        that each version's hooks take the path of a server past its first forward)."""
        self.mod("settings.switches").configure()
        self.mod("dump.forwards").reset()
        selftest = self.mod("monitor.selftest")
        if selftest.pending():
            selftest._claim()


def load_baseline(tree: str, name: str = "e3_baseline") -> Version:
    """Another copy of the package as the module `name`, e.g. the main branch's:
    ``git archive main python | tar -x -C DIR`` then ``tree=DIR/python``. It shares this process's compiled
    extension, ``native`` and ``ops`` modules (torch ops and their fake implementations register once per process),
    so its plugin modules run on the current op wrappers: what differs is the plugin's own Python."""
    import eagle3_capture
    from eagle3_capture import native, ops

    native.load()
    pkg_dir = os.path.join(tree, "eagle3_capture")
    if not os.path.isfile(os.path.join(pkg_dir, "__init__.py")):
        raise FileNotFoundError(f"no eagle3_capture package under {tree}")
    sys.modules[f"{name}._C"] = eagle3_capture._C
    sys.modules[f"{name}.native"] = native
    sys.modules[f"{name}.ops"] = ops
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg_dir, "__init__.py"),
                                                  submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return Version("baseline", name)


class PluginHooks:
    """The cells of the hooks the plugin registered in this process (each registry wrapper once)."""

    def __init__(self, current: Version):
        self.current = current
        self.entries = []  # (dotted path, hook name, cell)
        seen = set()
        table = current.plugin.HOOKS
        for group in current.plugin.registered:
            for path, fn in table.get(group, []):
                if (path, fn.__name__) in seen:
                    continue
                seen.add((path, fn.__name__))
                _, _, wrapper = _resolve(path)
                cell = _hook_cell(wrapper, fn)
                if cell is None:
                    raise RuntimeError(f"{path}: the outermost wrapper does not run {fn.__name__}")
                self.entries.append((path, fn.__name__, cell))

    def functions(self, version: Version) -> List[Callable]:
        table = version.hooks()
        missing = [(p, n) for p, n, _ in self.entries if (p, n) not in table]
        if missing:
            raise RuntimeError(f"the {version.label} version has no hook {missing}")
        return [table[(p, n)] for p, n, _ in self.entries]

    @contextlib.contextmanager
    def use(self, version: Version):
        """While active, the wrappers run `version`'s hooks; the current version's again afterwards."""
        fns = self.functions(version)
        for (_, _, cell), fn in zip(self.entries, fns):
            cell.cell_contents = fn
        try:
            yield
        finally:
            for (_, _, cell), fn in zip(self.entries, self.functions(self.current)):
                cell.cell_contents = fn

    def wrappers(self) -> List[Tuple[str, object]]:
        return [(path, _resolve(path)[2]) for path, _, _ in self.entries]


class HookTimer:
    """Per-hook self time (ns per call) of one version's hooks while active (a context manager)."""

    def __init__(self, hooks: PluginHooks, version: Version):
        self.hooks, self.version = hooks, version
        self.samples: Dict[str, List[int]] = {}
        self.overhead_ns = 0.0

    @staticmethod
    def name(path: str, hook_name: str) -> str:
        return f"{hook_name} ({path.rsplit('.', 2)[-2]}.{path.rsplit('.', 1)[-1]})"

    def _shim(self, key: str, hook: Callable):
        samples = self.samples.setdefault(key, [])

        def shim(original, *args, **kwargs):
            inner = [0]

            def timed_original(*a, **k):
                t0 = _clock()
                try:
                    return original(*a, **k)
                finally:
                    inner[0] += _clock() - t0

            t0 = _clock()
            try:
                return hook(timed_original, *args, **kwargs)
            finally:
                samples.append(_clock() - t0 - inner[0])

        return shim

    def calibrate(self, n: int = 20000) -> float:
        """The shim's own cost (ns per call): its self time around a pass-through hook of a function that returns at
        once, minus the pass-through's own time measured without the shim."""
        def passthrough(original, *a, **k):
            return original(*a, **k)

        def nothing(*a, **k):
            return None

        shim = self._shim("_calibration", passthrough)
        for _ in range(n):
            shim(nothing, 1, x=2)
        with_shim = statistics.median(self.samples.pop("_calibration"))
        bare, call = [], []
        for _ in range(n):
            t0 = _clock()
            passthrough(nothing, 1, x=2)
            bare.append(_clock() - t0)
        for _ in range(n):
            t0 = _clock()
            nothing(1, x=2)
            call.append(_clock() - t0)
        # the bare pass-through's time includes calling `nothing`; the shim's self time excludes it
        self.overhead_ns = max(0.0, with_shim - (statistics.median(bare) - statistics.median(call)))
        return self.overhead_ns

    def __enter__(self):
        for (path, name, cell), fn in zip(self.hooks.entries, self.hooks.functions(self.version)):
            cell.cell_contents = self._shim(self.name(path, name), fn)
        return self

    def __exit__(self, *exc):
        for (_, _, cell), fn in zip(self.hooks.entries, self.hooks.functions(self.hooks.current)):
            cell.cell_contents = fn
        return False

    def per_forward(self, forwards: int) -> Dict[str, dict]:
        """Per hook: calls per forward, median self time per call, and per forward that median times the calls
        (us; the shim's own cost subtracted; medians, since a shared machine deschedules a process now and then)."""
        out = {}
        for key, s in self.samples.items():
            if not s:
                continue
            med = max(0.0, statistics.median(s) - self.overhead_ns)
            calls = len(s) / forwards
            out[key] = {"calls_per_forward": calls, "us_per_call_median": med / 1e3,
                        "us_per_forward": med * calls / 1e3}
        return out


class StockSwitch:
    """While active (a context manager), every attribute the plugin hooked is SGLang's original function again,
    and so is every module-level name the registry re-pointed to a wrapper."""

    def __init__(self, hooks: PluginHooks):
        self.swaps = []  # (namespace object, attribute, wrapper, original)
        wrappers = {}
        for path, wrapper in hooks.wrappers():
            if id(wrapper) in wrappers:
                continue
            obj, attr, _ = _resolve(path)
            wrappers[id(wrapper)] = (wrapper, wrapper.__wrapped__)
            self.swaps.append((obj, attr, wrapper, wrapper.__wrapped__))
        for mod in list(sys.modules.values()):  # the bindings SGLang's _propagate_patch re-pointed
            if not isinstance(mod, types.ModuleType):
                continue
            try:
                items = list(vars(mod).items())
            except TypeError:
                continue
            for name, value in items:
                hit = wrappers.get(id(value))
                if hit is not None and hit[0] is value and not any(o is mod and a == name for o, a, _, _ in self.swaps):
                    self.swaps.append((mod, name, value, hit[1]))

    def __enter__(self):
        for obj, attr, _, original in self.swaps:
            setattr(obj, attr, original)
        return self

    def __exit__(self, *exc):
        for obj, attr, wrapper, _ in self.swaps:
            setattr(obj, attr, wrapper)
        return False


class OriginalTimer:
    """Stock SGLang (the StockSwitch active) with its original function at `path` timed per call: what SGLang itself
    spends where a plugin hook replaces its work (the packer's append), to set against that hook's own time."""

    def __init__(self, stock: StockSwitch, path: str, overhead_ns: float = 0.0):
        self.stock, self.path, self.overhead_ns = stock, path, overhead_ns
        self.samples: Dict[str, List[int]] = {}

    def __enter__(self):
        self.stock.__enter__()
        obj, attr, original = _resolve(self.path)
        samples = self.samples.setdefault(f"SGLang's own {self.path.rsplit('.', 2)[-2]}.{attr}", [])

        def timed(*a, **k):
            t0 = _clock()
            try:
                return original(*a, **k)
            finally:
                samples.append(_clock() - t0)

        self._restore = (obj, attr, original)
        setattr(obj, attr, timed)
        return self

    def __exit__(self, *exc):
        obj, attr, original = self._restore
        setattr(obj, attr, original)
        self.stock.__exit__(*exc)
        return False

    per_forward = HookTimer.per_forward


__all__ = ["Version", "load_baseline", "PluginHooks", "HookTimer", "StockSwitch", "OriginalTimer"]
