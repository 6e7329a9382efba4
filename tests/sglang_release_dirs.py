"""Released SGLang and vLLM sources for the tests that check sglang_releases/ / vllm_rules.py against the real code
of each release, kept in a cache directory: ``$E3_SGLANG_RELEASES_DIR`` (default ``<repo>/.venv/sglang-releases``).

Layout, one folder per release:
- ``<dir>/<version>/``: SGLang ``version``'s ``sglang`` package (``.py`` files and the dist-info METADATA: enough to
  read and exec single functions); with ``--importable`` a full ``pip install --no-deps --target`` of the release
  beside this environment's torch, with the pure-Python packages this environment cannot lend it: the transformers
  the release pins (older releases register configs transformers 5.19 already has, and fail to import with it)
  and whatever that transformers requires at a version this environment does not satisfy (tokenizers,
  huggingface-hub, httpx ...), and the xgrammar it pins. Everything else -- torch above all -- comes from this
  environment, so one torch serves every release: put the folder first on PYTHONPATH to run on that release
  (``make test-sglang SGLANG=X`` does).
- ``<dir>/vllm-<version>/``: the few ``vllm`` source files vllm_rules.py was read from.
Each folder holds ``.e3-release.json`` once complete (a half-written folder is never used).

Install (network; ``make test-releases`` runs these):
    python tests/sglang_release_dirs.py sglang --all            # every modelled release, sources only
    python tests/sglang_release_dirs.py sglang --importable 0.5.12 0.5.13
    python tests/sglang_release_dirs.py vllm 0.33.0 0.34.0
``--importable`` prints the folder to put on PYTHONPATH (an empty line when this environment has that release
already). A test whose release folder is absent skips, saying which command installs it; ``make test-releases``
installs them all first, so none skips there. Exit 2 with one line on a release that is not modelled.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
ENV = "E3_SGLANG_RELEASES_DIR"
MARKER = ".e3-release.json"

# Pins of the release this environment must match, or the release gets its own copy.
PINNED = ("transformers", "xgrammar")
# Requirements of those that are never copied: this environment's must do (compiled against its torch, or used by it).
NEVER_COPY = {"torch", "numpy", "safetensors", "regex", "pyyaml", "tqdm", "packaging", "filelock", "fsspec"}

# What the `sglang_releases` tests read, all installed by `python tests/sglang_release_dirs.py for-tests` (make
# test-releases): every modelled release's sources, these releases importable (one of each adapter and of each id
# rule that imports on a CPU machine; the import probe of test_sglang_releases_code.py runs on them, and make
# test-sglang's matrix on some), and the vLLM releases vllm_rules.py models.
IMPORT_PROBED = ("0.5.11", "0.5.12", "0.5.13", "0.5.16", "0.5.20", "0.5.21")
VLLM_RELEASES = ("0.33.0", "0.34.0")

# The vllm files vllm_rules.py was read from (kept; the 240-340 MB wheel is deleted after extraction).
VLLM_FILES = [
    "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/v1/worker/gpu/model_runner.py",
    "vllm/transformers_utils/configs/eagle.py",
    "vllm/config/speculative.py",
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/model_executor/models/interfaces.py",
    "vllm/model_executor/models/llama_eagle3.py",
    "vllm/model_executor/models/deepseek_eagle3.py",
]


def releases_dir() -> Path:
    return Path(os.environ.get(ENV) or REPO / ".venv" / "sglang-releases")


def _marker(d: Path) -> Optional[dict]:
    try:
        return json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return None


def sglang_source(version: str) -> Optional[Path]:
    """The folder holding SGLang ``version``'s ``sglang`` package, or None when not installed."""
    d = releases_dir() / version
    return d if _marker(d) is not None and (d / "sglang" / "srt").is_dir() else None


def sglang_importable(version: str) -> Optional[Path]:
    """The folder to put first on sys.path to import SGLang ``version``, or None when not installed so."""
    d = sglang_source(version)
    return d if d is not None and _marker(d).get("importable") else None


def vllm_source(version: str) -> Optional[Path]:
    d = releases_dir() / f"vllm-{version}"
    return d if _marker(d) is not None and (d / "vllm").is_dir() else None


