#!/usr/bin/env python3
"""The sm_120a compile gate: the built extension must hold machine code for every kernel on every arch it was built
for (by default 90a, 100a and 120a), so a Blackwell workstation (sm_120) never meets a kernel with no code.

Lists the SASS of the library with cuobjdump, groups kernel names by arch, and fails (exit 1) unless every
expected arch is present, every arch holds the same kernel set, and each required kernel family is in each arch.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

REQUIRED_FAMILIES = ["capture_kernel", "fused_add_rmsnorm_capture_kernel", "draft_fc_decode_kernel",
                     "draft_fc_bulk_kernel", "draft_fc_normalize_kernel", "gather_p2p_kernel"]


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


def kernels_by_arch(cuobjdump: str, lib: str) -> dict[str, set[str]]:
    out = subprocess.run([cuobjdump, "-sass", lib], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"check_cubins: {cuobjdump} -sass {lib} failed:\n{out.stderr}")
    arch, found = None, {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
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
    args = ap.parse_args()
    lib = args.library
    if lib is None:
        here = os.path.dirname(os.path.abspath(__file__))
        libs = glob.glob(os.path.join(here, "..", "python", "eagle3_capture", "_C*.so"))
        if not libs:
            sys.exit("check_cubins: no built python/eagle3_capture/_C*.so; build first")
        lib = libs[0]
    found = kernels_by_arch(find_cuobjdump(), lib)
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
