"""``doctor demo``: the whole story on the built-in pair (a tiny DeepseekV3 target, an EAGLE-3 draft trained on it,
a correct and a miswired capture, check and fingerprint naming the fault); the run is :mod:`..demo.run`. Exit 1
when the demo's own expectations fail (the correct capture well above the miswired one, the fault named)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..common import EXIT_FINDINGS, EXIT_OK


@dataclass(frozen=True)
class Options:
    out: str = "eagle3-demo"
    fast: bool = False
    device: str = "auto"
    threads: Optional[int] = 1    # these tiny models are fastest on one thread, and the same on every machine
    seed: int = 0
    no_plot: bool = False
    no_progress: bool = False


def run(opts: Options):
    """The demo's :class:`~..demo.run.DemoResult` (its files are in ``opts.out``)."""
    from ..demo.run import run_demo

    return run_demo(out_dir=opts.out, fast=opts.fast, device=opts.device, threads=opts.threads, seed=opts.seed,
                    plot=not opts.no_plot, progress=not opts.no_progress)


def render(res) -> str:
    return res.report_text


def exit_code(res) -> int:
    return EXIT_OK if res.ok else EXIT_FINDINGS


__all__ = ["Options", "run", "render", "exit_code"]