def install_hint(kind: str, version: str) -> str:
    flag = " --importable" if kind == "importable" else ""
    what = "vllm" if kind == "vllm" else "sglang"
    return (f"not installed under {releases_dir()} (${ENV}): python tests/sglang_release_dirs.py {what}{flag} "
            f"{version}")


def _pip() -> List[str]:
    return [sys.executable, "-m", "pip"]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(meta: str):
    """(name, specifier) of a METADATA's unconditional Requires-Dist lines (extras and platform markers left out)."""
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if ";" in req:
            req, marker = (x.strip() for x in req.split(";", 1))
            if "extra" in marker or "sys_platform" in marker or "python_version" in marker:
                continue
        m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)", req)
        if m:
            out.append((_canonical(m.group(1)), m.group(2).strip().strip("()")))
    return out


def _dist_meta(target: Path, name: str) -> str:
    for d in target.glob("*.dist-info"):
        if _canonical(d.name[:-len(".dist-info")].rsplit("-", 1)[0]) == _canonical(name):
            return (d / "METADATA").read_text()
    raise RuntimeError(f"{name} was installed into {target} but has no dist-info there")


def _satisfied(name: str, spec: str) -> bool:
    """Whether this environment (not the target) has `name` at a version matching `spec`."""
    from packaging.specifiers import SpecifierSet

    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return not spec or have in SpecifierSet(spec)


def _pip_install(target: Path, *specs: str) -> None:
    r = subprocess.run(_pip() + ["install", "-q", "--no-deps", "--target", str(target), *specs],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("WARNING: Location")]
        raise SystemExit(f"sglang_release_dirs.py: pip failed installing {' '.join(specs)}:\n" + "\n".join(lines[-20:]))


def _copy_missing(target: Path, meta: str, depth: int = 4) -> List[str]:
    """Install into `target` each requirement in `meta` this environment does not satisfy (and theirs)."""
    added = []
    for name, spec in _requirements(meta):
        present = any(_canonical(d.name[:-len(".dist-info")].rsplit("-", 1)[0]) == name
                      for d in target.glob("*.dist-info"))
        if name in NEVER_COPY or present or _satisfied(name, spec):
            continue
        _pip_install(target, f"{name}{spec}" if spec else name)
        added.append(name)
        if depth > 1:
            added += _copy_missing(target, _dist_meta(target, name), depth - 1)
    return added


def _import_check(target: Path, version: str) -> str:
    """Whether the release imports beside this torch as on a GPU server, which has sglang-kernel and the CuTe DSL:
    their import-only stand-ins (e3_sglang_cpu.sgl_kernel_standin) last on the path, for a release that imports
    them whatever the device (0.5.15 imports cutlass)."""
    from e3_sglang_cpu import sgl_kernel_standin

    standins = sgl_kernel_standin.make_folder(str(target.parent / "import_standins"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH"),
                                                                   standins) if p))
    check = ("import warnings; warnings.filterwarnings('ignore'); import sglang, transformers; "
             "import sglang.srt.models.deepseek_v2, sglang.srt.plugins.hook_registry; "
             "print(sglang.__version__, transformers.__version__)")
    r = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.split() or r.stdout.split()[0] != version:
        raise SystemExit(f"sglang_release_dirs.py: sglang {version} in {target} does not import beside torch "
                         f"{metadata.version('torch')}:\n{(r.stderr or r.stdout)[-3000:]}")
    return r.stdout.split()[1]


def _download(spec: str, into: Path) -> Path:
    subprocess.run(_pip() + ["download", "--no-deps", "-q", spec, "-d", str(into)], check=True)
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {spec}: expected one wheel, got {[w.name for w in wheels]}")
    return wheels[0]


def _releases():
    """The release table, from the checkout's package (bootstrap: this file runs as a script, outside pytest, where
    the package may not be installed yet)."""
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    from eagle3_capture import sglang_releases

    return sglang_releases


def known_versions():
    """The modelled releases (the release table's)."""
    return _releases().KNOWN_VERSIONS


