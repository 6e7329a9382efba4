"""What the SGLang plugin tests run in a fresh process (SGLang's `load_plugins()` runs once per process and its
patches cannot be undone, and a TP run needs one process a rank), on harness.py's CPU setup:

    python tests/plugin/scenarios.py native OUT.pt     stock SGLang (plugin not loaded): what it captures
    python tests/plugin/scenarios.py stock OUT.pt      stock SGLang on valid layer-input ids vs the HF model
    python tests/plugin/scenarios.py hooks OUT.json    load_plugins() under the caller's environment: which hooks
    python tests/plugin/scenarios.py draft_tp OUT_DIR RANK WORLD PORT    one TP rank of the draft fc (gloo)
    python tests/plugin/scenarios.py settings CASES.json OUT.json   load_plugins() once per case of settings
    python tests/plugin/scenarios.py graph_gate OUT.json   load_plugins() with the dump on; doctor forwards eager

The tests call them through :func:`run_script` and :func:`run_ranks`.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional

from harness import (
    DECODE_TOKEN, DRAFT_IDS, PROMPT, ServedRunner, SglangRunner, free_port, bare_model, build_hf, build_mla_draft,
    build_sglang, decode_graph_runner_class, hf_taps, setup_process, target_features, tiny_config,
)

import torch  # noqa: E402  (after harness, which sets TORCHDYNAMO_DISABLE first)


def _native(out_path: str) -> None:
    """Stock SGLang: for each id list, what it stored, what its capture received (slots, in order) and how the
    forward ended. Where the release packs captures in an AuxHiddenStatePacker (layers/aux_hidden_states.py, from
    0.5.18), what it had packed is read at its own count check; before that the capture is a list (0.5.12: appended
    in DeepseekV2Model.forward's loop, 0.5.14/0.5.16: handed into each layer), returned as it is."""
    import contextlib
    import importlib.util
    from unittest import mock

    setup_process()
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    assert not hasattr(DeepseekV2ForCausalLM.set_eagle3_layers_to_capture, "__wrapped__"), "plugin loaded"
    cfg = tiny_config()
    hf = build_hf(cfg)
    model = build_sglang(cfg, hf)
    seen: List[torch.Tensor] = []
    spy = contextlib.nullcontext()
    if importlib.util.find_spec("sglang.srt.layers.aux_hidden_states") is not None:
        from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

        original_finalize = AuxHiddenStatePacker.finalize

        def spy_finalize(self):  # test instrumentation: record what stock SGLang packed before its own check
            n = len(self)
            width = 0 if self._feature_size is None else n * self._feature_size
            seen.append(self._buffer[:, :width].clone() if self._buffer is not None else None)
            return original_finalize(self)

        spy = mock.patch.object(AuxHiddenStatePacker, "finalize", spy_finalize)

    results: Dict[str, dict] = {}
    with spy:
        for ids in ([-1, 1, 3, 5], [0, 2, 4]):
            model.set_eagle3_layers_to_capture(list(ids))
            rec = {"layers_to_capture": list(model.model.layers_to_capture), "steps": []}
            r = SglangRunner(cfg)
            for toks in (PROMPT, [DECODE_TOKEN]):
                seen.clear()
                try:
                    out = r.forward(model, torch.tensor(toks))
                    rec["steps"].append({"aux": out.hidden_states.clone(), "error": None,
                                         "packed": seen[-1] if seen else out.hidden_states.clone()})
                # the packer's count check (an assert on 0.5.18, RuntimeError from 0.5.20); 0.5.12's residual None
                # at layer input 0 (TypeError)
                except (RuntimeError, AssertionError, TypeError) as e:
                    rec["steps"].append({"aux": None, "error": f"{type(e).__name__}: {e}",
                                         "packed": seen[-1] if seen else None})
                    r.seq_len += len(toks)  # the KV cache was written before the failing check
            results[str(ids)] = rec
    torch.save(results, out_path)


STOCK_IDS = ([1, 2, 4], [2, 3, 4], [2, 4])  # ids[0] == 1 and not: the two rules of 0.5.12 / 0.5.14+ differ on the last two


def _stock(out_path: str) -> None:
    """The harness before the plugin is involved: stock SGLang's DeepseekV3 (plugin not loaded), its capture on
    layer-input ids that every release can capture, prefill and one decode, against the HF model's hidden states
    (layer input i = HF hidden_states[i]). Which layer inputs each id list becomes is what the installed release's
    own set_eagle3_layers_to_capture stores. Also what stock does with layer input 0 (the embedding)."""
    import importlib.metadata

    setup_process()
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    assert not hasattr(DeepseekV2ForCausalLM.set_eagle3_layers_to_capture, "__wrapped__"), "plugin loaded"
    cfg = tiny_config()
    hf = build_hf(cfg)
    model = build_sglang(cfg, hf)
    taps, logits = hf_taps(hf, torch.tensor(PROMPT + [DECODE_TOKEN]))
    hf_hidden = [taps[i] for i in range(cfg.num_hidden_layers)]  # HF hidden_states[0..L-1] = layer inputs
    results = {"sglang": importlib.metadata.version("sglang"),
               "transformers": importlib.metadata.version("transformers"),
               "num_layers": cfg.num_hidden_layers, "hf_hidden": hf_hidden, "hf_logits": logits, "ids": {}}
    for ids in STOCK_IDS:
        model.set_eagle3_layers_to_capture(list(ids))
        rec = {"layers_to_capture": list(model.model.layers_to_capture), "aux": [], "logits": []}
        r = SglangRunner(cfg)
        for toks in (PROMPT, [DECODE_TOKEN]):
            out = r.forward(model, torch.tensor(toks))
            rec["aux"].append(out.hidden_states.clone())
            rec["logits"].append(out.next_token_logits[0].clone())
        results["ids"][str(ids)] = rec
    # the same through SGLang's own ModelRunner.forward (ServedRunner: the path every served forward takes)
    model.set_eagle3_layers_to_capture(list(STOCK_IDS[0]))
    served = ServedRunner(model, cfg, rid="stock-0")
    results["served"] = {"layers_to_capture": list(model.model.layers_to_capture),
                         "aux": [served.forward(toks)[0].logits_output.hidden_states.clone()
                                 for toks in (PROMPT, [DECODE_TOKEN])]}
    # layer input 0, set directly (no id rule gives it on every release): the embedding, or the release's error
    model.set_eagle3_layers_to_capture([1, 2, 4])
    model.model.layers_to_capture = [0, 2]
    r = SglangRunner(cfg)
    try:
        out = r.forward(model, torch.tensor(PROMPT))
        results["input0"] = {"aux": out.hidden_states.clone(), "error": None}
    except Exception as e:  # noqa: BLE001  (recorded for the test to judge)
        results["input0"] = {"aux": None, "error": f"{type(e).__name__}: {e}"}
    torch.save(results, out_path)


def _hooks(out_path: str) -> None:
    """load_plugins() under this process's environment; report which of the plugin's hooks are in place."""
    import json
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s|%(message)s", stream=sys.stderr)
    setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture.sglang import plugin
    from eagle3_capture.sglang.installed.hook_chain import hook_path_in_place

    in_place = {group: {path: hook_path_in_place(path, fn) for path, fn in hooks}
                for group, hooks in plugin.HOOKS.items()}
    set_layers = {}
    for ids in ([-1, 2, 30], [-1, 2, 30, 60]):
        m = bare_model()
        try:
            m.set_eagle3_layers_to_capture(list(ids))
            set_layers[str(ids)] = list(m.model.layers_to_capture)
        except Exception as e:
            set_layers[str(ids)] = f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump({"in_place": in_place, "registered": plugin.registered, "skipped": plugin.skipped,
                   "status": plugin.hook_status(), "set_layers": set_layers}, f)


def _draft_tp_rank(out_dir: str, rank: str, world: str, port: str) -> None:
    """One TP rank of the draft fc at TP = world on CPU (gloo): SGLang's Eagle3MLAModel with its fc column-sharded,
    full weights loaded through the parameters' own weight loaders, run with the plugin (fused fc + the project's
    gatherer where its p2p kernel runs, SGLang's _fc_gatherer elsewhere) and with SGLang's own forward, up to the
    draft layer's input (the fc output: everything after it is SGLang's attention, unchanged by the plugin)."""
    import json

    rank, world = int(rank), int(world)
    setup_process(world_size=world, rank=rank, port=int(port))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture import reference
    from eagle3_capture.sglang import draft
    from eagle3_capture.tp import PackedGatherer

    cfg, model = build_mla_draft(fc_norm=True, fill=False)
    K, H = len(DRAFT_IDS), cfg.hidden_size
    g = torch.Generator().manual_seed(21)  # same full weights on every rank; each rank's loader takes its shard
    full = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            loader = getattr(p, "weight_loader", None)
            if name == "model.fc.weight":
                w = torch.randn(H, K * H, generator=g) / (K * H) ** 0.5
            elif name == "model.embed_tokens.weight":
                w = 0.05 * torch.randn(cfg.vocab_size, H, generator=g)
            elif "norm" in name:
                w = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
                continue
            full[name] = w
            loader(p, w) if loader is not None else p.copy_(w)
    model.post_load_weights()
    assert tuple(model.model.fc.weight.shape) == (H // world, K * H), tuple(model.model.fc.weight.shape)
    x = target_features(len(PROMPT), H, K)
    seen = {}

    def pre(module, args):
        seen["h"] = args[2].clone()
        raise _StopAtDraftLayer

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    handle = model.model.midlayer.register_forward_pre_hook(pre)
    results = {}
    try:
        for label, fwd in (("plugin", type(model.model).forward), ("sglang", type(model.model).forward.__wrapped__)):
            ids = torch.tensor(PROMPT)
            n = len(PROMPT)
            fb = ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
                              req_pool_indices=torch.zeros(1, dtype=torch.int32),
                              seq_lens=torch.tensor([n], dtype=torch.int32),
                              seq_lens_cpu=torch.tensor([n], dtype=torch.int32), out_cache_loc=torch.arange(n),
                              seq_lens_sum=n, positions=torch.arange(n))
            fb.spec_info = EagleDraftInput(hidden_states=x)
            try:
                with torch.no_grad():
                    fwd(model.model, ids, fb.positions, fb)
            except _StopAtDraftLayer:
                pass
            results[label] = seen.pop("h")
    finally:
        handle.remove()
    g_norm = torch.stack([full[f"model.fc_norm.{k}.weight"] for k in range(K)]).double()
    want = reference.draft_fc(x.double(), full["model.fc.weight"].double(), g_norm, cfg.rms_norm_eps)
    gatherer = model.model.__dict__.get(draft._GATHER_ATTR)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({
            "plugin_vs_reference": float((results["plugin"].double() - want).abs().max()),
            "sglang_vs_reference": float((results["sglang"].double() - want).abs().max()),
            "plugin_vs_sglang": float((results["plugin"] - results["sglang"]).abs().max()),
            "shape": list(results["plugin"].shape),
            "gatherer": type(gatherer).__name__ if isinstance(gatherer, PackedGatherer) else repr(gatherer),
            "backend": getattr(gatherer, "backend", None),
            "fc_shard": list(model.model.fc.weight.shape),
        }, f)


class _StopAtDraftLayer(Exception):
    pass


def _settings(cases_path: str, out_path: str) -> None:
    """For each case (a dict of EAGLE3_CAPTURE_* values): SGLang's real load_plugins() under exactly those settings
    (its once-per-process guard and the registry's hook lists reset between cases; targets already patched stay
    patched, and the plugin's hooks read the settings of the last registration), then what became of the plugin:
    did SGLang report a failed plugin, which groups registered, which ERROR lines, does a model load go ahead."""
    import json
    import logging

    setup_process()
    import sglang.srt.plugins as sp
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.plugins.hook_registry import HookRegistry

    class Grab(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            self.lines.append((record.name, record.levelname, record.getMessage()))

    grab = Grab()
    logging.getLogger().addHandler(grab)
    logging.getLogger().setLevel(logging.INFO)
    with open(cases_path) as f:
        cases = json.load(f)
    results = []
    for env in cases:
        for k in list(os.environ):  # misspelt names too (any case, any separators): one case's must not leak
            if k.upper().replace("_", "").replace("-", "").startswith("EAGLE3CAPTURE"):
                del os.environ[k]
        os.environ.update(env)
        grab.lines.clear()
        sp._plugins_loaded = False
        HookRegistry._hooks.clear()
        sp.load_plugins()
        from eagle3_capture.sglang import plugin
        from eagle3_capture.sglang.settings import switches

        try:
            ModelRunner.load_model(ModelRunner.__new__(ModelRunner))
            load = "loaded"
        except RuntimeError as e:
            load = str(e) if str(e).startswith("eagle3_capture:") else f"RuntimeError: {e}"
        except Exception as e:  # SGLang's own load_model on an object with no config: it went ahead
            load = f"went ahead ({type(e).__name__})"
        results.append({
            "env": env, "load": load, "registered": sorted(plugin.registered),
            "plugin_failed": [m for n, lv, m in grab.lines if "Failed to execute general plugin" in m],
            "executed": any("Executed general plugin: eagle3_capture" in m for _, _, m in grab.lines),
            "errors": [m for n, lv, m in grab.lines if lv == "ERROR" and n.startswith("eagle3_capture")],
            "refusal": switches.current().refusal, "dump": switches.current().dump is not None,
            "lines": [f"{lv} {m}" for n, lv, m in grab.lines if n.startswith("eagle3_capture")],
        })
    with open(out_path, "w") as f:
        json.dump(results, f)


def _graph_gate(out_path: str) -> None:
    """The dump on at load_plugins(): a target decode forward holding a doctor request runs eagerly through SGLang's
    real ModelRunner.forward even though a decode graph runner stands ready, because the plugin's hook on
    DecodeCudaGraphRunner.can_run_graph says no; a forward of another request asks SGLang's own can_run_graph (on
    this bare runner it fails: proof that SGLang asked it)."""
    import glob
    import json

    setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    DecodeCudaGraphRunner = decode_graph_runner_class()  # the release's decode graph runner class

    from eagle3_capture.sglang.dump import forwards as dump
    from eagle3_capture.sglang.installed import internals
    from eagle3_capture.sglang import served
    from eagle3_capture.sglang.installed.hook_chain import hook_path_in_place

    cfg = tiny_config()
    model = build_sglang(cfg, build_hf(cfg))
    model.set_eagle3_layers_to_capture([-1, 1, 3, 5])
    gr = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    r = ServedRunner(model, cfg, rid="eagle3-doctor-gate", graph_runner=gr)
    r.forward(PROMPT)
    out, _ = r.forward([DECODE_TOKEN])
    other = ServedRunner(model, cfg, rid="served-0", graph_runner=DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner))
    other.forward(PROMPT)
    try:
        other.forward([DECODE_TOKEN])
        asked = "eager"
    except Exception as e:
        asked = f"{type(e).__name__}: {e}"
    dump.flush(60)
    recs = [torch.load(f, weights_only=True) for f in sorted(glob.glob(os.path.join(os.environ["EAGLE3_CAPTURE_DUMP"],
                                                                                    "*.pt")))]
    with open(out_path, "w") as f:
        json.dump({"gates": {p: hook_path_in_place(p, served.graph_gate_hook)
                             for p in internals.current().graph_gate_paths},
                   "doctor_decode_graph": bool(out.can_run_graph), "other_decode": asked,
                   "graph_runner": DecodeCudaGraphRunner.__name__,
                   "records": [(x["forward_mode"], x["requests"][0]["rid"], x["graph"], x["stream"] is not None)
                               for x in sorted(recs, key=lambda x: x["seq"])]}, f)


def run_ranks(scenario: str, out_dir, world: int, env_extra: Optional[Dict[str, str]] = None, timeout: int = 300):
    """Run `scenarios.py SCENARIO OUT_DIR RANK WORLD PORT` for every rank at once; raise with stderr on failure."""
    import subprocess

    env = dict(os.environ)
    env.update(env_extra or {})
    env["TORCHDYNAMO_DISABLE"] = "1"
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), scenario, str(out_dir), str(r), str(world),
                               port], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"scenarios.py {scenario} rank {r} timed out after {timeout} s")
        outs.append((p.returncode, err))
    bad = [(r, rc, err) for r, (rc, err) in enumerate(outs) if rc != 0]
    if bad:
        r, rc, err = bad[0]
        raise AssertionError(f"scenarios.py {scenario} rank {r} failed (rc {rc}):\n{err[-6000:]}")


def run_script(scenario: str, out_path, env_extra: Optional[Dict[str, str]] = None, timeout: int = 300,
               args=()):
    """Run this file as `scenarios.py SCENARIO [ARGS...] OUT` in a fresh process (the caller's environment plus
    env_extra); returns the CompletedProcess, raising with its stderr if it failed."""
    import subprocess

    env = dict(os.environ)
    env.update(env_extra or {})
    env["TORCHDYNAMO_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), scenario, *map(str, args), str(out_path)],
                          env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"scenarios.py {scenario} failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


if __name__ == "__main__":
    scenario, args = sys.argv[1], sys.argv[2:]
    {"native": _native, "stock": _stock, "hooks": _hooks, "draft_tp": _draft_tp_rank, "settings": _settings,
     "graph_gate": _graph_gate}[scenario](*args)
