"""Released SGLang and vLLM sources for the tests that check sglang_releases.py / vllm_rules.py against the real code
of each release, kept in a cache directory: ``$E3_SGLANG_RELEASES_DIR`` (default ``<repo>/.venv/sglang-releases``).

Layout, one folder per release:
- ``<dir>/<version>/``: SGLang ``version``'s ``sglang`` package (``.py`` files and the dist-info METADATA: enough to
  read and exec single functions); with ``--importable`` a full ``pip install --no-deps --target`` of the release
  plus the transformers it pins and tokenizers / huggingface_hub / httpx / httpcore, so that
  ``import sglang.srt.models.deepseek_v2`` works beside this venv's torch.
- ``<dir>/vllm-<version>/``: the few ``vllm`` source files vllm_rules.py was read from.
Each folder holds ``.e3-release.json`` once complete (a half-written folder is never used).

Install (network; the lead wires it into make):
    python tests/sglang_release_dirs.py sglang --all            # every modelled release, sources only
    python tests/sglang_release_dirs.py sglang --importable 0.5.12 0.5.13
    python tests/sglang_release_dirs.py vllm 0.33.0 0.34.0
The tests skip a release whose folder is absent, saying which command installs it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
ENV = "E3_SGLANG_RELEASES_DIR"
MARKER = ".e3-release.json"

# Beside the release's own transformers pin, what `import sglang.srt.models.deepseek_v2` needs from outside this
# venv (the venv's are for SGLang 0.5.23): checked for 0.5.11 - 0.5.14 here, with torch 2.14.1.
IMPORT_EXTRAS = ["tokenizers==0.22.2", "huggingface_hub<2", "httpx", "httpcore"]
# Older releases reach mem_cache/memory_pool_host.py from deepseek_v2.py's imports, which imports sgl_kernel
# (CUDA-only): they cannot be imported on the CPU machine (checked: 0.5.8, 0.5.10).
IMPORTABLE_FROM = "0.5.11"

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


def _metadata_pin(meta: str, name: str) -> str:
    for line in meta.splitlines():
        if line.startswith(f"Requires-Dist: {name}=="):
            return line.split("==", 1)[1].split(";")[0].strip()
    raise RuntimeError(f"no '{name}==' pin in the release's METADATA")


def _download(spec: str, into: Path) -> Path:
    subprocess.run(_pip() + ["download", "--no-deps", "-q", spec, "-d", str(into)], check=True)
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {spec}: expected one wheel, got {[w.name for w in wheels]}")
    return wheels[0]


def importable_here(version: str) -> bool:
    """Whether SGLang ``version`` can be imported on a CPU machine (see IMPORTABLE_FROM)."""
    sys.path.insert(0, str(REPO / "python"))
    from eagle3_capture.sglang_releases import KNOWN_VERSIONS

    return version in KNOWN_VERSIONS and KNOWN_VERSIONS.index(version) >= KNOWN_VERSIONS.index(IMPORTABLE_FROM)


def install_sglang(version: str, importable: bool = False) -> Path:
    if importable and not importable_here(version):
        raise SystemExit(f"SGLang {version} cannot be imported on a CPU machine (its deepseek_v2.py imports "
                         f"sgl_kernel through mem_cache/memory_pool_host.py before {IMPORTABLE_FROM}); install its "
                         "sources without --importable")
    final = releases_dir() / version
    have = _marker(final)
    if have is not None and (have.get("importable") or not importable):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=final.parent))
    try:
        tmp = work / "tree"
        if importable:
            wheel_dir = work / "wheel"
            wheel = _download(f"sglang=={version}", wheel_dir)
            with zipfile.ZipFile(wheel) as z:
                meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
                transformers = _metadata_pin(z.read(meta).decode(), "transformers")
            subprocess.run(_pip() + ["install", "--no-deps", "-q", "--target", str(tmp), str(wheel),
                                     f"transformers=={transformers}"] + IMPORT_EXTRAS, check=True)
        else:
            wheel = _download(f"sglang=={version}", work / "wheel")
            with zipfile.ZipFile(wheel) as z:
                for n in z.namelist():
                    if (n.startswith("sglang/") and n.endswith(".py")) or n.endswith(".dist-info/METADATA"):
                        z.extract(n, tmp)
        shutil.rmtree(work / "wheel", ignore_errors=True)
        (tmp / MARKER).write_text(json.dumps({"version": version, "importable": importable}))
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
    s.add_argument("--all", action="store_true", help="every release sglang_releases.py models")
    s.add_argument("--importable", action="store_true")
    v = sub.add_parser("vllm")
    v.add_argument("versions", nargs="+")
    a = p.parse_args(argv)
    if a.what == "sglang":
        sys.path.insert(0, str(REPO / "python"))
        from eagle3_capture.sglang_releases import KNOWN_VERSIONS

        versions = list(KNOWN_VERSIONS) if a.all else a.versions
        if not versions:
            p.error("name the releases or pass --all")
        for ver in versions:
            print(install_sglang(ver, a.importable))
    else:
        for ver in a.versions:
            print(install_vllm(ver))
    return 0


if __name__ == "__main__":
    sys.exit(main())
