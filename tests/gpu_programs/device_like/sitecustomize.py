"""Imports as on the GPU machine, on the CPU machine (test-only): with this folder on PYTHONPATH and
``E3_DEVICE_LIKE=<SGLang release>`` set, Python's ``site`` runs this file at start-up, and every third-party top-level module whose
distribution the GPU machine would not have is invisible, as it is there: ``importlib.util.find_spec`` answers
None (transformers' ``is_soundfile_available()`` reads False) and ``import`` raises ModuleNotFoundError. What the GPU machine has: its image's distributions (image_packages.txt beside this file), the
wheels carried for that release (scripts/gpu_sglang/device_wheels.txt), the stand-ins
(scripts/gpu_sglang/standins), this project and its test plugin (built there). Standard-library modules and
modules no distribution owns (folders put on PYTHONPATH, such as a release folder's) are left alone.

The CPU environment holds more than the GPU machine (soundfile, IPython, sgl_kernel's absence aside); a module
that SGLang's launch_server path imports from it passes here and fails there (``soundfile`` did, through
http_server -> openai/serving_transcription -> audio_chunking). With this file, it fails here too.
``E3_DEVICE_LIKE_HIDE=a,b`` also hides those stand-ins (a test that the check catches a missing one).
"""
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
_STANDINS = os.path.join(_REPO, "scripts", "gpu_sglang", "standins")
_BUILT_THERE = {"eagle3-capture", "e3-sglang-cpu-standins"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _image() -> set:
    with open(os.path.join(_HERE, "image_packages.txt")) as f:
        return {_norm(ln.strip()) for ln in f if ln.strip() and not ln.startswith("#")}


def carried(release: str) -> set:
    """The distributions scripts/gpu_sglang/device_wheels.txt carries for ``release`` (common lines + its own)."""
    out, section = set(), None
    with open(os.path.join(_REPO, "scripts", "gpu_sglang", "device_wheels.txt")) as f:
        for ln in f:
            ln = ln.split("#", 1)[0].strip()
            if not ln:
                continue
            m = re.fullmatch(r"\[(.+)\]", ln)
            if m:
                section = m.group(1)
            elif section is None or section == release:
                out.add(_norm(re.split(r"[=<>!~ ;\[]", ln, 1)[0]))
    return out


class _DeviceLike(importlib.abc.MetaPathFinder):
    """Python's PathFinder, blind to the blocked top-level names (it takes PathFinder's place on sys.meta_path:
    raising from find_spec instead would break code that asks whether a package exists)."""

    def __init__(self, release: str, hide: set):
        self.release, self.hide = release, hide
        self.allowed = allowed = _image() | carried(release) | _BUILT_THERE
        standins = {n for n in os.listdir(_STANDINS) if not n.startswith((".", "_"))}
        # a stand-in's name is found in the stand-ins' folder only, never as this machine's real package
        self.standins = {n[:-3] if n.endswith(".py") else n for n in standins} - hide
        self.blocked = {}
        for mod, dists in importlib.metadata.packages_distributions().items():
            if mod in self.standins or mod in sys.stdlib_module_names:
                continue
            if not any(_norm(d) in allowed for d in dists):
                self.blocked[mod] = sorted(dists)
        for name in hide:
            self.blocked.setdefault(name, ["(its stand-in, hidden)"])

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.blocked:
            return None
        if fullname in self.standins:  # from the stand-ins' folder when it is on the path, as on the GPU machine
            on_path = [p for p in sys.path if p and os.path.realpath(p) == os.path.realpath(_STANDINS)]
            return importlib.machinery.PathFinder.find_spec(fullname, on_path, target) if on_path else None
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        """importlib.metadata's view: the distributions the GPU machine would have (a blocked package has no
        metadata there either); those that name no distribution (a folder on PYTHONPATH) as found."""
        for d in importlib.machinery.PathFinder.find_distributions(context):
            name = d.metadata["Name"] if d.metadata is not None else None
            if name is None or _norm(name) in self.allowed:
                yield d

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


_release = os.environ.get("E3_DEVICE_LIKE")
if _release:
    _hide = {n for n in os.environ.get("E3_DEVICE_LIKE_HIDE", "").split(",") if n}
    sys.meta_path[:] = [_DeviceLike(_release, _hide) if f is importlib.machinery.PathFinder else f
                        for f in sys.meta_path]
