"""sglang_releases/: every SGLang release 0.5.8 - 0.5.23 as modelled, and the model against each release's real
code.

Three levels of evidence:
- pure tests of the model (the facts the report gives, the brief's cases, properties over random ids);
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
from eagle3_capture import sglang_rules
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapError, TapSpec
from release_code import calls_in, exec_def, find_def, has_path
from sglang_release_dirs import IMPORT_PROBED, install_hint, sglang_importable, sglang_source
from tap_strategies import H, L61, codes, specs

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------------------------------
# the table (the facts the report and docs/sglang_releases.md give)
# ----------------------------------------------------------------------------------------------------------------

ALWAYS, IF_FIRST = sr.ID_RULE_PLUS_ONE_ALWAYS, sr.ID_RULE_PLUS_ONE_IF_FIRST_IS_1
LOOP, INTO, PACKER, BOUNDARY = sr.VARIANTS

# version: (torch, transformers, id rule, variant, capture-only, plugin registry), as read in the wheels
FACTS = {
    "0.5.8": ("2.9.1", "4.57.1", ALWAYS, LOOP, False, False),
    "0.5.8.post1": ("2.9.1", "4.57.1", ALWAYS, LOOP, False, False),
    "0.5.9": ("2.9.1", "4.57.1", ALWAYS, LOOP, False, False),
    "0.5.10": ("2.9.1", "5.3.0", ALWAYS, LOOP, False, False),
    "0.5.10.post1": ("2.9.1", "5.3.0", ALWAYS, LOOP, False, False),
    "0.5.11": ("2.11.0", "5.6.0", ALWAYS, LOOP, False, True),
    "0.5.12": ("2.11.0", "5.6.0", ALWAYS, LOOP, False, True),
    "0.5.12.post1": ("2.11.0", "5.6.0", ALWAYS, LOOP, False, True),
    "0.5.13": ("2.11.0", "5.8.1", IF_FIRST, LOOP, False, True),
    "0.5.13.post1": ("2.11.0", "5.8.1", IF_FIRST, LOOP, False, True),
    "0.5.14": ("2.11.0", "5.8.1", IF_FIRST, INTO, False, True),
    "0.5.15": ("2.11.0", "5.12.1", IF_FIRST, INTO, False, True),
    "0.5.15.post1": ("2.11.0", "5.12.1", IF_FIRST, INTO, False, True),
    "0.5.16": ("2.11.0", "5.12.1", IF_FIRST, INTO, False, True),
    "0.5.17": ("2.11.0", "5.12.1", IF_FIRST, PACKER, False, True),
    "0.5.18": ("2.13.0", "5.12.1", IF_FIRST, PACKER, False, True),
    "0.5.19": ("2.13.0", "5.12.1", IF_FIRST, PACKER, False, True),
    "0.5.20": ("2.13.0", "5.12.1", IF_FIRST, PACKER, False, True),
    "0.5.21": ("2.13.0", "5.12.1", IF_FIRST, BOUNDARY, False, True),
    "0.5.22": ("2.14.1", "5.19.0", IF_FIRST, BOUNDARY, False, True),
    "0.5.23": ("2.14.1", "5.19.0", IF_FIRST, BOUNDARY, True, True),
}


def test_every_release_from_0_5_8_to_0_5_23_in_order():
    assert sr.KNOWN_VERSIONS == tuple(FACTS) and (sr.OLDEST, sr.NEWEST) == ("0.5.8", "0.5.23")
    assert [r.version for r in sr.RELEASES] == list(FACTS)


@pytest.mark.parametrize("version", list(FACTS))
def test_release_facts(version):
    r = sr.release(version)
    assert (r.torch_pin, r.transformers_pin, r.id_rule, r.variant, r.capture_only_mode, r.plugin_registry) == \
        FACTS[version]
    graphs_default = version in ("0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1")
    assert r.graphs_capture_default_layers == graphs_default
    assert r.eagle_worker_v1 == (version in sr.KNOWN_VERSIONS[:sr.KNOWN_VERSIONS.index("0.5.13")])
    check = {LOOP: sr.COUNT_CHECK_NONE, INTO: sr.COUNT_CHECK_NONE}.get(r.variant)
    if check is None:
        check = sr.COUNT_CHECK_ASSERT if version in ("0.5.17", "0.5.18", "0.5.19") else sr.COUNT_CHECK_RAISE
    assert r.count_check == check
    # a citation names the release it was read in, the file and the function
    assert r.cite("id-rule").endswith(("DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
                                       f"set_eagle3_layers_to_capture (same in {version})"))


@pytest.mark.parametrize("text, needle", [
    ("0.5.7", "older than the releases modelled here (0.5.8 .. 0.5.23)"),
    ("0.5.24", "newer than the releases modelled here (0.5.8 .. 0.5.23)"),
    ("0.6.0", "newer than"),
    ("0.5.9.post1", "not a release on the registry"),
    ("0.5.12.post2", "not a release on the registry"),
    ("abc", "expected an SGLang release version like 0.5.12 or 0.5.12.post1"),
    ("0.5", "expected an SGLang release version"),
    ("0.5.12rc1", "expected an SGLang release version"),
    ("", "expected an SGLang release version"),
])
def test_release_rejects_with_one_line(text, needle):
    with pytest.raises(ValueError) as e:
        sr.release(text)
    assert needle in str(e.value) and "\n" not in str(e.value) and "0.5.8 .. 0.5.23" in str(e.value)


def test_release_accepts_its_record_and_spaces():
    r = sr.release("0.5.12")
    assert sr.release(r) is r and sr.release(" 0.5.12 ") is r


def test_assumed_release_given_installed_or_newest():
    assert sr.assumed_release("0.5.14")[:2] == (sr.release("0.5.14"), "given")
    assert sr.assumed_release(None, installed="0.5.20")[:2] == (sr.release("0.5.20"), "installed here")
    r, why, warn = sr.assumed_release(None, installed="0.5.20+cu130")
    assert r.version == "0.5.20" and why == "installed here as 0.5.20+cu130" and warn is None
    r, why, warn = sr.assumed_release(None, installed=None)
    assert r.version == sr.NEWEST and "no SGLang installed here" in why and warn is None
    r, why, warn = sr.assumed_release(None, installed="0.5.24")
    assert r.version == sr.NEWEST and "0.5.24 is not modelled" in why and "--sglang-version" in warn
    with pytest.raises(ValueError, match="older than"):
        sr.assumed_release("0.5.6")


def test_installed_version_is_read_without_importing_sglang():
    code = ("import sys; from eagle3_capture.sglang_releases import installed_sglang_version as v; "
            "x = v(); assert 'sglang' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); print(x)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(HERE), "python")})
    assert p.returncode == 0, p.stderr
    from importlib import metadata

    try:
        expected = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        expected = None
    assert p.stdout.strip() == str(expected)


def test_modules_stay_torch_free():
    """The release model and the vLLM model import no torch and no engine (the doctor runs them anywhere)."""
    code = ("import sys; import eagle3_capture.sglang_releases, eagle3_capture.vllm_rules, eagle3_capture.sglang_rules; "
            "bad = [m for m in ('torch', 'sglang', 'vllm') if m in sys.modules]; assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(HERE), "python")})
    assert p.returncode == 0, p.stderr


# ----------------------------------------------------------------------------------------------------------------
# the rules, per variant
# ----------------------------------------------------------------------------------------------------------------

def test_0_5_12_adds_one_to_every_id_and_crashes_on_the_embedding():
    nc = sr.native_capture([-1, 2, 30], L61, H, "0.5.12")
    assert nc.stored == (0, 3, 31) and nc.captured_inputs == () and nc.error_at == sr.ERROR_AT_FORWARD
    assert nc.error.startswith("TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'")
    # the seed's case: [2, 30, 58] -> layer inputs [3, 31, 59], i.e. LayerOutput(2, 30, 58): SpecForge-HF's meaning
    nc = sr.native_capture([2, 30, 58], L61, H, "0.5.12")
    assert nc.stored == (3, 31, 59) and nc.error is None
    assert nc.captured_taps == TapSpec.from_draft_ids([2, 30, 58], L61, H).taps
    trained = TapSpec.from_draft_ids([-1, 2, 30], L61, H)
    f = sr.check_release(trained, [-1, 2, 30], "0.5.12")
    assert codes(f) == ["capture-error"]  # nothing reaches the draft: no slot-by-slot noise
    assert "no id list captures it" in f[0].fix and "plugin" in f[0].fix


def test_0_5_13_new_rule_with_the_old_capture_loop():
    """0.5.13 / 0.5.13.post1: ids are layer inputs unless ids[0] == 1, but the capture is still the loop's
    `hidden_states + residual`: the embedding cannot be captured at all (ids [0, ...] raise)."""
    for v in ("0.5.13", "0.5.13.post1"):
        assert sr.native_capture([2, 30, 58], L61, H, v).stored == (2, 30, 58)
        nc = sr.native_capture([0, 3, 31], L61, H, v)
        assert nc.error.startswith("TypeError") and nc.captured_inputs == ()
        with pytest.raises(TapError, match="Embedding is layer-input index 0"):
            sr.ids_for(TapSpec.from_draft_ids([-1, 2, 30], L61, H), v)
        assert sr.ids_for(TapSpec.from_draft_ids([2, 30, 58], L61, H), v) == [3, 31, 59]


def test_list_into_layer_captures_the_embedding_and_has_no_count_check():
    nc = sr.native_capture([0, 3, 31], L61, H, "0.5.14")
    assert nc.captured_taps == (EMBEDDING, LayerOutput(2), LayerOutput(30)) and nc.error is None
    nc = sr.native_capture([-1, 2, 30], L61, H, "0.5.16")
    assert nc.captured_inputs == (2, 30) and nc.error_at == sr.ERROR_AT_DRAFT_FC
    assert nc.error == "2 of 3 aux hidden states captured: the draft fc receives 2*7168 = 14336 features instead " \
                       "of 21504"


@pytest.mark.parametrize("version, exc", [("0.5.17", "AssertionError"), ("0.5.19", "AssertionError"),
                                          ("0.5.20", "RuntimeError"), ("0.5.21", "RuntimeError"),
                                          ("0.5.23", "RuntimeError")])
def test_packer_count_check(version, exc):
    nc = sr.native_capture([-1, 2, 30], L61, H, version)
    assert nc.error == f"{exc}: captured 2 of 3 aux hidden states" and nc.error_at == sr.ERROR_AT_FORWARD


def test_graphs_captured_with_the_default_layers_on_0_5_8_to_0_5_10_post1():
    nc = sr.native_capture([2, 30, 58], L61, H, "0.5.10")
    assert nc.stored == (3, 31, 59) and nc.graph is not None and nc.graph.stored == (2, 30, 58)
    trained = TapSpec.from_draft_ids([2, 30, 58], L61, H)
    f = sr.compare_native_capture(trained, nc)
    assert codes(f) == ["graph-shifted-tap"] * 3 and "--disable-cuda-graph" in f[0].fix
    assert sr.native_capture([2, 30, 58], L61, H, "0.5.10", cuda_graphs=False).graph is None
    # the default ids are what the graphs hold anyway
    assert sr.native_capture([1, 29, 57], L61, H, "0.5.8").graph is None
    assert sr.native_capture([2, 30, 58], L61, H, "0.5.11").graph is None


def test_qwen_flags_accumulate_over_the_default_call_on_0_5_8_to_0_5_10_post1():
    nc = sr.native_capture([4, 9], 20, 8, "0.5.9", sr.FAMILY_QWEN_MOE)
    assert nc.stored == (5, 10) and nc.captured_inputs == (2, 5, 10, 17)  # default flags [2, 10, 17] stay set
    assert nc.error_at == sr.ERROR_AT_DRAFT_FC and nc.graph.captured_inputs == (2, 10, 17)
    assert sr.native_capture([4, 9], 20, 8, "0.5.9", sr.FAMILY_QWEN_MOE, cuda_graphs=False).captured_inputs == (5, 10)
    assert sr.native_capture([4, 9], 20, 8, "0.5.11", sr.FAMILY_QWEN_MOE).captured_inputs == (5, 10)


def test_model_support_per_release():
    assert "AttributeError" in sr.model_support_error("0.5.9", ["deepseek_v3", "kimi_k25"])
    assert sr.model_support_error("0.5.10", ["deepseek_v3", "kimi_k25"]) is None
    assert "Qwen3NextForCausalLM" in sr.model_support_error("0.5.8.post1", ["qwen3_next"])
    assert sr.model_support_error("0.5.9", ["qwen3_next"]) is None
    assert sr.model_support_error("0.5.8", ["deepseek_v3", None]) is None


def test_outlook_names_what_changes_across_releases():
    spans = sr.release_outlook([2, 30, 58], L61, H)
    assert [(s.first, s.last) for s in spans] == [("0.5.8", "0.5.10.post1"), ("0.5.11", "0.5.12.post1"),
                                                  ("0.5.13", "0.5.23")]
    assert spans[1].native.captured_inputs == (3, 31, 59) and spans[2].native.captured_inputs == (2, 30, 58)
    assert sum(len(s.versions) for s in spans) == len(sr.KNOWN_VERSIONS)
    spans = sr.release_outlook([-1, 2, 30], L61, H, model_types=["deepseek_v3", "kimi_k25"])
    assert spans[0].label() == "0.5.8 .. 0.5.9" and spans[0].native.error_at == sr.ERROR_AT_LOAD
    assert [s.label() for s in spans[1:]] == ["0.5.10 .. 0.5.10.post1", "0.5.11 .. 0.5.12.post1", "0.5.13 .. 0.5.16",
                                              "0.5.17 .. 0.5.19", "0.5.20 .. 0.5.23"]


def test_capture_only_mode_0_5_23():
    nc = sr.capture_only([1, 29, 57], L61, H, "0.5.23")
    assert nc.stored == (2, 30, 58)  # the model's own rule applies: [1, ...] is shifted
    assert sr.capture_only([0, 3, 31], L61, H, "0.5.23").captured_taps == (EMBEDDING, LayerOutput(2), LayerOutput(30))
    assert "must be non-negative" in sr.capture_only([-1, 2, 30], L61, H, "0.5.23").error
    assert "must not repeat" in sr.capture_only([3, 3], L61, H, "0.5.23").error
    assert "out of range" in sr.capture_only([3, 61], L61, H, "0.5.23").error
    assert sr.capture_only([1, 29, 60], L61, H, "0.5.23").error == "RuntimeError: captured 2 of 3 aux hidden states"
    nc = sr.capture_only([3, 60], L61, H, "0.5.23", sr.FAMILY_QWEN_MOE)  # +1: 61 is out of self.layers
    assert nc.error.startswith("IndexError")
    nc = sr.capture_only([2, 2 + 61], L61, H, "0.5.23", sr.FAMILY_QWEN_MOE)
    assert "out of range" in nc.error
    assert sr.capture_only(None, L61, H, "0.5.23").stored == (2, 30, 58)
    with pytest.raises(ValueError, match="no capture-only mode.*0.5.23"):
        sr.capture_only([0, 3], L61, H, "0.5.22")
    assert sr.capture_only_ids_for(TapSpec.from_draft_ids([-1, 2, 30], L61, H)) == [0, 3, 31]
    with pytest.raises(TapError, match="non-negative"):
        sr.capture_only_ids_for(TapSpec.from_draft_ids([-1, 2, 30], L61, H), "0.5.23", sr.FAMILY_QWEN_MOE)
    with pytest.raises(TapError, match="final boundary"):
        sr.capture_only_ids_for(TapSpec.from_draft_ids([2, 60], L61, H))


@settings(max_examples=300)
@given(specs(min_layers=2), st.sampled_from(sr.KNOWN_VERSIONS), st.sampled_from(sr.FAMILIES))
def test_ids_for_reproduces_the_spec_on_every_release(spec, version, family):
    r = sr.release(version)
    try:
        ids = sr.ids_for(spec, version, family)
    except TapError as e:
        deepseek = family == sr.FAMILY_DEEPSEEK_V2
        first = spec.taps[0]
        assert (spec.includes_final_boundary
                or (deepseek and r.variant == LOOP and first == EMBEDDING)
                or (deepseek and r.id_rule == IF_FIRST and first == LayerOutput(0))), (version, family, spec, e)
        assert f"SGLang {version}" in str(e)
        return
    nc = sr.native_capture(ids, spec.num_layers, spec.hidden_size, version, family, cuda_graphs=False)
    assert nc.captured_taps == spec.taps and nc.error is None
    assert sr.compare_native_capture(spec, nc) == []


@given(st.one_of(st.none(), st.lists(st.integers(-3, 70), max_size=6)), st.integers(1, 80),
       st.sampled_from(sr.FAMILIES))
def test_the_0523_names_are_release_0_5_23(ids, L, family):
    assert sglang_rules.sglang_0523_layers_to_capture(ids, L, family) == sr.layers_to_capture(ids, L, "0.5.23", family)
    assert sglang_rules.sglang_0523_native_capture(ids, L, 8, family) == sr.native_capture(ids, L, 8, "0.5.23", family)


@given(st.lists(st.integers(-3, 70), max_size=6), st.integers(1, 80), st.sampled_from(sr.KNOWN_VERSIONS))
def test_native_capture_invariants(ids, L, version):
    r = sr.release(version)
    nc = sr.native_capture(ids, L, 8, version, cuda_graphs=False)
    assert list(nc.stored) == ([v + 1 for v in ids] if r.id_rule == ALWAYS or (ids and ids[0] == 1) else ids)
    if r.variant == LOOP and 0 in nc.stored:
        assert nc.error.startswith("TypeError") and nc.captured_inputs == ()
        return
    assert list(nc.captured_inputs) == sorted(set(i for i in nc.stored if 0 <= i < L))
    assert len(nc.captured_inputs) + len(nc.dropped) == len(nc.stored)
    assert (nc.error is None) == (0 < len(nc.captured_inputs) == len(nc.stored))


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
