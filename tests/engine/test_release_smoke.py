"""The serving smoke on the SGLang release under test: ``python -m sglang.launch_server`` (its scheduler, ModelRunner
and EAGLE worker) serving EAGLE-3 for the demo pair on the CPU, chain 3/1/4, a few prompts, stock and with this
project's plugin. Each server's outputs must equal the target's greedy continuation, and its served accept length
and per-request verify counts must equal what ``doctor accept`` predicts for the taps that server captures.

The release is the one this process imports (``sglang.__version__``); run it against another by putting that
release first on PYTHONPATH (``tests/sglang_release_dirs.py sglang --importable X`` installs one; ``make test-sglang
SGLANG=X`` runs this after that release's model-level tests):

    PYTHONPATH=.venv/sglang-releases/0.5.12 .venv/bin/python -m pytest -m engine tests/engine/test_release_smoke.py

What each release needs to run on the CPU is docs/sglang_cpu_releases.md; the stand-ins live in the test-only
plugin tests/sglang_cpu_plugin (feature-detected) and, for a release that imports sgl_kernel unconditionally
(0.5.12), the import-only sgl_kernel of scripts/gpu_sglang/standins, put on the servers' PYTHONPATH only then.
Each run writes release_smoke_<version>.json (timings, served and predicted figures) to E3_RELEASE_SMOKE_OUT, else
to the pair's directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import List, Optional

import pytest

from e3_sglang_cpu import sgl_kernel_standin
from engine_fixtures import CHAIN, LaunchedServer, doctor, flags_text, pair, post_json  # noqa: F401
from engine_runs import run_fixture

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]

SMOKE_PROMPTS = 4       # a few prompts, one batched /generate: each server costs 2-3 minutes on two cores
SMOKE_NEW_TOKENS = 16
# the demo draft's trained taps [Embedding, LayerOutput(0), LayerOutput(3)] as layer-input indices
TRAINED_LAYER_INPUTS = [0, 1, 4]


# ----------------------------------------------------------------------------------------------------------------
# the release under test
# ----------------------------------------------------------------------------------------------------------------

def sglang_version() -> str:
    import sglang

    return sglang.__version__


def stock_layer_inputs(ids: List[int]) -> Optional[List[int]]:
    """What the installed SGLang's own ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` makes of draft ids
    (run on an object made with ``__new__``: it reads only pp_group, config and model), or None if it raises."""
    import types

    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    m = DeepseekV2ForCausalLM.__new__(DeepseekV2ForCausalLM)
    object.__setattr__(m, "_modules", {})  # nn.Module attribute machinery without running __init__
    object.__setattr__(m, "_parameters", {})
    object.__setattr__(m, "_buffers", {})
    m.__dict__["pp_group"] = types.SimpleNamespace(is_last_rank=True)
    m.__dict__["config"] = types.SimpleNamespace(num_hidden_layers=8)  # the demo target's; read only for ids None
    m.__dict__["model"] = types.SimpleNamespace(layers_to_capture=[])
    try:
        m.set_eagle3_layers_to_capture(list(ids))
    except Exception:
        return None
    return list(m.model.layers_to_capture)


def stock_draft_ids() -> tuple:
    """(ids, layer inputs stock SGLang captures for them, why): the draft ids in the release's own convention that
    make stock SGLang capture the trained taps; where the release cannot capture layer input 0 (the embedding: up to
    0.5.12 every id gets +1, so the embedding would be id -1 -> layer input 0, and ``DeepseekV2Model.forward``
    computes ``hidden_states + residual`` there with residual None), the closest it can: [LayerOutput(0),
    LayerOutput(1), LayerOutput(3)], served to a draft trained on [Embedding, LayerOutput(0), LayerOutput(3)]."""
    if stock_layer_inputs([0, 1, 4]) == TRAINED_LAYER_INPUTS:  # 0.5.14+: ids not starting with 1 used unchanged
        return [0, 1, 4], TRAINED_LAYER_INPUTS, "the trained taps"
    if stock_layer_inputs([-1, 0, 3]) == TRAINED_LAYER_INPUTS:  # +1 on every id (0.5.12)
        ids = [0, 1, 3]
        return ids, stock_layer_inputs(ids), ("the embedding cannot be captured by this release's loop (layer input "
                                              "0 raises): the first two slots differ from training")
    raise AssertionError(f"SGLang {sglang_version()}: its id rule is neither 0.5.12's nor 0.5.14+'s: "
                         f"[0, 1, 4] -> {stock_layer_inputs([0, 1, 4])}, [-1, 0, 3] -> "
                         f"{stock_layer_inputs([-1, 0, 3])}")


def server_flags() -> List[str]:
    """Flags the release needs beside LaunchedServer's: 0.5.12 turns on its piecewise CUDA graph for prefill by
    default (``model_executor/piecewise_cuda_graph_runner.py`` then asks ``torch.cpu`` for a graph pool handle)."""
    from sglang.srt.server_args import ServerArgs

    return ["--disable-piecewise-cuda-graph"] if hasattr(ServerArgs, "disable_piecewise_cuda_graph") else []


@dataclasses.dataclass
class Release:
    version: str
    stock_ids: List[int]
    stock_layer_inputs: List[int]
    stock_note: str
    flags: List[str]
    pythonpath: Optional[str]   # a directory holding only the stand-ins this release needs, or None


_RELEASE = {}


def release_under_test(pair) -> Release:
    """The release's facts, read once, in the main thread (they import SGLang in this process)."""
    if "release" not in _RELEASE:
        ids, inputs, note = stock_draft_ids()
        extra = None
        modules = sgl_kernel_standin.needed_modules()
        if modules:
            extra = sgl_kernel_standin.make_folder(os.path.join(pair.root, "import_standins"), modules)
        _RELEASE["release"] = Release(sglang_version(), ids, inputs, note, server_flags(), extra)
    return _RELEASE["release"]


