"""What the SGLang plugin's hooks cost per forward on the serving thread (host time), against stock SGLang and,
optionally, against another version of the plugin, with SGLang 0.5.23's real classes: its tiny DeepseekV3 target and
EAGLE-3 drafts, built and run through the plugin tests' harness (tests/plugin/harness.py), so it needs SGLang
installed as `make test` installs it.

    PYTHONPATH=python python benchmarks/bench_plugin_hooks.py [--device cpu|cuda] [--json PATH] [--baseline TREE]

--device cuda: every timing synchronizes the GPU before the clock starts and before it stops (the figure is the host
time plus whatever the GPU still had to do), except the per-hook self times, which are host time by construction.
`scripts/gpu_plugin_hooks.sh` runs it on a GPU machine (SGLang's wheels and the sglang-kernel stand-ins, as
scripts/gpu_sglang.sh does).

--baseline TREE: a copy of the package to compare with, e.g. the main branch's (`git archive main python | tar -x
-C DIR`, TREE = DIR/python); its plugin's hooks run in the same registry wrappers, on the same models and inputs,
alternating with the current ones (benchmarks/hook_timing.py), which is what makes a before/after comparison
hold on a machine whose speed drifts between processes.

Sections (medians of many calls; every side of a row alternates with the others, sample by sample):
  forward        whole forwards, plugin on against stock SGLang (hook_timing.StockSwitch puts SGLang's original
                 functions back for the stock samples): the target's ModelRunner.forward (an extend of 7 rows, a
                 decode of 1 row; taps [Embedding, LayerOutput(1), LayerOutput(3)], which stock captures alike) and
                 the draft's model forward in a draft extend (packed K*H input: the fc runs) and in a draft decode
                 step (H-wide input: no fc), for SGLang's LlamaForCausalLMEagle3 without norms (the demo's kind) and
                 with fc_norm, and its Eagle3MLAModel with fc_norm
  per hook       each hook's own time inside those forwards (hook_timing.HookTimer: the hook's time minus the
                 original's it calls, the timer's own cost subtracted), per call and per forward, and SGLang's own
                 AuxHiddenStatePacker.append in stock forwards (the work the capture hook replaces); also with the
                 final boundary declared (LayerOutput(5), which stock SGLang cannot capture)
  hook only      single hooks around an original that returns at once (nothing else timed): the served-forward
                 hook with the dump off (every server past its first forward) and on (while writing, and with its
                 served budget spent), one forward's capture through SGLang's packer (init + 3 appends + finalize)
                 against SGLang's own appends, the draft fc hook (the fc computed, handed over, put back), the gather
                 poll around the draft extend, and the HookRegistry wrapper's own trip
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# bootstrap (a script, run outside pytest, which gets this folder from pyproject's pythonpath): the plugin tests'
# harness.py
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "plugin"))
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

TARGET_IDS = [-1, 1, 3]          # layer inputs [0, 2, 4]: stock SGLang captures the same slots
FINAL_IDS = [-1, 1, 5]           # with the final boundary (LayerOutput(5) of the 6-layer target): plugin only
DRAFTS = (("llama", {}), ("llama", {"fc_norm": True}), ("mla", {"fc_norm": True}))


class Clock:
    """Wall-clock samples of one call, the device synchronized around it on CUDA."""

    def __init__(self, device: str):
        import torch

        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def once(self, fn) -> float:
        self.sync()
        t0 = time.perf_counter_ns()
        fn()
        self.sync()
        return (time.perf_counter_ns() - t0) / 1e3

    def samples(self, fn, n: int, warmup: int = 10):
        for _ in range(min(warmup, n)):
            fn()
        return [self.once(fn) for _ in range(n)]


def _rotations(sides, rounds):
    """Each round runs every side once, the order rotated round by round (against drift and order effects)."""
    for r in range(rounds):
        k = r % len(sides)
        yield sides[k:] + sides[:k]


def _interleaved(clock, sides, make, run, rounds: int) -> dict:
    """Median us of run(make()) per side (label, context manager factory); make() is untimed (a fresh batch and KV
    state) and runs inside the side's context."""
    times = {label: [] for label, _ in sides}
    for order in _rotations(sides, rounds):
        for label, ctx in order:
            with ctx():
                state = make()
                times[label].append(clock.once(lambda: run(state)))
    return {f"{label}_us": statistics.median(t) for label, t in times.items()} | {"samples": rounds}


