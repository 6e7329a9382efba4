"""The resource half of the CI cubin gate (check_cubins.py runs it): every kernel of every arch's cubin within what the
launchers ask of it, on the smallest target (sm_120: 99 KB of shared memory per block, 64K registers per SM).

- shared memory: the kernel's static shared memory (cuobjdump --dump-resource-usage; on sm_90+ it counts the 1 KB the
  driver reserves whenever a kernel uses shared memory, which the opt-in limit excludes) plus the dynamic size its
  launcher requests (eagle3_capture._C.launch_smem, the launchers' own functions) at H = 7168 and at the largest H
  the fused add + RMSNorm launcher accepts on sm_120, within sm_120's 101376-byte opt-in limit, for every arch's
  cubin (so a kernel is never built anywhere with a layout that cannot launch on the first user's GPU);
- registers: no more than the launch bounds allow (EIATTR_MAXREG_COUNT of cuobjdump -elf) and, at the kernel's
  maximum block size (EIATTR_MAX_THREADS), within the 64K-register file of one SM;
- the decode kernels (split, cluster): no local memory and no register spills. A stack frame or local loads
  and stores in their SASS are not always spills (a small array can live on the stack), so a kernel that has them
  is compiled again for that arch with ptxas --warn-on-spills, and only a spill warning naming it fails.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Iterable

SM120_OPTIN_SMEM = 101376  # cudaDevAttrMaxSharedMemoryPerBlockOptin of an RTX PRO 6000 Blackwell (99 KB)
RESERVED_SMEM = 1024       # cudaDevAttrReservedSharedMemoryPerBlock (sm_80+), inside cuobjdump's SHARED figure
REGISTERS_PER_SM = 65536
GATE_HIDDEN = 7168         # the first user's H (Kimi-K2.5 / DeepSeek-V3)
DECODE_FAMILIES = {        # kernel family -> the source file that holds it (for the spill check)
    "draft_fc_split_decode_kernel": "csrc/kernels/draft_fc_cuda.cu",
    "draft_fc_decode_cluster_kernel": "csrc/kernels/draft_fc_cluster_cuda.cu",
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def family_of(mangled: str) -> str:
    """The kernel's name without namespaces and template arguments (Itanium mangling: ...kernels<len><name>I...)."""
    m = re.search(r"kernels(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    start = m.end()
    return mangled[start:start + n]


def resource_usage(cuobjdump: str, lib: str) -> dict[str, dict[str, dict[str, int]]]:
    """{arch: {mangled kernel: {REG, STACK, SHARED, LOCAL}}}."""
    out = subprocess.run([cuobjdump, "--dump-resource-usage", lib], capture_output=True, text=True, check=True).stdout
    arch, fn, found = None, None, {}
    for line in out.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            found.setdefault(arch, {})
            continue
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        if fn and arch and "REG:" in line:
            found[arch][fn] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            fn = None
    return found


def launch_attributes(cuobjdump: str, lib: str, arch: str) -> dict[str, dict[str, int]]:
    """{mangled kernel: {maxreg, max_threads}} from the .nv.info sections of one arch's cubins."""
    out = subprocess.run([cuobjdump, "-elf", "-arch", arch, lib], capture_output=True, text=True, check=True).stdout
    attrs: dict[str, dict[str, int]] = {}
    fn, attr = None, None
    for line in out.splitlines():
        m = re.match(r"\.nv\.info\.(\S+)$", line.strip())
        if m:
            fn, attr = m.group(1), None
            attrs.setdefault(fn, {})
            continue
        if fn is None:
            continue
        m = re.match(r"\s*Attribute:\s*(\w+)", line)
        if m:
            attr = m.group(1)
            continue
        m = re.match(r"\s*Value:\s*(.*)", line)
        if m and attr in ("EIATTR_MAXREG_COUNT", "EIATTR_MAX_THREADS"):
            nums = [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", m.group(1))]
            if nums:
                threads = 1
                for v in nums:
                    threads *= v
                attrs[fn]["maxreg" if attr == "EIATTR_MAXREG_COUNT" else "max_threads"] = (
                    nums[0] if attr == "EIATTR_MAXREG_COUNT" else threads)
            attr = None
    return attrs


def local_memory_ops(sass: str) -> dict[tuple[str, str], int]:
    """{(arch, mangled kernel): local loads and stores (LDL / STL) in its SASS}."""
    arch, fn, counts = None, None, {}
    for line in sass.splitlines():
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn = m.group(1)
            continue
        if fn and re.search(r"\b(LDL|STL)(\.\w+)*\b", line):
            counts[(arch, fn)] = counts.get((arch, fn), 0) + 1
    return counts


def ptxas_spills(source: str, arch: str) -> dict[str, str]:
    """{mangled kernel: ptxas's spill warning} for `source` compiled for `arch` with the extension's flags."""
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    a = arch.replace("sm_", "")
    cmd = [nvcc, "-O3", "-std=c++17", "-lineinfo", f"-gencode=arch=compute_{a},code=sm_{a}", "-Xptxas",
           "--warn-on-spills", "-cubin", "-o", os.devnull, os.path.join(ROOT, source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    warned = {}
    for line in res.stderr.splitlines():
        m = re.search(r"spilled to local memory in function '(\S+)'", line)
        if m:
            warned[m.group(1)] = line.strip()
    return warned


def launch_smem(hidden: int, optin: int) -> dict:
    from eagle3_capture import native

    return json.loads(native.load().launch_smem(int(hidden), int(optin)))


def check(cuobjdump: str, lib: str, archs: Iterable[str], sass: str) -> list[str]:
    """Failures, one line each (empty: the gate passes); prints one ok line per arch."""
    fails: list[str] = []
    usage = resource_usage(cuobjdump, lib)
    gate = launch_smem(GATE_HIDDEN, SM120_OPTIN_SMEM)
    h_max = int(gate["fused_add_rmsnorm_capture_max_cols"])
    sizes = {GATE_HIDDEN: gate["dynamic"], h_max: launch_smem(h_max, SM120_OPTIN_SMEM)["dynamic"]}
    local_ops = local_memory_ops(sass)
    noted: set = set()
    for arch in archs:
        kernels = usage.get(arch)
        if not kernels:
            fails.append(f"{arch}: no resource usage listed")
            continue
        before = len(fails)
        attrs = launch_attributes(cuobjdump, lib, arch)
        spill_checked: dict[str, dict[str, str]] = {}
        worst = (0, "")
        at_gate = (0, "")  # the largest request at the first user's H
        for fn, r in sorted(kernels.items()):
            fam = family_of(fn)
            static = r["SHARED"] - RESERVED_SMEM if r["SHARED"] >= RESERVED_SMEM else r["SHARED"]
            for h, dyn in sizes.items():
                total = static + int(dyn.get(fam, 0))
                if total > worst[0]:
                    worst = (total, f"{fam} at H={h}")
                if h == GATE_HIDDEN and total > at_gate[0]:
                    at_gate = (total, fam)
                if total > SM120_OPTIN_SMEM:
                    fails.append(f"{arch}: {fam}: {static} B static + {dyn.get(fam, 0)} B dynamic at H={h} = {total} B "
                                 f"of shared memory, over sm_120's {SM120_OPTIN_SMEM} B per block ({fn})")
            a = attrs.get(fn, {})
            if "maxreg" in a and r["REG"] > a["maxreg"]:
                fails.append(f"{arch}: {fam}: {r['REG']} registers, over its launch bounds' {a['maxreg']} ({fn})")
            if "max_threads" in a:
                per_block = -(-r["REG"] // 8) * 8 * (-(-a["max_threads"] // 32) * 32)
                if per_block > REGISTERS_PER_SM:
                    fails.append(f"{arch}: {fam}: {r['REG']} registers x {a['max_threads']} threads = {per_block}, "
                                 f"over one SM's {REGISTERS_PER_SM} ({fn})")
            if fam in DECODE_FAMILIES:
                if r["LOCAL"]:
                    fails.append(f"{arch}: {fam}: {r['LOCAL']} B of local memory in a decode kernel ({fn})")
                if r["STACK"] or local_ops.get((arch, fn)):
                    src = DECODE_FAMILIES[fam]
                    if src not in spill_checked:
                        spill_checked[src] = ptxas_spills(src, arch)
                    if fn in spill_checked[src]:
                        fails.append(f"{arch}: {fam}: register spills in a decode kernel: {spill_checked[src][fn]}")
                    elif (arch, fam) not in noted:
                        noted.add((arch, fam))
                        print(f"note: {arch}: {fam}: a stack frame of up to {r['STACK']} bytes and local loads/stores "
                              f"in its SASS, no spills (ptxas --warn-on-spills on {src})")
        if len(fails) == before:
            print(f"ok: {arch}: resources of {len(kernels)} kernels; largest shared-memory request at H={GATE_HIDDEN} "
                  f"{at_gate[0]} B ({at_gate[1]}), at any H {worst[0]} B ({worst[1]}), of sm_120's {SM120_OPTIN_SMEM}")
    return fails