@pytest.fixture(scope="module")
def release(pair) -> Release:
    return release_under_test(pair)


# ----------------------------------------------------------------------------------------------------------------
# the servers
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Smoke:
    name: str
    responses: List[dict]
    start_s: float          # launch_server until /health answers
    run_s: float            # the batched /generate
    log: str

    @property
    def outputs(self):
        return [r["output_ids"] for r in self.responses]

    @property
    def verify_counts(self):
        return [r["meta_info"]["spec_verify_ct"] for r in self.responses]

    @property
    def histograms(self):
        return [r["meta_info"].get("spec_correct_drafts_histogram") for r in self.responses]

    @property
    def accept_length(self) -> float:
        return (sum(r["meta_info"]["completion_tokens"] for r in self.responses)
                / sum(self.verify_counts))


def smoke_prompts(pair) -> List[List[int]]:
    with open(pair.first_prompts(SMOKE_PROMPTS)) as f:
        return json.load(f)


def serve(pair, release: Release, name: str, draft: str, env: dict) -> Smoke:
    """launch_server with the release's flags and stand-ins, the prompts in one batched /generate (greedy,
    ignore_eos), its responses, the time to healthy and the time to answer."""
    env = dict(env)
    if release.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), release.pythonpath) if p)
    srv = LaunchedServer(pair, draft, CHAIN, env=env)
    srv.cmd += release.flags
    srv.log_path = os.path.join(pair.root, f"smoke_{name}.log")
    prompts = smoke_prompts(pair)
    t0 = time.time()
    with srv:
        t1 = time.time()
        out = post_json(srv.url + "/generate", {"input_ids": prompts, "sampling_params": {
            "temperature": 0, "max_new_tokens": SMOKE_NEW_TOKENS, "ignore_eos": True}}, timeout=900)
        t2 = time.time()
        log = srv.log()
    rows = [{"input_ids": p, "output_ids": o.get("output_ids"), "meta_info": o.get("meta_info")}
            for p, o in zip(prompts, out)]
    with open(os.path.join(pair.root, f"smoke_{name}.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return Smoke(name, rows, t1 - t0, t2 - t1, log)


def serve_stock(pair, release: Release) -> Smoke:
    """Stock SGLang (the plugin registers nothing), the draft's ids written in the release's own convention."""
    draft = pair.draft_variant("smoke_stock_" + "_".join(str(i) for i in release.stock_ids),
                               eagle_aux_hidden_state_layer_ids=release.stock_ids)
    return serve(pair, release, f"stock_{release.version}", draft, {"EAGLE3_CAPTURE_DISABLE": "all"})


def serve_plugin(pair, release: Release) -> Smoke:
    """This project's plugin on (every switch as a deployment has it), the draft as shipped (ids [-1, 0, 3])."""
    return serve(pair, release, f"plugin_{release.version}", pair.draft, {"EAGLE3_CAPTURE_DISABLE": None})


# ----------------------------------------------------------------------------------------------------------------
# what the doctor says
# ----------------------------------------------------------------------------------------------------------------

def greedy_continuations(pair) -> List[List[int]]:
    """The transformers target's greedy continuation of each smoke prompt."""
    from doctor_helpers import replay_demo

    return [cont for _, cont, _ in replay_demo(os.path.dirname(pair.target), smoke_prompts(pair), SMOKE_NEW_TOKENS,
                                               CHAIN)]


def predicted(pair, name: str, layer_inputs: List[int]) -> dict:
    """``doctor accept`` for the shipped draft replayed with these taps (the ones the server captures), chain flags:
    its ``served`` block (served accept length, per-prompt verify counts and histograms)."""
    out = os.path.join(pair.root, f"smoke_accept_{name}.json")
    code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts",
                             pair.first_prompts(SMOKE_PROMPTS), "--taps",
                             "layer_inputs:" + ",".join(map(str, layer_inputs)), "--server-args", flags_text(CHAIN),
                             "--new-tokens", SMOKE_NEW_TOKENS, "--json", out, "--no-progress", "--device", "cpu",
                             "--threads", 1)
    assert code == 0, text + err
    with open(out) as f:
        return json.load(f)["served"]


def report(pair, release: Release, key: str, smoke: Smoke, pred: dict, greedy_ok: List[bool]) -> None:
    """Add this server's figures to release_smoke_<version>.json."""
    d = os.environ.get("E3_RELEASE_SMOKE_OUT") or pair.root
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"release_smoke_{release.version}.json")
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data.update({"sglang": release.version, "flags": flags_text(CHAIN).split() + release.flags,
                 "prompts": SMOKE_PROMPTS, "new_tokens": SMOKE_NEW_TOKENS,
                 "sgl_kernel_standin": release.pythonpath is not None})
    data[key] = {"engine_start_s": round(smoke.start_s, 1), "run_s": round(smoke.run_s, 1),
                 "outputs_equal_greedy": greedy_ok, "served_accept_length": round(smoke.accept_length, 4),
                 "verify_counts": smoke.verify_counts, "histograms": smoke.histograms,
                 "predicted_accept_length": pred["served_accept_length"],
                 "predicted_verify_counts": [p["verify_ct"] for p in pred["per_prompt"]]}
    if key == "stock":
        data[key].update(draft_ids=release.stock_ids, layer_inputs=release.stock_layer_inputs,
                         note=release.stock_note)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def check(pair, release: Release, key: str, smoke: Smoke, greedy: List[List[int]], pred: dict):
    """`pred`: `predicted(...)` for the taps this server captures."""
    assert len(smoke.responses) == SMOKE_PROMPTS
    same = [o == g for o, g in zip(smoke.outputs, greedy)]
    report(pair, release, key, smoke, pred, same)
    assert all(same), f"{key}: outputs {smoke.outputs} != greedy {greedy}"
    assert [p["verify_ct"] for p in pred["per_prompt"]] == smoke.verify_counts
    assert [p["correct_drafts_histogram"] for p in pred["per_prompt"]] == smoke.histograms
    assert abs(pred["served_accept_length"] - smoke.accept_length) <= 0.01


