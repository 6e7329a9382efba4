"""sglang_releases/ against each SGLang release's real code (the pure tests of the model are in
test_sglang_releases.py). Two levels of evidence:
- the real functions of every release whose source is under $E3_SGLANG_RELEASES_DIR (tests/sglang_release_dirs.py):
  its ``set_eagle3_layers_to_capture`` (DeepseekV2 and Qwen MoE) exec'd from its own source on random ids, its
  AuxHiddenStatePacker's count check, its torch / transformers pins, where each hook point lives, the capture-only
  flag and the CUDA-graph ordering;
- the installed SGLang 0.5.23 imported in this process, and each release installed ``--importable`` imported in a
  subprocess (tests/sglang_release_probe.py): the real ``set_eagle3_layers_to_capture`` on objects built with
  ``__new__`` and, on list-in-loop releases, the real ``DeepseekV2Model.forward`` with stand-in layers.
A release whose folder is absent skips with the command that installs it.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from types import MethodType, SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture import sglang_releases as sr
from release_code import calls_in, exec_def, find_def, has_path
from sglang_release_dirs import IMPORT_PROBED, install_hint, sglang_importable, sglang_source
from tap_strategies import H, L61

HERE = os.path.dirname(os.path.abspath(__file__))
ALWAYS = sr.ID_RULE_PLUS_ONE_ALWAYS
LOOP, INTO, PACKER, BOUNDARY = sr.VARIANTS


# ----------------------------------------------------------------------------------------------------------------
# against each release's real code (sources under $E3_SGLANG_RELEASES_DIR)
# ----------------------------------------------------------------------------------------------------------------

def _source(version):
    d = sglang_source(version)
    if d is None:
        pytest.skip(f"SGLang {version} source {install_hint('source', version)}")
    return d


DSV2 = "sglang.srt.models.deepseek_v2"
ID_CASES = st.one_of(st.none(), st.lists(st.integers(-3, 70), max_size=6))


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_real_set_eagle3_layers_to_capture_of_every_release(version):
    """The release's own DeepseekV2ForCausalLM.set_eagle3_layers_to_capture, exec'd from its source, on random
    ids against layers_to_capture()."""
    root = _source(version)
    method = exec_def(root, f"{DSV2}.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture")

    @settings(max_examples=150)
    @given(ID_CASES, st.integers(1, 80))
    def check(ids, L):
        obj = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                              config=SimpleNamespace(num_hidden_layers=L), model=SimpleNamespace())
        method(obj, None if ids is None else list(ids))
        assert obj.capture_aux_hidden_states is True
        assert obj.model.layers_to_capture == sr.layers_to_capture(ids, L, version)

    check()


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_real_qwen_moe_rule_of_every_release(version):
    """qwen2_moe.py's Qwen2MoeForCausalLM + Qwen2MoeModel.set_eagle3_layers_to_capture of the release, exec'd from
    source, over L plain layers: the flagged layers (= captured layer inputs) or the IndexError."""
    root = _source(version)
    top = exec_def(root, "sglang.srt.models.qwen2_moe.Qwen2MoeForCausalLM.set_eagle3_layers_to_capture")
    inner = exec_def(root, "sglang.srt.models.qwen2_moe.Qwen2MoeModel.set_eagle3_layers_to_capture")

    @settings(max_examples=150)
    @given(ID_CASES, st.integers(1, 40))
    def check(ids, L):
        model = SimpleNamespace(layers=[SimpleNamespace() for _ in range(L)])
        model.set_eagle3_layers_to_capture = MethodType(inner, model)
        obj = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                              config=SimpleNamespace(num_hidden_layers=L), model=model)
        nc = sr.native_capture(ids, L, 8, version, sr.FAMILY_QWEN_MOE, cuda_graphs=False)
        try:
            top(obj, None if ids is None else list(ids))
        except IndexError:
            assert nc.error is not None and nc.error.startswith("IndexError"), (ids, L, nc)
            return
        flagged = [i for i, layer in enumerate(model.layers) if getattr(layer, "_is_layer_to_capture", False)]
        assert not (nc.error or "").startswith("IndexError")
        assert tuple(flagged) == nc.captured_inputs

    check()


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_real_qwen3_next_has_the_rule_from_0_5_9(version):
    root = _source(version)
    node, _ = find_def(root, "sglang.srt.models.qwen3_next.Qwen3NextForCausalLM.set_eagle3_layers_to_capture")
    supported = sr.model_support_error(version, ["qwen3_next"]) is None
    assert (node is not None) == supported
    if supported:  # the same +1-always rule as qwen2_moe
        src = exec_def(root, "sglang.srt.models.qwen3_next.Qwen3NextForCausalLM.set_eagle3_layers_to_capture")
        got = {}
        obj = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=SimpleNamespace(num_hidden_layers=9),
                              model=SimpleNamespace(set_eagle3_layers_to_capture=lambda v: got.setdefault("v", v)))
        src(obj, [-1, 2, 5])
        assert got["v"] == sr.layers_to_capture([-1, 2, 5], 9, version, sr.FAMILY_QWEN_MOE)


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_kimi_k25_support_per_release(version):
    root = _source(version)
    node, _ = find_def(root, "sglang.srt.models.kimi_k25.KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture")
    assert (node is not None) == (sr.model_support_error(version, ["kimi_k25"]) is None)


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_pins_match_the_release_metadata(version):
    root = _source(version)
    meta = next(root.glob("sglang-*.dist-info/METADATA")).read_text()
    r = sr.release(version)
    assert f"Requires-Dist: torch=={r.torch_pin}\n" in meta and f"Requires-Dist: transformers=={r.transformers_pin}\n" in meta
    assert f"\nVersion: {version}\n" in meta


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_hook_points_where_the_release_has_them(version):
    """Every hook point's path in this release exists there (a `(name)` suffix: that parameter too), and where the
    release records another path (or none) than the one the plugin hooks on 0.5.23, that 0.5.23 path is absent."""
    root = _source(version)
    r = sr.release(version)
    for hp in sr.HOOK_POINTS:
        path = r.hook_path(hp.name)
        if path is not None:
            assert has_path(root, path), (version, hp.name, path)
        bare = None if path is None else path.split("(")[0]
        if hp.plugin_path is not None and bare != "sglang.srt." + hp.plugin_path:
            plain = "sglang.srt." + hp.plugin_path
            assert not has_path(root, plain), (version, hp.name, plain, "present, but the table says absent")
    # the parameter rows say what they claim (a path without the parameter would pass the check above)
    assert has_path(root, f"{DSV2}.DeepseekV2DecoderLayer.forward(captured_last_layer_outputs)") == \
        (r.hook_path("layer-capture-param") is not None)


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_the_variant_is_how_deepseek_v2_model_forward_captures(version):
    """list-in-loop: the forward itself appends `hidden_states + residual`; later variants hand the accumulator to
    the layer; packer variants build an AuxHiddenStatePacker; packer+layer-boundary layers take no residual (it
    lives in the batch's residual stream) -- what the plugin's adapter detection reads
    (sglang/installed/internals.py)."""
    root = _source(version)
    r = sr.release(version)
    fwd, src = find_def(root, f"{DSV2}.DeepseekV2Model.forward")
    text = ast.get_source_segment(src, fwd)
    appends_in_loop = "aux_hidden_states.append(hidden_states + residual)" in text
    assert appends_in_loop == (r.variant == LOOP)
    assert ("captured_last_layer_outputs=" in text) == (r.variant != LOOP)
    assert ("AuxHiddenStatePacker(" in text) == (r.variant in (PACKER, BOUNDARY))
    layer, lsrc = find_def(root, f"{DSV2}.DeepseekV2DecoderLayer.forward")
    params = [a.arg for a in layer.args.args + layer.args.kwonlyargs]
    assert ("residual" not in params) == (r.variant == BOUNDARY), params


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", [v for v in sr.KNOWN_VERSIONS if sr.release(v).variant in (PACKER, BOUNDARY)])
def test_real_packer_count_check(version):
    """The release's layers/aux_hidden_states.py loaded alone (it imports only torch): finalize() after 2 of 3
    captures raises the exception and message native_capture gives."""
    import torch

    root = _source(version)
    path = root / "sglang" / "srt" / "layers" / "aux_hidden_states.py"
    spec = importlib.util.spec_from_file_location(f"aux_hidden_states_{version.replace('.', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = mod.AuxHiddenStatePacker(3)
    for _ in range(2):
        p.append(torch.zeros(4, 8))
    expected = sr.native_capture([-1, 2, 30], L61, H, version).error
    with pytest.raises((AssertionError, RuntimeError)) as e:
        p.finalize()
    assert f"{type(e.value).__name__}: {e.value}" == expected


@pytest.mark.sglang_releases
@pytest.mark.parametrize("version", sr.KNOWN_VERSIONS)
def test_capture_only_flag_and_cuda_graph_ordering(version):
    root = _source(version)
    r = sr.release(version)
    exec_fields = root / "sglang" / "srt" / "arg_groups" / "fields" / "exec_.py"
    srv = root / "sglang" / "srt" / "server_args.py"
    text = "".join(p.read_text() for p in (exec_fields, srv) if p.is_file())
    assert ("enable_return_aux_hidden_states" in text) == r.capture_only_mode
    # CudaGraphRunner.__init__ resets the layers to the default (a call without ids) before capturing
    resets = [c for c in calls_in(root, "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.__init__",
                                  "set_eagle3_layers_to_capture") if not c.args and not c.keywords]
    assert bool(resets) == r.graphs_capture_default_layers
    if r.graphs_capture_default_layers:  # ... and ModelRunner.initialize sets the ids after init_device_graphs
        node, _ = find_def(root, "sglang.srt.model_executor.model_runner.ModelRunner.initialize")
        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
        graphs = min(c.lineno for c in calls if c.func.attr == "init_device_graphs")
        sets = [c.lineno for c in calls if c.func.attr == "set_eagle3_layers_to_capture" and c.args]
        assert sets and min(sets) > graphs


# ----------------------------------------------------------------------------------------------------------------
# the real modules, imported
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.sglang
def test_installed_0_5_23_set_eagle3_layers_to_capture_in_process():
    """SGLang 0.5.23 as installed here, imported: its real method on an object built with __new__."""
    from importlib import metadata

    assert metadata.version("sglang") == "0.5.23"
    import inspect

    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    # stock SGLang's function: when this project's plugin was loaded in this process (other tests), the registry's
    # wrapper keeps the original in __wrapped__
    stock = inspect.unwrap(DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)
    assert stock.__qualname__ == "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"

    @settings(max_examples=100)
    @given(ID_CASES, st.integers(1, 80))
    def check(ids, L):
        obj = DeepseekV2ForCausalLM.__new__(DeepseekV2ForCausalLM)
        obj.pp_group = SimpleNamespace(is_last_rank=True)
        obj.config = SimpleNamespace(num_hidden_layers=L)
        obj.model = SimpleNamespace()
        stock(obj, None if ids is None else list(ids))
        assert obj.model.layers_to_capture == sr.layers_to_capture(ids, L, "0.5.23")

    check()


PROBE_IDS = [None, [-1, 2, 30], [2, 30, 58], [1, 29, 57], [0, 3, 31], [1], [], [5, 5, 70]]
# layers_to_capture values for the forward probe (none starting with 1: on 0.5.13 no ids store that)
PROBE_FORWARD = [[0, 3, 5], [3, 5, 9], [5, 3, 5], [-1, 9], [2, 6, 7], [7]]


def _probe(version):
    root = sglang_importable(version)
    if root is None:
        pytest.skip(f"SGLang {version} {install_hint('importable', version)}")
    cases = {"set_layers": [[ids, 61] for ids in PROBE_IDS],
             "qwen_set_layers": [[ids, 61] for ids in PROBE_IDS if ids is not None],
             "forward": [[stored, 8] for stored in PROBE_FORWARD] if sr.release(version).variant == LOOP else []}
    env = {**os.environ, "PYTHONPATH": str(root), "TORCHDYNAMO_DISABLE": "1"}
    p = subprocess.run([sys.executable, os.path.join(HERE, "sglang_release_probe.py")], input=json.dumps(cases),
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["version"] == version and out["file"].startswith(str(root)), out
    return out


@pytest.mark.sglang_releases
@pytest.mark.sglang
@pytest.mark.parametrize("version", IMPORT_PROBED)
def test_imported_release_against_the_model(version):
    """The release imported for real in a subprocess: set_eagle3_layers_to_capture of DeepseekV2 and Qwen2-MoE,
    and on list-in-loop releases DeepseekV2Model.forward itself (what it captures, in which order, and the
    TypeError at layer input 0)."""
    out = _probe(version)
    for ids, got in zip(PROBE_IDS, out["set_layers"]):
        assert got == sr.layers_to_capture(ids, 61, version), (ids, got)
    for ids, got in zip([i for i in PROBE_IDS if i is not None], out["qwen_set_layers"]):
        nc = sr.native_capture(ids, 61, 8, version, sr.FAMILY_QWEN_MOE, cuda_graphs=False)
        if "error" in got:
            assert got["error"].startswith("IndexError") and nc.error.startswith("IndexError"), (ids, got)
        else:
            assert tuple(got["flagged"]) == nc.captured_inputs, (ids, got)
    for stored, got in zip(PROBE_FORWARD, out["forward"]):
        # the model from layer-input indices: the ids that store `stored` on this release
        ids = [v - 1 for v in stored] if sr.release(version).id_rule == ALWAYS else stored
        nc = sr.native_capture(ids, 8, 4, version, cuda_graphs=False)
        assert list(nc.stored) == stored
        if "error" in got:
            assert nc.error is not None and nc.error.startswith(got["error"]), (stored, got, nc.error)
        else:
            assert got["captured"] == list(nc.captured_inputs), (stored, got)
            if not got["captured"]:
                assert nc.error.startswith("no aux hidden states captured")
    if sr.release(version).variant == LOOP:
        assert any("error" in g for g in out["forward"])  # [0, ...] really raised
