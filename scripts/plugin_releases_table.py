#!/usr/bin/env python3
"""Print docs/sglang_releases.md's table "The plugin on each release" from the plugin's own detection: for each
release (default: every release the plugin serves, and the newest it refuses), ``eagle3-capture info`` run with
that release's folder (tests/sglang_release_dirs.py sglang --importable X) first on PYTHONPATH, i.e. what the plugin
really finds and hooks there -- not a hand-written claim; a release that cannot run on the CPU machine gets the
release table's one line saying why.

    python scripts/plugin_releases_table.py [--help] [VERSION ...]

tests/plugin/test_sglang_internals.py checks the installed release's row of the document against the same output.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bootstrap (a script; tests load it by path): tests/sglang_release_dirs.py and the checkout's package
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "python"))

from sglang_release_dirs import sglang_importable  # noqa: E402

GROUPS = ("taps", "final_boundary", "capture", "draft_fc", "gather", "selftest", "acceptance", "dump")
HEADER = ["SGLang", "adapter", "final boundary from"] + list(GROUPS)


def short(path: str) -> str:
    """`Class.method` (or `module.function`) of a dotted path."""
    return ".".join(path.split(".")[-2:])


# `eagle3-capture info` with sgl_kernel importable where the release needs it to import its scheduler (0.5.12): a GPU
# server always has sglang-kernel, so the table says what the plugin finds and hooks there (the import-only
# stand-in of e3_sglang_cpu.sgl_kernel_standin, as the model-level tests and the release smoke use)
INFO_AS_A_GPU_SERVER_SEES_IT = """
import runpy, sys
from e3_sglang_cpu import sgl_kernel_standin
sgl_kernel_standin.install()
sys.argv = ["eagle3-capture", "info"]
runpy.run_module("eagle3_capture", run_name="__main__")
"""


def summary(version: str, folder: str) -> dict:
    paths = (folder, os.path.join(REPO, "python"), os.path.join(REPO, "tests", "sglang_cpu_plugin"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", INFO_AS_A_GPU_SERVER_SEES_IT], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"plugin_releases_table.py: eagle3-capture info failed on SGLang {version}:\n"
                         f"{out.stderr[-2000:]}")
    s = json.loads(out.stdout)["sglang"]
    if s.get("version") != version:
        raise SystemExit(f"plugin_releases_table.py: {folder} holds SGLang {s.get('version')}, not {version}")
    return s


def blocked_row(version: str, why: str) -> list:
    return [version, "cannot run on the CPU machine", why] + [""] * len(GROUPS)


def default_versions() -> list:
    """The newest release the plugin refuses, then every release it serves (the release table's)."""
    from eagle3_capture import sglang_releases as sr

    refused = [r.version for r in sr.RELEASES if not r.plugin_supported and r.cpu_blocker is None]
    return refused[-1:] + list(sr.supported())


def row(s: dict) -> list:
    if s.get("refusal"):
        return [s["version"], "refused at model load", s["refusal"]] + [""] * len(GROUPS)
    cells = [s["version"], s["adapter"] or "none", s["final_boundary"] or "none"]
    for g in GROUPS:
        info = s["groups"][g]
        if "hooks" in info:
            cells.append("<br>".join(f"`{short(p)}`" for p in info["hooks"]))
        else:
            cells.append(f"not here: {info['unavailable']}")
    return cells


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("versions", nargs="*", help="releases (default: every release the plugin serves, and the newest "
                                                "it refuses)")
    a = p.parse_args(argv)
    from eagle3_capture.sglang_releases import release

    versions = a.versions or default_versions()
    from importlib import metadata

    here = metadata.version("sglang")
    rows = []
    for v in versions:
        why = release(v).cpu_blocker
        if why is not None:
            rows.append(blocked_row(v, why))
            continue
        folder = "" if v == here else str(sglang_importable(v) or "")
        if v != here and not folder:
            raise SystemExit(f"plugin_releases_table.py: SGLang {v} is not installed importable "
                             f"(python tests/sglang_release_dirs.py sglang --importable {v})")
        rows.append(row(summary(v, folder)))
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