# ----------------------------------------------------------------------------------------------------------------
# the runs: both servers at once, the doctor's figures beside them (engine_runs.py)
# ----------------------------------------------------------------------------------------------------------------

def define(runs, pair) -> None:
    release = release_under_test(pair)
    runs.add("smoke_stock", lambda: serve_stock(pair, release), priority=20)
    runs.add("smoke_plugin", lambda: serve_plugin(pair, release), priority=20)
    runs.add("smoke_greedy", lambda: greedy_continuations(pair), priority=21)
    runs.add("smoke_predicted_stock", lambda: predicted(pair, "stock", release.stock_layer_inputs), priority=22)
    runs.add("smoke_predicted_plugin", lambda: predicted(pair, "plugin", TRAINED_LAYER_INPUTS), priority=22)


smoke_stock, smoke_plugin, smoke_greedy, smoke_predicted_stock, smoke_predicted_plugin = (
    run_fixture(name, define) for name in ("smoke_stock", "smoke_plugin", "smoke_greedy", "smoke_predicted_stock",
                                           "smoke_predicted_plugin"))


# ----------------------------------------------------------------------------------------------------------------
# the smoke
# ----------------------------------------------------------------------------------------------------------------

def test_stock_serves_the_greedy_continuation_at_the_predicted_accept_length(pair, release, smoke_stock, smoke_greedy,
                                                                               smoke_predicted_stock):
    """Stock SGLang with the draft's ids in its own convention: lossless, and the doctor's replay with the taps it
    captures predicts its verify counts exactly."""
    check(pair, release, "stock", smoke_stock, smoke_greedy, smoke_predicted_stock)


