"""What counting acceptance costs on the scheduler thread, and what one flush costs on its own thread (host time, CPU):

- per call: SGLang's real ``Req.update_spec_correct_drafts_histogram`` alone, through an AROUND wrapper of the
  shape SGLang's HookRegistry makes with a pass-through hook (the registry's own trip), and with the plugin's hook,
  counting (the hot path) and not counting; the hook's own cost is the difference to the pass-through;
- per flush: one block of verifies taken from the histogram, turned into attempts per position, exported to
  prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set here before anything imports it, as
  SGLang's launcher sets it) and fed to the drift alarm, for 3 and 7 positions.

    PYTHONPATH=python python benchmarks/bench_acceptance.py [--calls N] [--json PATH]

Medians of repeated runs (time.perf_counter_ns); alternating the sides, sample by sample.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="bench_acceptance_prom_"))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def _around(original, hook):
    """An AROUND wrapper like SGLang's HookRegistry's (the hook gets the original first)."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)
    return wrapper


def per_call(calls: int, repeats: int) -> dict:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from eagle3_capture.sglang.monitor import histogram as acceptance_count

    original = Req.update_spec_correct_drafts_histogram
    hooked = _around(original, acceptance_count.update_histogram_hook)
    passthrough = _around(original, lambda original, *a, **k: original(*a, **k))  # the registry's trip alone
    req = Req("r", "", [1, 2, 3], SamplingParams(max_new_tokens=8))
    ks = [i % 4 for i in range(calls)]
    acceptance_count.reset()

    def run(fn):
        t = time.perf_counter_ns()
        for k in ks:
            fn(req, k)
        return (time.perf_counter_ns() - t) / calls

    samples = {"stock": [], "a pass-through hook": [], "hook, counting": [], "hook, not counting": []}
    for _ in range(repeats):
        samples["stock"].append(run(original))
        samples["a pass-through hook"].append(run(passthrough))
        acceptance_count.start(3)
        samples["hook, counting"].append(run(hooked))
        acceptance_count.stop()
        samples["hook, not counting"].append(run(hooked))
    med = {k: statistics.median(v) for k, v in samples.items()}
    med["the hook's own cost, counting (vs the pass-through)"] = med["hook, counting"] - med["a pass-through hook"]
    return {k: round(v, 1) for k, v in med.items()}


def per_flush(positions: int, per_block: int, repeats: int) -> dict:
    from eagle3_capture.acceptance.drift import DriftMonitor
    from eagle3_capture.sglang.monitor import histogram as acceptance_count, live as acceptance_live, exporter

    args = SimpleNamespace(enable_metrics=True, served_model_name="bench", model_path="/m")
    assert "exported" in exporter.configure(args, 0), exporter.why_off()
    counts, reach = [], 100000
    for _ in range(positions):
        counts.append((reach, int(reach * 0.7)))
        reach = int(reach * 0.7)
    acceptance_count.reset()
    f = acceptance_live.start(positions, DriftMonitor(counts), thread=False)
    times, idle = [], []
    for i in range(repeats):
        for j in range(per_block):
            k = (i + j) % (positions + 1)
            acceptance_count.COUNTS[k] += 1
        t = time.perf_counter_ns()
        f.flush()
        times.append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns()
        f.flush()  # nothing new: the idle second
        idle.append(time.perf_counter_ns() - t)
    acceptance_live.stop()
    return {"positions": positions, "verifies per block": per_block,
            "flush, us (median)": round(statistics.median(times) / 1000, 1),
            "flush with no traffic, us (median)": round(statistics.median(idle) / 1000, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200000, help="calls per sample (default 200000)")
    p.add_argument("--repeats", type=int, default=15, help="samples per side (default 15)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if a.calls < 1 or a.repeats < 1:
        print("bench_acceptance.py: --calls and --repeats must be >= 1", file=sys.stderr)
        return 2
    out = {"per call, ns (median)": per_call(a.calls, a.repeats),
           "per flush": [per_flush(3, 200, 200), per_flush(7, 200, 200)],
           "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