def cpu_blocker(version: str) -> str:
    """Why SGLang ``version`` cannot run on a CPU machine, from the release table ("" when it can)."""
    return _releases().release(version).cpu_blocker or ""


def importable_here(version: str) -> bool:
    """Whether SGLang ``version`` can be imported on a CPU machine (the release table's cpu_blocker)."""
    return version in known_versions() and not cpu_blocker(version)


def _installed_here() -> Optional[str]:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def install_sglang(version: str, importable: bool = False) -> Path:
    if importable and not importable_here(version):
        raise SystemExit(f"SGLang {version} cannot run on a CPU machine ({cpu_blocker(version)}); install its "
                         "sources without --importable")
    final = releases_dir() / version
    have = _marker(final)
    if have is not None and (have.get("importable") or not importable):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=final.parent))
    try:
        tmp = work / "tree"
        copied: List[str] = []
        if importable:
            wheel = _download(f"sglang=={version}", work / "wheel")
            _pip_install(tmp, str(wheel))
            for name, spec in _requirements(_dist_meta(tmp, "sglang")):
                if name in PINNED and not _satisfied(name, spec):
                    _pip_install(tmp, f"{name}{spec}")
                    copied.append(f"{name}{spec}")
                    copied += _copy_missing(tmp, _dist_meta(tmp, name))
            shutil.rmtree(tmp / "bin", ignore_errors=True)  # console scripts of the copies: unused, misleading
            transformers = _import_check(tmp, version)
        else:
            wheel = _download(f"sglang=={version}", work / "wheel")
            with zipfile.ZipFile(wheel) as z:
                for n in z.namelist():
                    if (n.startswith("sglang/") and n.endswith(".py")) or n.endswith(".dist-info/METADATA"):
                        z.extract(n, tmp)
        shutil.rmtree(work / "wheel", ignore_errors=True)
        marker = {"version": version, "importable": importable}
        if importable:
            marker.update(transformers=transformers, copied=copied)
        (tmp / MARKER).write_text(json.dumps(marker))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)  # complete folders only: a reader never sees a half-written one
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def install_vllm(version: str) -> Path:
    final = releases_dir() / f"vllm-{version}"
    if _marker(final) is not None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".vllm-{version}-", dir=final.parent))
    try:
        wheel = _download(f"vllm=={version}", work / "wheel")
        tmp = work / "tree"
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            for n in VLLM_FILES:
                if n in names:
                    z.extract(n, tmp)
            meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
            z.extract(meta, tmp)
        (tmp / MARKER).write_text(json.dumps({"version": version, "files": VLLM_FILES}))
        tmp.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sglang")
    s.add_argument("versions", nargs="*")
    s.add_argument("--all", action="store_true", help="every release sglang_releases/ models")
    s.add_argument("--importable", action="store_true")
    v = sub.add_parser("vllm")
    v.add_argument("versions", nargs="+")
    sub.add_parser("for-tests", help="everything the sglang_releases tests read (sources of every modelled release, "
                                     "IMPORT_PROBED importable, the vLLM releases)")
    a = p.parse_args(argv)
    if a.what == "for-tests":
        for ver in known_versions():
            install_sglang(ver, importable=ver in IMPORT_PROBED)
        for ver in VLLM_RELEASES:
            install_vllm(ver)
        print(releases_dir())
        return 0
    if a.what == "sglang":
        known = known_versions()
        versions = list(known) if a.all else a.versions
        if not versions:
            p.error("name the releases or pass --all")
        unknown = [v for v in versions if v not in known]
        if unknown:
            p.exit(2, f"sglang_release_dirs.py: SGLang {', '.join(unknown)} is not a release sglang_releases/ "
                      f"models (known: {known[0]} through {known[-1]}, .post releases included)\n")
        for ver in versions:
            if a.importable and _installed_here() == ver:
                print(f"sglang_release_dirs.py: this environment has sglang {ver} already", file=sys.stderr)
                print("")
                continue
            print(install_sglang(ver, a.importable))
    else:
        for ver in a.versions:
            print(install_vllm(ver))
    return 0


if __name__ == "__main__":
    sys.exit(main())
