"""Builds eagle3_capture._C with torch.utils.cpp_extension (ninja).

CUDA sources (csrc/kernels/*.cu, csrc/ops/*_cuda.cpp) are compiled when nvcc and a CUDA build of torch are present;
otherwise the build is CPU-only. Arch list from TORCH_CUDA_ARCH_LIST (";" or " " separated, e.g. "9.0a;12.0a"),
default "9.0a;10.0a+PTX;12.0a+PTX". "X.Y+PTX" also embeds PTX: for an arch-specific target ("12.0a+PTX") the PTX of
its portable base arch (compute_120), which the driver compiles for later parts of the family (12.1, ...) where the
sm_120a cubin does not load; for a plain target ("12.0+PTX") its own PTX, as torch does. Nothing in the kernels
needs the arch-specific ("a") features, so the portable PTX is the same code. EAGLE3_CAPTURE_FORCE_CPU=1 forces a
CPU-only build; EAGLE3_CAPTURE_REQUIRE_CUDA=1 makes a build that cannot compile CUDA fail instead of silently
producing a CPU-only library.
"""
import glob
import os
import shutil

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCHS = "9.0a;10.0a+PTX;12.0a+PTX"


def _rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def cuda_available_for_build():
    if os.environ.get("EAGLE3_CAPTURE_FORCE_CPU") == "1":
        return False, "EAGLE3_CAPTURE_FORCE_CPU=1"
    if torch.version.cuda is None:
        return False, "torch is a CPU-only build"
    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return False, "nvcc not found (set CUDA_HOME)"
    if not CUDA_HOME or not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")):
        return False, (f"CUDA_HOME={CUDA_HOME!r} has no include/cuda_runtime.h "
                       "(set CUDA_HOME to the toolkit root, e.g. /usr/local/cuda)")
    return True, nvcc


def parse_archs(spec):
    """'9.0a;10.0a+PTX;12.0a' -> [('90a', False), ('100a', True), ('120a', False)]: (arch, embed PTX)."""
    out = []
    for item in spec.replace(" ", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        ptx = item.endswith("+PTX")
        item = item[:-4] if ptx else item
        major, _, minor = item.partition(".")
        if not major.isdigit() or not minor or not minor[0].isdigit():
            raise SystemExit(f"eagle3-capture: cannot parse CUDA arch {item!r} in TORCH_CUDA_ARCH_LIST={spec!r}")
        out.append((major + minor, ptx))
    if not out:
        raise SystemExit(f"eagle3-capture: TORCH_CUDA_ARCH_LIST={spec!r} names no arch")
    return out


def gencode_flags(archs):
    """One cubin per arch; with +PTX also the PTX of the arch's portable base (compute_120 for 120a), once each."""
    flags = []
    for arch, _ in archs:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    for base in dict.fromkeys(arch.rstrip("af") for arch, ptx in archs if ptx):
        flags.append(f"-gencode=arch=compute_{base},code=compute_{base}")
    return flags


def make_extension():
    ok, why = cuda_available_for_build()
    if not ok and os.environ.get("EAGLE3_CAPTURE_REQUIRE_CUDA") == "1":
        raise SystemExit(f"eagle3-capture: EAGLE3_CAPTURE_REQUIRE_CUDA=1 but CUDA cannot be built: {why}")
    cpu_ops = [p for p in glob.glob(os.path.join(ROOT, "csrc/ops/*.cpp")) if not p.endswith("_cuda.cpp")]
    cxx = ["-O3"]
    macros = [("EAGLE3_TORCH_BUILD_VERSION", f'"{torch.__version__}"')]
    if not ok:
        print(f"eagle3-capture: CPU-only build ({why})")
        return CppExtension("eagle3_capture._C", _rel(cpu_ops), define_macros=macros,
                            extra_compile_args={"cxx": cxx})
    arch_spec = os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCHS
    archs = parse_archs(arch_spec)
    arch_names = ";".join(a + ("+PTX" if p else "") for a, p in archs)
    print(f"eagle3-capture: CUDA build for sm_{arch_names.replace(';', ', sm_')} with {why}")
    sources = cpu_ops + glob.glob(os.path.join(ROOT, "csrc/ops/*_cuda.cpp")) + glob.glob(
        os.path.join(ROOT, "csrc/kernels/*.cu"))
    macros += [("EAGLE3_WITH_CUDA", "1"), ("EAGLE3_CUDA_ARCHS", f'"{arch_names}"')]
    nvcc = ["-O3", "-lineinfo", "-std=c++17"] + gencode_flags(archs)
    return CUDAExtension("eagle3_capture._C", _rel(sources), define_macros=macros,
                         extra_compile_args={"cxx": cxx, "nvcc": nvcc})


setup(
    ext_modules=[make_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
