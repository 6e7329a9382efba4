"""sglang_releases/: every SGLang release 0.5.8 - 0.5.23 as modelled: the pure tests of the model (the facts the
report gives, the brief's cases, properties over random ids) and of what the project does with each release (the
plugin's range, the CPU machine, the test matrix, the doctor's serving model). The model against each release's real
code is test_sglang_releases_code.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture import sglang_releases as sr
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapError, TapSpec
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


def test_what_the_project_does_with_each_release():
    """The plugin serves 0.5.12 on (one run of consecutive releases); the releases that cannot run on the CPU machine
    say why in one line and are none the plugin serves; the matrix runs only releases the plugin serves that run
    here, one of each adapter besides the environment's; the doctor's serving model was read in 0.5.23."""
    served = [r.version for r in sr.RELEASES if r.plugin_supported]
    assert served == list(sr.KNOWN_VERSIONS[sr.KNOWN_VERSIONS.index("0.5.12"):]) == list(sr.supported())
    assert sr.SUPPORTED_RANGE == "0.5.12 through 0.5.23"
    blocked = {r.version: r.cpu_blocker for r in sr.RELEASES if r.cpu_blocker is not None}
    assert set(blocked) == {"0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1"}
    assert all("\n" not in why and "sgl_kernel" in why for why in blocked.values())
    matrix = sr.matrix("smoke") + sr.matrix("model")
    assert matrix == ("0.5.12", "0.5.16", "0.5.20", "0.5.21")
    assert all(sr.release(v).plugin_supported and sr.release(v).cpu_blocker is None for v in matrix)
    assert len({sr.release(v).variant for v in matrix}) == len(matrix)
    # with make test's release (the newest), every adapter the plugin has
    assert {sr.release(v).variant for v in matrix} | {sr.release(sr.supported()[-1]).variant} == \
        {sr.release(v).variant for v in sr.supported()}
    with pytest.raises(ValueError, match="expected one of smoke, model"):
        sr.matrix("all")
    assert sr.serving_model_release().version == "0.5.23"
    assert [r.version for r in sr.RELEASES if r.serving_model] == ["0.5.23"]
    assert {r.ids_key for r in sr.RELEASES} == {sr.IDS_KEY_EAGLE_CONFIG}


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
    code = ("import sys; import eagle3_capture.sglang_releases, eagle3_capture.vllm_rules, eagle3_capture.release_table; "
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
