"""What the plugin's served-forward hook (sglang/served.py) costs per forward on the serving thread, on the CPU:
with the dump off (the self-test done: the state of every server after its first forward) and with the dump on.

Runs SGLang 0.5.23's real ModelRunner / EagerRunner around SGLang's real tiny DeepseekV3 through the plugin tests'
CPU harness (tests/sglang/harness.py), so it needs SGLang installed as `make test` installs it:

    PYTHONPATH=python python benchmarks/bench_plugin_hooks.py [--json benchmarks/results/plugin_hooks-cpu.json]

Rows:
  hook only        the hook around a model runner forward that returns at once (a recorded ModelRunnerOutput):
                   what the hook adds, with nothing else in the timing
  forward          SGLang's ModelRunner.forward of the tiny model (prefill of 7 tokens / a decode step), hooked
Medians of many calls; the dump-on rows include staging the record (the host copy) and queueing it; the writing
happens on the dump's thread.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "sglang"))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def _median_us(fn, n: int) -> float:
    for _ in range(min(50, n)):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--forwards", type=int, default=40)
    a = p.parse_args()

    import harness as h
    import torch

    torch.set_num_threads(1)
    h.setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture.sglang import dump, selftest, served, switches

    cfg = h.tiny_config()
    model = h.build_sglang(cfg, h.build_hf(cfg))
    model.set_eagle3_layers_to_capture([-1, 1, 3, 5])
    rows = []
    with tempfile.TemporaryDirectory() as d:
        big = {"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_MAX": "1000000000",
               "EAGLE3_CAPTURE_DUMP_TOKENS": "1000000000", "EAGLE3_CAPTURE_DUMP_BYTES": "1T",
               "EAGLE3_CAPTURE_DUMP_REQUESTS": "1000000000"}
        for label, env in (("dump off", {}), ("dump on", big)):
            for k in big:
                os.environ.pop(k, None)
            os.environ.update(env)
            switches.configure()
            dump.reset()
            r = h.ServedRunner(model, cfg, rid="bench")
            pre_out, pre_fb = r.forward(h.PROMPT)       # also uses up the self-test
            dec_out, dec_fb = r.forward([h.DECODE_TOKEN])
            assert not selftest.pending()
            for what, out, fb in (("prefill 7 rows", pre_out, pre_fb), ("decode 1 row", dec_out, dec_fb)):
                def call(out=out, fb=fb):
                    served.runner_forward_hook(lambda self, b: out, r.mr, fb)
                rows.append({"row": "hook only", "dump": label, "batch": what, "us": _median_us(call, a.calls)})
            rows.append({"row": "no hook (the bare call)", "dump": label, "batch": "-",
                         "us": _median_us(lambda: (lambda self, b: pre_out)(r.mr, pre_fb), a.calls)})
            for what, ids in (("prefill 7 rows", h.PROMPT), ("decode 1 row", [h.DECODE_TOKEN])):
                def fwd(ids=ids):
                    rr = h.ServedRunner(model, cfg, rid="bench-fwd")
                    if len(ids) == 1:
                        rr.forward(h.PROMPT)
                    fb = rr.batch(ids)
                    t0 = time.perf_counter_ns()
                    rr.run(fb)
                    return time.perf_counter_ns() - t0
                fwd()
                times = [fwd() for _ in range(a.forwards)]
                rows.append({"row": "forward", "dump": label, "batch": what, "us": statistics.median(times) / 1e3})
            dump.flush(60)
    print(f"{'row':<26}{'dump':<10}{'batch':<18}{'us/call':>10}")
    for x in rows:
        print(f"{x['row']:<26}{x['dump']:<10}{x['batch']:<18}{x['us']:>10.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "plugin_hooks", "machine": platform.node(), "cpu": platform.processor(),
                       "python": platform.python_version(), "torch": torch.__version__, "threads": 1,
                       "model": "tiny DeepseekV3 (6 layers, H=64), K=4 slots, float32", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
