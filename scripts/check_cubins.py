#!/usr/bin/env python3
"""The CI cubin gate: the built extension must hold machine code for every kernel on every arch it was built for (by
default 90a, 100a and 120a), PTX for the archs built with +PTX (so later parts of those families can compile it), and
every kernel must fit the resources its launcher asks for on sm_120 (cubin_resources.py), so the first user's
Blackwell workstation (sm_120) never meets a kernel with no code or one that cannot launch.

Lists the SASS of the library with cuobjdump, groups kernel names by arch, and fails (exit 1) unless every
expected arch is present, every arch holds the same kernel set, each required kernel family is in each arch, each
expected PTX arch holds every kernel, and the resource checks pass.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

REQUIRED_FAMILIES = ["capture_kernel", "fused_add_rmsnorm_capture_kernel", "draft_fc_split_decode_kernel",
                     "draft_fc_decode_cluster_kernel", "draft_fc_normalize_kernel",
                     "gather_p2p_kernel"]


def find_cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates.append(os.path.join(cuda_home, "bin", "cuobjdump"))
    try:
        import triton  # ships a cuobjdump with its NVIDIA backend

        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("check_cubins: no cuobjdump found (set CUOBJDUMP, or install triton which ships one)")


def sass_of(cuobjdump: str, lib: str) -> str:
    out = subprocess.run([cuobjdump, "-sass", lib], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"check_cubins: {cuobjdump} -sass {lib} failed:\n{out.stderr}")
    return out.stdout


def ptx_kernels_by_arch(cuobjdump: str, lib: str) -> dict[str, set[str]]:
    """{compute_XY: kernel entries} of the PTX embedded in the library."""
    out = subprocess.run([cuobjdump, "-ptx", lib], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"check_cubins: {cuobjdump} -ptx {lib} failed:\n{out.stderr}")
    arch, found = None, {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1).replace("sm_", "compute_")
            found.setdefault(arch, set())
            continue
        m = re.match(r"\s*\.(?:visible\s+)?\.entry\s+(\S+?)\(?$", line.strip()) or \
            re.match(r"\.(?:visible\s+)?\.entry\s+([\w$]+)", line.strip())
        if m and arch:
            found[arch].add(m.group(1).rstrip("("))
    return found


def kernels_by_arch(sass: str) -> dict[str, set[str]]:
    """{sm_XY: kernels with SASS}; the fatbin's PTX entries (headed "Fatbin ptx code") hold no SASS and are left out."""
    arch, found, elf = None, {}, True
    for line in sass.splitlines():
        if line.startswith("Fatbin "):
            elf = line.startswith("Fatbin elf")
            arch = None
            continue
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m and elf:
            arch = m.group(1)
            found.setdefault(arch, set())
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m and arch:
            found[arch].add(m.group(1))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("library", nargs="?", help="the built _C*.so (default: the one in python/eagle3_capture)")
    ap.add_argument("--archs", default="90a,100a,120a", help="archs that must be present (default 90a,100a,120a)")
    ap.add_argument("--ptx", default="100,120", help="PTX archs that must be present (default 100,120; '' for none)")
    ap.add_argument("--no-resources", action="store_true", help="skip the resource checks (cubin_resources.py)")
    args = ap.parse_args()
    lib = args.library
    if lib is None:
        here = os.path.dirname(os.path.abspath(__file__))
        libs = glob.glob(os.path.join(here, "..", "python", "eagle3_capture", "_C*.so"))
        if not libs:
            sys.exit("check_cubins: no built python/eagle3_capture/_C*.so; build first")
        lib = libs[0]
    cuobjdump = find_cuobjdump()
    sass = sass_of(cuobjdump, lib)
    found = kernels_by_arch(sass)
    want = [f"sm_{a.strip()}" for a in args.archs.split(",") if a.strip()]
    ok = True
    union = set().union(*found.values()) if found else set()
    if not union:
        print(f"FAIL: {lib} holds no CUDA kernels at all")
        return 1
    for arch in want:
        have = found.get(arch)
        if have is None:
            print(f"FAIL: no {arch} code in {lib} (archs present: {sorted(found)})")
            ok = False
            continue
        missing = sorted(union - have)
        fams = [f for f in REQUIRED_FAMILIES if not any(f in k for k in have)]
        if missing or fams:
            ok = False
            print(f"FAIL: {arch}: {len(missing)} kernels lack {arch} code, e.g. {missing[:3]}; missing families {fams}")
        else:
            print(f"ok: {arch}: all {len(have)} kernels present")
    extra = sorted(set(found) - set(want))
    if extra:
        print(f"note: archs beyond the expected ones: {extra}")
    want_ptx = [f"compute_{a.strip()}" for a in args.ptx.split(",") if a.strip()]
    if want_ptx:
        ptx = ptx_kernels_by_arch(cuobjdump, lib)
        for arch in want_ptx:
            missing = sorted(union - ptx.get(arch, set()))
            if arch not in ptx or missing:
                ok = False
                print(f"FAIL: {arch} PTX: {len(missing)} kernels lack it, e.g. {missing[:2]} (PTX present: {sorted(ptx)})")
            else:
                print(f"ok: {arch} PTX: all {len(ptx[arch])} kernels present")
    if not args.no_resources:
        import cubin_resources  # scripts/: the script's own folder, first on sys.path

        fails = cubin_resources.check(cuobjdump, lib, want, sass)
        for f in fails:
            print(f"FAIL: {f}")
        ok = ok and not fails
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
