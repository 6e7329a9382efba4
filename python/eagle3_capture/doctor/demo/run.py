"""``doctor demo``: the whole story on a pair that runs anywhere.

1. A tiny DeepseekV3 target (transformers, config shipped in the package, seeded init; nothing downloaded).
2. Its greedy continuations of random prompts; a tiny EAGLE-3 draft (fc + one decoder layer + lm head, plain
   torch) trained on them with taps [Embedding, LayerOutput(a), LayerOutput(b)] (draft ids [-1, a, b]).
3. Offline accuracy on held-out prompts with the correct capture and with a miswired one, as in the real case
   that motivated this project: the server captured layer inputs [a+1, b+1, c+1] = [LayerOutput(a),
   LayerOutput(b), LayerOutput(c)] -- no embedding, every slot one tap later.
4. ``doctor check`` and ``doctor fingerprint`` on the miswired capture (taken from a bfloat16 run of the target, as
   a server's would be), which name the fault; the correct capture fingerprints clean.
5. A short report, report.json and accuracy.png (accuracy per draft step, correct vs miswired).

Settings (sizes, seeds, the target's init gains, taps, flags) live in ``eagle3_capture/data/demo.json``;
``fast`` uses its smaller "fast" block (the test's path).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ...spec import TapSpec
from ..common import pick_device, torch_threads, write_json
from ..progress import bar as progress_bar
from ..replay.evaluate import evaluate, served_walks
from ..replay.metrics import Metrics, chain_correct, metrics
from ..sglang_model.flag_rules import resolve_speculative
from ..sglang_model.server_args import parse_server_args
from ..sglang_model.serving import total
from .report import report_text


@dataclass
class DemoResult:
    ok: bool
    report_text: str
    correct: Metrics
    miswired: Metrics
    trained_taps: TapSpec
    miswired_taps: List[object]
    check: object            # deployment.report.CheckReport on the miswired capture
    fingerprint_ok: object   # fingerprint.reference.FingerprintResult of the correct capture
    out_dir: str
    timings: Dict[str, float]
    settings: dict
    train_log: dict
    failures: List[str] = field(default_factory=list)


def _settings(fast: bool) -> dict:
    from ..target_side.model import demo_settings

    s = demo_settings()
    run = dict(s["run"])
    if fast:
        run.update(s["fast"])
    return {**s, "run": run}


def _batched(fn, n: int, bs: int):
    outs = [fn(slice(i, min(n, i + bs))) for i in range(0, n, bs)]
    return [torch.cat(parts, 0) for parts in zip(*outs)] if isinstance(outs[0], tuple) else torch.cat(outs, 0)


def run_demo(out_dir: str = "eagle3-demo", fast: bool = False, device: str = "auto", threads: Optional[int] = 1,
             seed: int = 0, plot: bool = True, progress: bool = True, draft_seed: Optional[int] = None) -> DemoResult:
    """``seed`` draws the target, the prompts and the draft; ``draft_seed`` (default derived from ``seed``) only
    the draft's init and training batches (to measure how much the result moves with the training trajectory)."""
    dev = pick_device(device)
    with torch_threads(threads if dev == "cpu" else None):
        return _run(out_dir, fast, dev, seed, plot, progress, draft_seed)