def _blocks(clock, sides, calls: int, blocks: int = 4) -> dict:
    """Median us per call per side (label, context manager factory, fn), in `blocks` alternating blocks."""
    times = {label: [] for label, _, _ in sides}
    for order in _rotations(sides, blocks):
        for label, ctx, fn in order:
            with ctx():
                times[label] += clock.samples(fn, max(1, calls // blocks))
    return {f"{label}_us": statistics.median(t) for label, t in times.items()}


def _ratios(row: dict, labels) -> dict:
    if "stock_us" in row:
        for label in labels:
            if f"{label}_us" in row and label != "stock":
                row[f"{label}_added_us"] = row[f"{label}_us"] - row["stock_us"]
                row[f"{label}_ratio_to_stock"] = row[f"{label}_us"] / row["stock_us"]
    return row


# ----------------------------------------------------------------------------------------------------------------
# the models and their forwards
# ----------------------------------------------------------------------------------------------------------------

def _target(h, device, ids):
    cfg = h.tiny_config()
    model = h.build_sglang(cfg, h.build_hf(cfg), device=device)
    model.set_eagle3_layers_to_capture(list(ids))
    return cfg, model


def _target_forward(h, model, cfg, device, decode: bool):
    """(make, run) of one target ModelRunner.forward: a fresh sequence, prefilled untimed for a decode."""
    def make():
        r = h.ServedRunner(model, cfg, rid="bench", device=device)
        if decode:
            r.forward(h.PROMPT)
        return r, r.batch([h.DECODE_TOKEN] if decode else h.PROMPT)

    return make, lambda s: s[0].run(s[1])


def _draft(h, kind, kw, device):
    build = h.build_mla_draft if kind == "mla" else h.build_llama_draft
    cfg, model = build(device=device, **kw)
    name = f"{'LlamaEagle3' if kind == 'llama' else 'Eagle3MLAModel'}{'-fc_norm' if kw.get('fc_norm') else ''}"
    return name, kind, cfg, model


def _draft_forward(h, draft, device, extend: bool):
    """(make, run) of the draft's model forward: a draft extend over PROMPT with the packed K*H capture (the fc
    runs), or a draft decode step with H-wide hidden states (it does not)."""
    import torch

    from sglang.srt.speculative.eagle_info import EagleDraftInput

    _, kind, cfg, model = draft
    inner = model.model
    K = int(inner.num_aux_hidden_states)
    H = cfg.hidden_size
    attention = "mla" if kind == "mla" else "mha"
    feats = h.target_features(len(h.PROMPT), H, K).to(device)

    def make():
        r = h.SglangRunner(cfg, attention=attention, device=device)
        fb = r.batch(torch.tensor(h.PROMPT))
        fb.spec_info = EagleDraftInput(hidden_states=feats)
        if not extend:
            r.run(lambda b: inner(b.input_ids, b.positions, b), fb)
            fb = r.batch(torch.tensor([h.DECODE_TOKEN]))
            fb.spec_info = EagleDraftInput(hidden_states=feats[:1, :H].clone())
        return r, fb

    def run(s):
        r, fb = s
        return r.run(lambda b: inner(b.input_ids, b.positions, b), fb)

    return make, run


# ----------------------------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------------------------

def section_forward(h, ctx, rounds):
    rows = []
    cfg, model = ctx["target"]
    labels = [label for label, _ in ctx["sides"]]
    cases = [(f"target ModelRunner.forward, {what}", *_target_forward(h, model, cfg, ctx["device"], decode))
             for what, decode in (("extend 7 rows", False), ("decode 1 row", True))]
    for d in ctx["drafts"]:
        cases += [(f"{d[0]} model forward, {what}", *_draft_forward(h, d, ctx["device"], extend))
                  for what, extend in (("draft extend 7 rows (fc)", True), ("draft decode 1 row (no fc)", False))]
    for what, make, run in cases:
        run(make())
        rows.append(_ratios({"forward": what, **_interleaved(ctx["clock"], ctx["sides"], make, run, rounds)},
                            labels))
    return rows


def section_per_hook(h, ctx, rounds):
    rows = []
    cfg, model = ctx["target"]
    dev = ctx["device"]
    cases = [("target extend 7 rows", *_target_forward(h, model, cfg, dev, False)),
             ("target decode 1 row", *_target_forward(h, model, cfg, dev, True))]
    if ctx["final_model"] is not None:
        fm = ctx["final_model"]
        cases += [("target extend 7 rows, final boundary", *_target_forward(h, fm, cfg, dev, False)),
                  ("target decode 1 row, final boundary", *_target_forward(h, fm, cfg, dev, True))]
    for d in ctx["drafts"]:
        cases += [(f"{d[0]} draft extend 7 rows", *_draft_forward(h, d, dev, True)),
                  (f"{d[0]} draft decode 1 row", *_draft_forward(h, d, dev, False))]
    timers = ctx["timers"]
    for what, make, run in cases:
        run(make())
        for t in timers.values():
            t.samples.clear()
        # (SGLang's own append, set against the capture hook: target forwards that stock SGLang can run)
        sides = [(label, t) for label, t in timers.items()
                 if label != "stock" or (what.startswith("target") and "final" not in what)]
        for order in _rotations(sides, rounds):
            for _, timer in order:
                state = make()
                with timer:
                    run(state)
        row = {"forward": what}
        for label, timer in sides:
            per = timer.per_forward(rounds)
            row[label] = {"hooks": per, "us_per_forward_all_hooks": sum(v["us_per_forward"] for v in per.values())}
        rows.append(row)
    return rows


def section_hook_only(h, ctx, calls):
    import torch

    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    versions, hooks, stock, clock, dev = ctx["versions"], ctx["hooks"], ctx["stock"], ctx["clock"], ctx["device"]
    rows = []

    def use(v):
        return lambda: hooks.use(v)

    # the served-forward hook around a forward that returns at once: dump off, on (writing), on (budget spent)
    if ctx["target_ok"]:
        cfg, model = ctx["target"]
        with tempfile.TemporaryDirectory() as d:
            big = {"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_MAX": "1000000000",
                   "EAGLE3_CAPTURE_DUMP_TOKENS": "1000000000", "EAGLE3_CAPTURE_DUMP_BYTES": "1T",
                   "EAGLE3_CAPTURE_DUMP_REQUESTS": "1000000000"}
            spent = {"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_MAX": "1"}
            for label, env in (("dump off", {}), ("dump on, writing", big), ("dump on, budget spent", spent)):
                for k in big:
                    os.environ.pop(k, None)
                os.environ.update(env)
                for v in versions:  # a directory per version: each numbers its files from 0
                    if env:
                        os.environ["EAGLE3_CAPTURE_DUMP"] = os.path.join(d, label.replace(" ", "_"), v.label)
                    v.settle()
                r = h.ServedRunner(model, cfg, rid="bench", device=dev)
                pre_out, pre_fb = r.forward(h.PROMPT)
                dec_out, dec_fb = r.forward([h.DECODE_TOKEN])
                n = calls if "writing" not in label else max(40, calls // 20)
                for what, out, fb in (("extend 7 rows", pre_out, pre_fb), ("decode 1 row", dec_out, dec_fb)):
                    if label == "dump on, budget spent":
                        for v in versions:  # past the served budget in every version
                            v.mod("served").runner_forward_hook(lambda self, b: out, r.mr, fb)
                    sides = [(v.label, (lambda: _null()),
                              (lambda v=v, out=out, fb=fb: v.mod("served").runner_forward_hook(
                                  lambda self, b: out, r.mr, fb))) for v in versions]
                    rows.append({"hook": f"served forward ({label})", "batch": what, **_blocks(clock, sides, n)})
                for v in versions:
                    v.mod("dump.forwards").flush(60)
            for k in big:
                os.environ.pop(k, None)
            for v in versions:
                v.settle()
    # one forward's capture: SGLang's packer, 3 appends of [T, H], finalize; the plugin's hook against SGLang's
    H = 64
    for T in (1, 7, 64):
        taps = [torch.randn(T, H, device=dev) for _ in range(3)]

        def capture(taps=taps):
            p = AuxHiddenStatePacker(len(taps))
            for t in taps:
                p.append(t)
            return p.finalize()

        with torch.no_grad():
            with stock:
                want = capture().clone()
            for v in versions:
                with hooks.use(v):
                    assert torch.equal(capture(), want), f"the {v.label} capture differs from SGLang's"
            sides = [(v.label, use(v), capture) for v in versions] + [("stock", lambda: stock, capture)]
            rows.append(_ratios({"hook": "capture: packer init + 3 appends + finalize", "batch": f"T={T}",
                                 **_blocks(clock, sides, calls)}, [v.label for v in versions]))
    # the draft fc hook around an original that returns at once (the fc computed, handed over, put back)
    for name, kind, dcfg, dmodel in ctx["drafts"]:
        inner = dmodel.model
        K = int(inner.num_aux_hidden_states)
        for T in (1, 7):
            x = h.target_features(T, dcfg.hidden_size, K).to(dev)
            fb = type("Batch", (), {})()
            fb.spec_info = EagleDraftInput(hidden_states=x)
            sides = []
            for v in versions:
                dh = v.mod("draft")
                hook = dh.mla_forward_hook if kind == "mla" else dh.llama_forward_hook
                sides.append((v.label, _null, lambda hook=hook: hook(lambda *a, **k: None, inner, None, None, fb)))
            with torch.no_grad():
                rows.append({"hook": f"draft fc hook ({name})", "batch": f"{T} rows", **_blocks(clock, sides, calls)})
    sides = [(v.label, _null, lambda v=v: v.mod("draft").gather_poll_hook(lambda self: None, None)) for v in versions]
    rows.append({"hook": "gather poll (draft extend)", "batch": "-", **_blocks(clock, sides, calls)})

    def nothing(*a, **k):
        return None

    wrapped = _wrap_fn(nothing, lambda original, *a, **k: original(*a, **k), HookType.AROUND)
    rows.append({"hook": "HookRegistry AROUND wrapper + pass-through hook", "batch": "-",
                 **_blocks(clock, [("wrapper", _null, lambda: wrapped(1, 2, x=3)),
                                   ("bare call", _null, lambda: nothing(1, 2, x=3))], calls)})
    return rows


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _null():
    return _Null()


# ----------------------------------------------------------------------------------------------------------------

def _print(result) -> None:
    labels = result["sides"]
    print(f"\n== whole forwards ({result['device']}; us, medians; sides alternate sample by sample)")
    print(f"{'forward':<64}" + "".join(f"{lb:>11}" for lb in labels) + "".join(
        f"{lb + '/stock':>16}" for lb in labels if lb != "stock"))
    for x in result["forward"]:
        print(f"{x['forward']:<64}" + "".join(f"{x[lb + '_us']:>11.1f}" for lb in labels) + "".join(
            f"{x[lb + '_ratio_to_stock']:>16.3f}" for lb in labels if lb != "stock"))
    print(f"\n== per hook inside the forwards (self time; the timer's {result['timer_overhead_us']:.3f} us/call "
          "subtracted): calls x median us = us per forward")
    for x in result["per_hook"]:
        versions = [k for k in x if k != "forward"]
        print(f"{x['forward']}: all hooks " + ", ".join(f"{v} {x[v]['us_per_forward_all_hooks']:.2f}"
                                                         for v in versions) + " us/forward")
        keys = list(dict.fromkeys(k for v in versions for k in x[v]["hooks"]))
        for k in keys:
            cells = []
            for v in versions:
                e = x[v]["hooks"].get(k)
                cells.append(f"{v} {e['calls_per_forward']:.1f} x {e['us_per_call_median']:6.2f} = "
                             f"{e['us_per_forward']:7.2f}" if e else f"{v} -")
            print(f"    {k:<72}" + "   ".join(cells))
    print("\n== hook only (us per call)")
    for x in result["hook_only"]:
        cells = "  ".join(f"{k[:-3]} {v:8.2f}" for k, v in x.items() if k.endswith("_us") and "added" not in k)
        print(f"{x['hook']:<52}{x['batch']:<15}{cells}")
    for e in result["errors"]:
        print(f"\nsection {e['section']} failed: {e['error']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--baseline", default=None, metavar="TREE",
                   help="a directory holding another copy of the eagle3_capture package to compare with")
    p.add_argument("--baseline-note", default=None, help="what the baseline is (kept in the JSON)")
    p.add_argument("--calls", type=int, default=2000, help="calls per side per hook-only row")
    p.add_argument("--rounds", type=int, default=40, help="forwards per side per whole-forward / per-hook row")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--sections", default="forward,per_hook,hook_only",
                   help="comma-separated subset of forward, per_hook, hook_only")
    a = p.parse_args()
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in ("forward", "per_hook", "hook_only")]
    if bad or a.calls < 4 or a.rounds < 1 or a.threads < 1:
        p.error(f"--sections takes forward, per_hook, hook_only (got {bad}); --calls >= 4, --rounds and "
                "--threads >= 1")
    if a.baseline is not None and not os.path.isfile(os.path.join(a.baseline, "eagle3_capture", "__init__.py")):
        p.error(f"--baseline {a.baseline}: no eagle3_capture package there")

    import harness as h
    import torch

    from hook_timing import HookTimer, OriginalTimer, PluginHooks, StockSwitch, Version, load_baseline

    torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no GPU")
    h.setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    current = Version("plugin", "eagle3_capture")
    status = current.plugin.hook_status()
    off = {g: s for g, s in status.items() if s != "on" and g != "dump"}
    if off:
        print(f"bench_plugin_hooks: plugin hook groups not on: {off}", file=sys.stderr)
        return 1
    versions = [current]
    if a.baseline is not None:
        versions.append(load_baseline(a.baseline))
    for v in versions:
        v.settle()
    hooks = PluginHooks(current)
    stock = StockSwitch(hooks)
    timers = {v.label: HookTimer(hooks, v) for v in versions}
    overhead = timers["plugin"].calibrate()
    for t in timers.values():
        t.overhead_ns = overhead
    # SGLang's own append, the work the capture hook replaces (its timing wrapper costs about what the shim does)
    timers["stock"] = OriginalTimer(stock, "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker.append",
                                    overhead)
    result = {"bench": "plugin_hooks", "device": a.device,
              "command": " ".join(["python", "benchmarks/bench_plugin_hooks.py"] + sys.argv[1:]),
              "machine": platform.node(), "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "load_average_at_start": list(os.getloadavg()),
              "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
              "python": platform.python_version(), "torch": torch.__version__, "threads": a.threads,
              "sglang": importlib.metadata.version("sglang"),
              "baseline": a.baseline, "baseline_note": a.baseline_note,
              "model": "SGLang's tiny DeepseekV3 (6 layers, H=64, float32; K=3 slots), its EAGLE-3 drafts "
                       "(H=64, K=4, float32)",
              "sides": [v.label for v in versions] + ["stock"], "timer_overhead_us": overhead / 1e3,
              "forward": [], "per_hook": [], "hook_only": [], "errors": []}
    ctx = {"device": a.device, "clock": Clock(a.device), "versions": versions, "hooks": hooks, "stock": stock,
           "timers": timers, "target_ok": False, "final_model": None,
           "sides": [(v.label, (lambda v=v: hooks.use(v))) for v in versions] + [("stock", lambda: stock)]}
    t0 = time.time()

    def attempt(section, fn):
        try:
            return fn()
        except Exception as e:  # a section that cannot run here is reported, the others still run
            result["errors"].append({"section": section, "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc(limit=8)})
            return None

    def build_target():
        ctx["target"] = _target(h, a.device, TARGET_IDS)
        h.ServedRunner(ctx["target"][1], ctx["target"][0], device=a.device).forward(h.PROMPT)
        ctx["target_ok"] = True

    attempt("target", build_target)
    ctx["drafts"] = attempt("drafts", lambda: [_draft(h, kind, kw, a.device) for kind, kw in DRAFTS]) or []
    for v in versions:
        v.settle()
    if "forward" in sections and ctx["target_ok"]:
        result["forward"] = attempt("forward", lambda: section_forward(h, ctx, a.rounds)) or []
    if "per_hook" in sections and ctx["target_ok"]:
        ctx["final_model"] = attempt("final boundary target", lambda: _target(h, a.device, FINAL_IDS)[1])
        result["per_hook"] = attempt("per_hook", lambda: section_per_hook(h, ctx, a.rounds)) or []
    if "hook_only" in sections:
        result["hook_only"] = attempt("hook_only", lambda: section_hook_only(h, ctx, a.calls)) or []
    result["seconds"] = round(time.time() - t0, 1)
    result["load_average_at_end"] = list(os.getloadavg())
    _print(result)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
