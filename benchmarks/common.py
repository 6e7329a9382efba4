"""Timing and reporting shared by the Python benchmarks.

Method: CUDA events around CUDA-graph replays, median of many samples; inputs rotate among enough copies that one
rotation is larger than L2; every row carries a floor = bytes that must move / streaming bandwidth measured in the
same run (torch.sum over >= 4 GB), or flops / the matrix rate where that is larger.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Callable, Optional, Sequence

import torch

def l2_bytes() -> int:
    """The current device's L2 (torch's device properties)."""
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)


def rotation_bytes() -> int:
    """Bytes one rotation of input copies spans at least: 4 x the current device's L2 and no less than 256 MB, from
    the library's device tuning (the same figure the CMake bench binaries use)."""
    from eagle3_capture import tuning

    return tuning.bench_rotation_bytes()


def copies_for(bytes_per_copy: int, min_total: int | None = None, cap: int = 4096) -> int:
    """How many input copies make one rotation span at least rotation_bytes() (or min_total). Raises rather than
    return fewer: a rotation that fits in L2 would time the cache."""
    target = min_total if min_total is not None else rotation_bytes()
    n = max(2, -(-target // max(bytes_per_copy, 1)))
    if n > cap:
        raise ValueError(f"a rotation of {target} bytes needs {n} copies of {bytes_per_copy} bytes, more than the "
                         f"cap of {cap}")
    return n


def streaming_read_bandwidth(gib: float = 4.0, samples: int = 15) -> float:
    """Bytes/s of torch.sum over a `gib` GiB float32 buffer: the read ceiling used for every floor."""
    n = int(gib * (1 << 30)) // 4
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    for _ in range(3):
        x.sum()
    times = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del x
    torch.cuda.empty_cache()
    return n * 4 / statistics.median(times)


def matmul_rate(n: int = 8192, samples: int = 10) -> float:
    """bf16 FLOP/s of an n^3 matrix product on random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n**3 / statistics.median(times)


def int_list(text: str) -> list[int]:
    """"1,8,32" -> [1, 8, 32]."""
    return [int(v) for v in text.split(",") if v]


def add_draft_fc_shape_args(ap, m_default: str) -> None:
    """The shape options of the draft fc benchmark: --M and --N (comma lists), --H, --K; the defaults are
    the EAGLE-3 fc of a DeepSeek-V3 / Kimi-K2 draft (K = 3 taps of H = 7168) sharded for tp = 8 and replicated."""
    ap.add_argument("--M", default=m_default, help="rows (tokens), comma-separated")
    ap.add_argument("--N", default="896,7168", help="fc output features (H / tp), comma-separated")
    ap.add_argument("--H", type=int, default=7168)
    ap.add_argument("--K", type=int, default=3)


def draft_fc_inputs(m: int, n: int, h: int, k: int, dtype: torch.dtype, seed: int):
    """Rotating copies for a draft fc row (one rotation of weights + activations >= 4x L2): returns (ncopies,
    weights [N, K*H] scaled 1/sqrt(K*H), activations [M, K*H], norm weights [K, H] around 1, and each activation copy
    normed per tap and concatenated (the input of the plain-matmul baseline))."""
    import torch.nn.functional as F

    es = torch.tensor([], dtype=dtype).element_size()
    ncopies = copies_for(n * k * h * es + m * k * h * es)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    ws = [rnd(n, k * h, scale=(k * h) ** -0.5) for _ in range(ncopies)]
    xs = [rnd(m, k * h) for _ in range(ncopies)]
    g = rnd(k, h) + 1
    normed = [torch.cat([F.rms_norm(c, (h,), g[i], 1e-6) for i, c in enumerate(x.chunk(k, -1))], -1) for x in xs]
    return ncopies, ws, xs, g, normed


def time_graph_us(step: Callable[[int], None], ncopies: int, reps_per_copy: int = 1, samples: int = 25,
                  use_graph: bool = True, before_sample: Optional[Callable[[], None]] = None) -> float:
    """Median microseconds of one step(i), i cycling over the ncopies input copies.

    With use_graph, one CUDA graph holds a whole rotation (ncopies * reps_per_copy steps) and is replayed; each
    sample is one replay. Without it (large T, where launch cost does not matter), the steps run eagerly.
    before_sample runs on the host ahead of each timed sample (a barrier between ranks: every rank starts together).
    """
    steps = ncopies * reps_per_copy
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(steps):  # warm-up: allocator, lazy init, caches
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if use_graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(steps):
                step(i)
        run = g.replay
    else:
        def run():
            for i in range(steps):
                step(i)
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        if before_sample is not None:
            before_sample()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / steps)
    return statistics.median(times)


def machine_description() -> dict:
    d = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d["gpu"] = f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {l2_bytes() >> 20} MB L2)"
        d["gpus"] = torch.cuda.device_count()
        try:
            d["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:
            pass
    return d


def write_results(path: str, rows: list[dict], extra: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = {"machine": machine_description(), "torch": torch.__version__,
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv), **extra, "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


def print_table(rows: Sequence[dict], cols: Sequence[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(cols, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "" if v is None else str(v)


def markdown_table(rows: Sequence[dict], cols: Sequence[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def plot_rows(path: str, rows: Sequence[dict], x: str, series: Sequence[str], group: str, title: str,
              xlabel: str) -> None:
    """One log-log panel per value of `group`: each series (a row key in microseconds) against x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({r[group] for r in rows}, key=str)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, gv in zip(axes[0], groups):
        sub = sorted((r for r in rows if r[group] == gv), key=lambda r: r[x])
        for s in series:
            pts = [(r[x], r[s]) for r in sub if r.get(s) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=s.replace("_us", ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("time per call (us)")
        ax.set_title(f"{title}: {group}={gv}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
