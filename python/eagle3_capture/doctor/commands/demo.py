"""``doctor demo``: the whole story on the built-in pair (a tiny DeepseekV3 target, an EAGLE-3 draft trained on it,
a correct and a miswired capture, check and fingerprint naming the fault); the run is :mod:`..demo.run`. Exit 1
when the demo's own expectations fail (the correct capture well above the miswired one, the fault named)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import arg_types as at
from .. import options
from ..common import EXIT_FINDINGS, EXIT_OK
from ..options import flag


DESCRIPTION = ("Builds a tiny DeepseekV3 target (seeded, from a config in the package), trains a tiny EAGLE-3 draft "
               "on the target's greedy continuations with taps [Embedding, LayerOutput(a), LayerOutput(b)], measures "
               "offline accuracy with the correct capture and a miswired one (no embedding, shifted layers), runs "
               "check and fingerprint on the miswired one, prints a report and writes a PNG.")


@dataclass(frozen=True, kw_only=True)
class Options:
    out: str = flag("--out", default="eagle3-demo", metavar="DIR", type=at.output_dir,
                    help="output directory (default ./eagle3-demo)")
    fast: bool = flag("--fast", action="store_true",
                      help="smaller data and training (the test's path, ~1/3 the time)")
    device: str = options.device()
    # these tiny models are fastest on one thread, and the same on every machine
    threads: Optional[int] = options.threads(1, "CPU threads (default 1: these tiny models are fastest on one, and "
                                                "the result is then the same on every machine count)")
    seed: int = options.seed()
    no_plot: bool = flag("--no-plot", action="store_true", help="skip the PNG")
    no_progress: bool = options.no_progress()


def run(opts: Options):
    """The demo's :class:`~..demo.run.DemoResult` (its files are in ``opts.out``)."""
    from ..demo.run import run_demo

    return run_demo(out_dir=opts.out, fast=opts.fast, device=opts.device, threads=opts.threads, seed=opts.seed,
                    plot=not opts.no_plot, progress=not opts.no_progress)


def render(res) -> str:
    return res.report_text


def exit_code(res) -> int:
    return EXIT_OK if res.ok else EXIT_FINDINGS


__all__ = ["DESCRIPTION", "Options", "run", "render", "exit_code"]