def _run(out_dir: str, fast: bool, dev: str, seed: int, plot: bool, progress: bool,
         draft_seed: Optional[int] = None) -> DemoResult:
    from ..deployment.run import CheckRequest, run_check
    from ..draft.checkpoint import save_draft
    from ..draft.model import DraftArch
    from ..fingerprint.files import save_captured
    from ..fingerprint.reference import fingerprint
    from ..fingerprint.reference_dump import reference_tensors, write_reference
    from ..target_side.model import Target, build_demo_target, demo_target_config_dict, greedy_continue, residual_stream
    from ..target_side.model_side import TransformersTarget
    from .train import TrainConfig, init_draft_from_target, train_draft

    settings = _settings(fast)
    run = settings["run"]
    t0 = time.perf_counter()
    timings: Dict[str, float] = {}
    os.makedirs(out_dir, exist_ok=True)

    def lap(name):
        nonlocal t0
        t = time.perf_counter()
        timings[name] = round(t - t0, 2)
        t0 = t

    # -- target and its greedy continuations ----------------------------------------------------------------------
    tcfg = demo_target_config_dict()
    L, H, V = tcfg["num_hidden_layers"], tcfg["hidden_size"], tcfg["vocab_size"]
    model = build_demo_target(seed).to(dev)
    target = Target(model, None, L, H, V, f"demo (tiny DeepseekV3, seed {seed})", tcfg)
    P, N = run["prompt_len"], run["new_tokens"]
    n_train, n_eval = run["train_prompts"], run["eval_prompts"]
    g = torch.Generator().manual_seed(seed + 1)
    prompts = torch.randint(2, V, (n_train + n_eval, P), generator=g).to(dev)
    a, b, c = settings["taps"]["a"], settings["taps"]["b"], settings["taps"]["c"]
    trained = TapSpec.from_draft_ids([-1, a, b], L, H)
    mis_inputs = [a + 1, b + 1, c + 1]
    miswired = TapSpec.from_layer_inputs(mis_inputs, L, H)
    keep = sorted(set([0, a + 1, b + 1] + mis_inputs))  # residual-stream indices the demo uses
    idx_ok = [keep.index(i) for i in (0, a + 1, b + 1)]
    idx_mis = [keep.index(i) for i in mis_inputs]
    seq = _batched(lambda sl: greedy_continue(model, prompts[sl], N), len(prompts), 256)

    def stream(sl):
        states, _, greedy_ids = residual_stream(model, seq[sl])
        return states[:, :, keep].contiguous(), greedy_ids

    stack, greedy = _batched(stream, len(seq), 256)
    lap("target")

    # -- the draft, trained on [Embedding, LayerOutput(a), LayerOutput(b)] -------------------------------------------
    draft_size = settings["draft"]
    arch = DraftArch(hidden_size=H, target_hidden_size=H, num_aux=3, vocab_size=V, draft_vocab_size=V,
                     num_attention_heads=draft_size["num_attention_heads"],
                     num_key_value_heads=draft_size["num_key_value_heads"], head_dim=draft_size["head_dim"],
                     intermediate_size=draft_size["intermediate_size"],
                     rms_norm_eps=tcfg.get("rms_norm_eps", 1e-6), max_position_embeddings=P + N + 8,
                     layer_ids=[-1, a, b])
    draft_init_seed = seed + 2 if draft_seed is None else draft_seed
    draft = init_draft_from_target(arch, target, draft_init_seed).to(dev)
    tc = TrainConfig(iters=run["train_iters"], batch=run["train_batch"], steps=run["train_steps"], lr=run["lr"],
                     seed=draft_init_seed + 1)
    bar = progress_bar(tc.iters, "training the draft", "it", progress)

    def trained_one(i: int, loss: float) -> None:
        bar.set_postfix(loss=f"{loss:.2f}")  # before the update: a non-terminal bar says the last one as it ends
        bar.update(1)

    taps_train = stack[:n_train][:, :, idx_ok].reshape(n_train, P + N, 3 * H)
    log = train_draft(draft, taps_train, seq[:n_train], greedy[:n_train], tc, progress=trained_one)
    bar.close()
    del taps_train
    lap("train")

    # -- offline accuracy on held-out prompts, correct vs miswired --------------------------------------------------
    steps = run["eval_steps"]
    eval_rows = slice(n_train, None)
    eval_inputs = (stack[eval_rows], seq[eval_rows], greedy[eval_rows])
    c_ok = chain_correct(draft, *eval_inputs, idx_ok, steps, first_anchor=P - 1)
    c_mis = chain_correct(draft, *eval_inputs, idx_mis, steps, first_anchor=P - 1)
    m_ok, m_mis = metrics(c_ok.reshape(-1, steps)), metrics(c_mis.reshape(-1, steps))
    lap("evaluate")

    # -- artifacts: target, draft, prompts, reference and two captures -----------------------------------------------
    tdir, ddir = os.path.join(out_dir, "target"), os.path.join(out_dir, "draft")
    _save_target(model, tdir)
    save_draft(draft.cpu(), ddir)
    draft.to(dev)
    eval_prompts = prompts[eval_rows].cpu().tolist()
    write_json(os.path.join(out_dir, "prompts.json"), eval_prompts)
    ref_prompts = eval_prompts[: run["reference_prompts"]]
    ref = reference_tensors(target, ref_prompts)
    ref_path = os.path.join(out_dir, "reference.safetensors")
    write_reference(ref_path, ref, num_layers=L, hidden_size=H, source=target.source)
    # the "server": the same weights in bfloat16, capturing at layer inputs
    served = build_demo_target(seed).to(dev, torch.bfloat16)
    ids = ref["input_ids"].to(dev)
    served_stack = torch.cat([residual_stream(served, torch.tensor([p], device=dev))[0][0] for p in ref_prompts], 0)
    del served
    cap_mis = os.path.join(out_dir, "captured_miswired.safetensors")
    cap_ok = os.path.join(out_dir, "captured_correct.safetensors")
    save_captured(cap_mis, served_stack[:, mis_inputs].reshape(len(ids), -1).float(), ids.cpu(),
                  layers_to_capture=mis_inputs, num_layers=L, hidden_size=H,
                  source=f"demo server (bfloat16), layers_to_capture {mis_inputs}: miswired")
    save_captured(cap_ok, served_stack[:, [0, a + 1, b + 1]].reshape(len(ids), -1).float(), ids.cpu(),
                  layers_to_capture=[0, a + 1, b + 1],
                  draft_ids=[-1, a, b], num_layers=L, hidden_size=H,
                  source="demo server (bfloat16) with the eagle3-capture plugin")
    lap("artifacts")

    # -- check and fingerprint ----------------------------------------------------------------------------------------
    flags_text = settings["server_args"]
    rep = run_check(CheckRequest(target_config=os.path.join(tdir, "config.json"),
                                 draft_config=os.path.join(ddir, "config.json"), server_args=flags_text,
                                 reference=ref_path, captured=cap_mis))
    fp_ok = fingerprint(ref_path, cap_ok, declared=trained, declared_source="the draft config")
    lap("check")

    # -- predicted accept lengths: tau, and the served figure (SGLang's loop replayed, as doctor accept does) ---------
    flags = parse_server_args(flags_text)
    resolved = resolve_speculative(flags, "DeepseekV3ForCausalLM")
    default = resolve_speculative(parse_server_args(""), "DeepseekV3ForCausalLM")
    taus = {
        "correct": (m_ok.tau(resolved.steps), m_ok.tau(default.steps), m_ok.tau(steps)),
        "miswired": (m_mis.tau(resolved.steps), m_mis.tau(default.steps), m_mis.tau(steps)),
    }
    served = {}
    side = TransformersTarget(target)
    for name, spec in (("correct", trained), ("miswired", miswired)):
        served[name] = tuple(total(served_walks(evaluate(side, draft, eval_prompts, spec, r.steps, N, r, 256,
                                                         progress=False), N)) for r in (resolved, default))
    lap("served")

    # -- verdict ----------------------------------------------------------------------------------------------------
    failures = []
    margin = settings["assert"]["min_step1_margin"]
    gap = m_ok.teacher_forced[0] - m_mis.teacher_forced[0]
    if gap < margin:
        failures.append(f"step-1 accuracy, correct {m_ok.teacher_forced[0]:.3f} vs miswired "
                        f"{m_mis.teacher_forced[0]:.3f}: gap {gap:.3f} < {margin}")
    codes = {f.code for f in rep.findings if f.severity == "error"}
    for need in ("fingerprint-missing-embedding", "fingerprint-shifted-tap"):
        if need not in codes:
            failures.append(f"check did not report {need} on the miswired capture")
    if any(f.severity == "error" for f in fp_ok.findings):
        failures.append("the correct capture did not fingerprint clean")

    png = None
    notes = []
    if plot and not _have_matplotlib():
        notes.append("matplotlib is not installed: no PNG written (pip install matplotlib)")
        plot = False
    if plot:
        from .plot import accuracy_plot

        png = os.path.join(out_dir, "accuracy.png")
        sglang_defaults = f"{default.steps}/{default.topk}/{default.draft_tokens}"
        accuracy_plot(png, {f"correct capture {list(trained.taps)}": m_ok,
                            f"miswired capture {list(miswired.taps)}": m_mis},
                      "EAGLE-3 demo draft: offline accuracy per draft step (held-out prompts)",
                      {f"correct capture {list(trained.taps)}":
                       f"served accept length {served['correct'][1].served_accept_length:.2f}, "
                       f"tau {taus['correct'][1]:.2f} at SGLang's {sglang_defaults}",
                       f"miswired capture {list(miswired.taps)}":
                       f"served accept length {served['miswired'][1].served_accept_length:.2f}, "
                       f"tau {taus['miswired'][1]:.2f} at SGLang's {sglang_defaults}"})
        lap("plot")
    text = report_text(settings, trained, miswired, m_ok, m_mis, taus, served, resolved, default, rep, fp_ok, log,
                       timings, out_dir, fast, dev, failures, notes)
    write_json(os.path.join(out_dir, "report.json"), {
        "fast": fast, "device": dev, "seed": seed, "settings": settings,
        "trained_taps": [repr(t) for t in trained.taps], "miswired_taps": [repr(t) for t in miswired.taps],
        "correct": m_ok.to_json(), "miswired": m_mis.to_json(),
        "tau": {k: {"server_flags": v[0], "sglang_defaults": v[1], f"chain_{steps}": v[2]} for k, v in taus.items()},
        "served": {k: {"server_flags": v[0].to_json(), "sglang_defaults": v[1].to_json()} for k, v in served.items()},
        "check": rep.to_json(), "fingerprint_correct": fp_ok.to_json(), "train": log, "timings_s": timings,
        "failures": failures, "png": png,
    })
    with open(os.path.join(out_dir, "report.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return DemoResult(not failures, text, m_ok, m_mis, trained, list(miswired.taps), rep, fp_ok, out_dir, timings,
                      settings, log, failures)


def _have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _save_target(model, path: str) -> None:
    """save_pretrained without transformers' progress bar."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if was:
            hf_logging.enable_progress_bar()


__all__ = ["DemoResult", "run_demo"]