def test_plugin_serves_the_greedy_continuation_at_the_predicted_accept_length(pair, release, smoke_plugin,
                                                                                smoke_greedy, smoke_predicted_plugin):
    """The plugin serves the draft's declared taps (the embedding included, on every release): lossless, and the
    doctor's replay with those taps predicts its verify counts exactly."""
    check(pair, release, "plugin", smoke_plugin, smoke_greedy, smoke_predicted_plugin)
    # the startup line names the release, and the declared taps stored as the layers SGLang's loop captures; the
    # served-forward self-test found the embedding in slot 0 (on 0.5.12 the plugin captures it: stock cannot)
    startup = re.search(r"eagle3_capture: SGLang (\S+) \(adapter [^)]+\): DeepseekV3ForCausalLM: taps \[Embedding, "
                        r"LayerOutput\(0\), LayerOutput\(3\)\].*-> layers_to_capture \[0, 1, 4\]", smoke_plugin.log)
    assert startup and startup.group(1) == release.version, smoke_plugin.log[-3000:]
    assert "capture self-test passed: slot 0 equals the embedding bit for bit" in smoke_plugin.log, \
        smoke_plugin.log[-3000:]


def test_doctor_check_says_what_stock_serves(pair, release):
    """`doctor check --sglang-version <this release>` on the stock server's draft config: the layers it says stock
    SGLang stores are the ones the served stock server captured (found by the release's own function, and served
    at the predicted accept length above), with no failure; on the shipped draft it says what the release does with
    the embedding's id (0.5.12: the TypeError at layer input 0; 0.5.14+: one slot short)."""
    draft = pair.draft_variant("smoke_stock_" + "_".join(str(i) for i in release.stock_ids),
                               eagle_aux_hidden_state_layer_ids=release.stock_ids)
    for name, cfg in (("stock", draft), ("shipped", pair.draft)):
        out = os.path.join(pair.root, f"smoke_check_{name}_{release.version}.json")
        code, text, err = doctor("check", "--target-config", pair.target, "--draft-config", cfg, "--sglang-version",
                                 release.version, "--server-args", flags_text(CHAIN), "--json", out)
        assert code in (0, 1) and "Traceback" not in err, text + err
        with open(out) as f:
            sg = json.load(f)["sglang"]
        assert sg["release"] == release.version and sg["why"] == "given", sg
        native = sg["native"]
        if name == "stock":
            assert native["stored"] == release.stock_layer_inputs and native["error"] is None, native
            assert len(native["captured"]) == len(release.stock_layer_inputs), native
        else:
            assert native["stored"] == stock_layer_inputs([-1, 0, 3]), native
            assert native["error"] is not None, native  # stock cannot serve the shipped ids on any release
