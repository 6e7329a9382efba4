#!/usr/bin/env python3
"""Install one SGLang release beside this environment's torch, for the plugin's tests on that release.

    usage: python scripts/sglang_release.py [--help] [--dir DIR] VERSION

SGLang X goes into DIR (default .venv/sglang-releases/X) with ``pip install --no-deps --target``, together with the
pure-Python packages whose versions this environment cannot lend it: the transformers the release pins (older
releases register configs that transformers 5.19 already has, and fail to import with it) and whatever that
transformers requires at a version this environment does not satisfy (tokenizers, huggingface-hub, httpx ...), and
the xgrammar it pins. Everything else -- torch above all -- comes from this environment, so one torch serves every
release. Run the tests on X with ``PYTHONPATH=DIR`` in front (the last line printed is that directory).

Idempotent: a finished directory holds a stamp and is reused. When this environment already has SGLang X, nothing
is installed and the last line is empty (no directory to put in front). Exit 2 with one line on a version outside
the range the plugin supports, 1 when pip or the import check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# The range the plugin supports (python/eagle3_capture/sglang/internals.py says which adapter each gets).
OLDEST, NEWEST = (0, 5, 12), (0, 5, 23)
ROOT = Path(__file__).resolve().parents[1]
STAMP = ".e3-release.json"
# Pins of the release whose version this environment must match, or the release gets its own copy.
PINNED = ("transformers", "xgrammar")
# Requirements of those packages that are never copied: this environment's must do (compiled against its torch or
# used by it).
NEVER_COPY = {"torch", "numpy", "safetensors", "regex", "pyyaml", "tqdm", "packaging", "filelock", "fsspec"}


def version_tuple(v: str):
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", v)
    return tuple(int(x) for x in m.groups()) if m else None


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sglang_release.py", description=__doc__.split("\n\n")[0])
    p.add_argument("version", help="an SGLang release from 0.5.12 through 0.5.23, e.g. 0.5.12 or 0.5.13.post1")
    p.add_argument("--dir", type=Path, default=None, help="install directory (default .venv/sglang-releases/X)")
    a = p.parse_args(argv)
    t = version_tuple(a.version)
    if t is None or not (OLDEST <= t <= NEWEST):
        p.exit(2, f"sglang_release.py: SGLang {a.version!r} is not a release the plugin supports: expected "
                  f"{'.'.join(map(str, OLDEST))} through {'.'.join(map(str, NEWEST))} (X.Y.Z or X.Y.Z.postN)\n")
    return a


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("WARNING: Location")]
        sys.exit(f"sglang_release.py: pip failed: {' '.join(cmd[3:])}\n" + "\n".join(lines[-20:]))


def requirements(dist_dir: Path):
    """(name, specifier) of a dist-info's unconditional Requires-Dist lines."""
    out = []
    for line in (dist_dir / "METADATA").read_text().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if ";" in req:  # extras and platform markers: not what an import needs here
            marker = req.split(";", 1)[1]
            if "extra" in marker or "sys_platform" in marker or "python_version" in marker:
                continue
            req = req.split(";", 1)[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)", req)
        if m:
            out.append((canonical(m.group(1)), m.group(2).strip().strip("()")))
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(dist_dir: Path) -> str:
    """The canonical project name of a ``<name>-<version>.dist-info`` directory."""
    return canonical(dist_dir.name[:-len(".dist-info")].rsplit("-", 1)[0])


def dist_info(target: Path, name: str) -> Path:
    for d in target.glob("*.dist-info"):
        if dist_name(d) == canonical(name):
            return d
    raise SystemExit(f"sglang_release.py: {name} was installed into {target} but has no dist-info there")


def satisfied(name: str, spec: str) -> bool:
    """Whether this environment (not the target) has `name` at a version matching `spec`."""
    from packaging.specifiers import SpecifierSet

    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return not spec or have in SpecifierSet(spec)


def copy_missing(target: Path, dist: Path, depth: int = 4) -> list:
    """Install into `target` each requirement of `dist` this environment does not satisfy (and theirs)."""
    added = []
    for name, spec in requirements(dist):
        if name in NEVER_COPY or satisfied(name, spec) or any(
                dist_name(d) == name for d in target.glob("*.dist-info")):
            continue
        pip("--target", str(target), f"{name}{spec}" if spec else name)
        added.append(name)
        if depth > 1:
            added += copy_missing(target, dist_info(target, name), depth - 1)
    return added


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if metadata.version("sglang") == a.version and a.dir is None:
            print(f"sglang_release.py: this environment has sglang {a.version} already", file=sys.stderr)
            print("")
            return 0
    except metadata.PackageNotFoundError:
        pass
    target = (a.dir or ROOT / ".venv" / "sglang-releases" / a.version).resolve()
    stamp = target / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("sglang") == a.version:
        print(target)
        return 0
    if target.exists():
        shutil.rmtree(target)  # pip --target over an old directory keeps packages another run removed
    target.mkdir(parents=True)
    print(f"sglang_release.py: installing sglang=={a.version} into {target}", file=sys.stderr)
    pip("--target", str(target), f"sglang=={a.version}")
    added = []
    for name, spec in requirements(dist_info(target, "sglang")):
        if name in PINNED and not satisfied(name, spec):
            pip("--target", str(target), f"{name}{spec}")
            added.append(f"{name}{spec}")
            added += copy_missing(target, dist_info(target, name))
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts of the copies: not used, and misleading
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(":"))
    check = ("import warnings; warnings.filterwarnings('ignore'); import sglang, transformers; "
             "import sglang.srt.models.deepseek_v2, sglang.srt.plugins.hook_registry; "
             "print(sglang.__version__, transformers.__version__)")
    r = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.split() or r.stdout.split()[0] != a.version:
        sys.exit(f"sglang_release.py: sglang {a.version} in {target} does not import beside torch "
                 f"{metadata.version('torch')}:\n{(r.stderr or r.stdout)[-3000:]}")
    sg, tf = r.stdout.split()[:2]
    stamp.write_text(json.dumps({"sglang": sg, "transformers": tf, "copied": added}) + "\n")
    print(f"sglang_release.py: sglang {sg} with transformers {tf} imports (own copies: {added or 'none'})",
          file=sys.stderr)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
