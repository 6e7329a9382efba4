"""doctor check: declared taps in every convention, stock SGLang 0.5.23's capture, the plugin's, every config
inconsistency and flag trap with a fix, exit code 1 on an error finding, 2 on a bad input (never a traceback)."""
import json
import os

import pytest

from eagle3_capture.spec import LayerOutput
from doctor_helpers import DSV3_61, KIMI, assert_clean_error, cli, cli_subprocess, draft_config, write_json
from eagle3_capture.sglang_releases import catalogue as release_catalogue  # where assumed_release looks the version up
from eagle3_capture.doctor.deployment.run import CheckRequest
from eagle3_capture.doctor.deployment.run import run_check as run_request


def run_check(*args, **kwargs):
    """doctor check's run on a request spelled as the command's flags' fields (CheckRequest's order)."""
    return run_request(CheckRequest(*args, **kwargs))


@pytest.fixture(autouse=True)
def installed_sglang_0523(monkeypatch):
    """The default release is the installed SGLang's: pin it, so that these tests do not depend on this machine."""
    monkeypatch.setattr(release_catalogue, "installed_sglang_version", lambda: "0.5.23")


def codes(rep, severity="error"):
    return {f.code for f in rep.findings if f.severity == severity}


def test_the_real_case_config_on_stock_sglang(tmp_path):
    """Kimi-K2.5 (61 layers, DeepseekV2 family) with a SpecForge draft [-1, 2, 30]: stock SGLang stores the ids
    unchanged (the +1 rule needs ids[0] == 1), drops -1 and fails 'captured 2 of 3'."""
    d = write_json(tmp_path / "draft.json", draft_config([-1, 2, 30], fc_norm=True))
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d)
    assert code == 1, out + err
    assert "[Embedding, LayerOutput(2), LayerOutput(30)]" in out
    assert "draft ids (SpecForge)        [-1, 2, 30]" in out and "[0, 3, 31]" in out
    assert "layers_to_capture [-1, 2, 30]" in out and "captured 2 of 3" in out
    assert "with the eagle3-capture plugin: captures [Embedding, LayerOutput(2), LayerOutput(30)]" in out
    rep = run_check(KIMI, d)
    assert {"plus-one-rule", "sglang-dropped-tap", "sglang-capture-error", "sglang-missing-embedding"} <= codes(rep)
    assert all(f.fix for f in rep.findings if f.severity == "error")
    # the fix names the ids stock SGLang would need
    assert any("[0, 3, 31]" in f.fix for f in rep.findings if f.code == "plus-one-rule")
    # with the plugin, stock SGLang's capture problems are not errors
    rep = run_check(KIMI, d, with_plugin=True)
    assert not codes(rep)


def test_with_plugin_flag_on_the_cli(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([-1, 2, 30]))
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--with-plugin")
    assert code == 0, out + err
    assert "[info] plus-one-rule" in out and "not with the plugin" in out


def test_ids_that_stock_sglang_captures_right_exit_0(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([1, 29, 57]))  # ids[0] == 1: SGLang adds 1 to all
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", d, "--server-args",
                         "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
                         "--speculative-num-draft-tokens 4")
    assert code == 0, out + err
    assert "findings: none" in out or "0 error(s)" in out


def test_final_boundary_and_out_of_range(tmp_path):
    d = write_json(tmp_path / "fb.json", draft_config([-1, 2, 60]))
    rep = run_check(KIMI, d)
    assert "sglang-final-boundary-dropped" in codes(rep) or "sglang-dropped-tap" in codes(rep)
    assert rep.plugin_taps[-1].k == 60  # the plugin captures it (from the final norm)
    d = write_json(tmp_path / "oor.json", draft_config([-1, 2, 61]))
    rep = run_check(KIMI, d)
    assert "declared-taps-invalid" in codes(rep)
    assert any("out of range" in f.message for f in rep.findings)


def test_fc_norm_with_norm_before_fc_and_hf_indices_hint(tmp_path):
    d = write_json(tmp_path / "d.json", draft_config([-1, 2, 30], fc_norm=True,
                                                     eagle_config={"eagle_aux_hidden_state_layer_ids": [-1, 2, 30],
                                                                   "norm_before_fc": True}))
    rep = run_check(KIMI, d)
    assert "fc-norm-and-norm-before-fc" in codes(rep)
    d = write_json(tmp_path / "hf.json", draft_config([0, 3, 31]))
    rep = run_check(KIMI, d)
    assert "maybe-hf-indices" in codes(rep, "warning")


def test_fc_in_features_of_the_checkpoint(tmp_path):
    """A draft directory: its fc.weight (header only) against K*H of the config."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(tmp_path / "draft")
    write_json(tmp_path / "draft" / "config.json", draft_config([-1, 2, 30], hidden=64))
    save_file({"fc.weight": torch.zeros(64, 2 * 64)}, str(tmp_path / "draft" / "model.safetensors"))
    t = write_json(tmp_path / "t.json", {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 64,
                                         "architectures": ["DeepseekV3ForCausalLM"]})
    rep = run_check(t, str(tmp_path / "draft"))
    f = [f for f in rep.findings if f.code == "fc-in-features"]
    assert f and "trained on 2 taps" in f[0].message


def test_server_args_traps_in_check():
    d = os.path.join(os.path.dirname(KIMI), "draft_eagle_config_ids.json")
    rep = run_check(KIMI, d, "--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-eagle-topk 1 "
                             "--speculative-num-draft-tokens 16 --enable-two-batch-overlap --pp-size 2")
    assert {"draft-tokens-capped", "tbo-drops-taps", "pp-drops-taps"} <= codes(rep)
    assert (rep.speculative.steps, rep.speculative.draft_tokens) == (1, 2)
    rep = run_check(KIMI, d, "--speculative-algorithm EAGLE3 --speculative-num-steps 3", with_plugin=True)
    assert codes(rep) == {"speculative-flags-crash"}


def test_json_report(tmp_path):
    d = os.path.join(os.path.dirname(KIMI), "draft_eagle_config_ids.json")
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--json",
                         tmp_path / "r.json")
    j = json.load(open(tmp_path / "r.json"))
    assert j["declared"]["taps"] == ["Embedding", "LayerOutput(2)", "LayerOutput(30)"]
    assert j["sglang"]["native"]["stored"] == [-1, 2, 30] and j["sglang"]["adapter"] == "packer+layer-boundary"
    assert any(f["code"] == "plus-one-rule" for f in j["findings"])


# ----------------------------------------------------------------------------------------------------------------
# SGLang releases (--sglang-version) and vLLM (--engine vllm)
# ----------------------------------------------------------------------------------------------------------------

def test_the_seeds_server_on_0_5_12(tmp_path):
    """SGLang 0.5.12 adds 1 to every id: [2, 30, 58] becomes layer inputs [3, 31, 59], the SpecForge-HF taps;
    from 0.5.13 on the same ids capture one layer earlier."""
    d = write_json(tmp_path / "draft.json", draft_config([2, 30, 58]))
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--sglang-version", "0.5.12",
                         "--json", tmp_path / "r.json")
    assert code == 0, out + err
    assert "SGLang release modelled: 0.5.12 (given): id rule \"+1 on every id\"" in out
    assert "models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture" in out
    assert ("stock SGLang 0.5.12 (deepseek_v2): layers_to_capture [3, 31, 59] -> captures [LayerOutput(2), "
            "LayerOutput(30), LayerOutput(58)]") in out
    assert "0.5.11 .. 0.5.12.post1 (modelled above)" in out
    assert ("0.5.13 .. 0.5.23: layers_to_capture [2, 30, 58] -> captures [LayerOutput(1), LayerOutput(29), "
            "LayerOutput(57)]") in out
    assert "forwards replayed from CUDA graphs" in out  # 0.5.8 .. 0.5.10.post1
    assert "capture-only mode (--enable-return-aux-hidden-states): not in SGLang 0.5.12 (from 0.5.23 on)" in out
    assert "adapter list-in-loop on SGLang 0.5.12" in out
    j = json.load(open(tmp_path / "r.json"))
    assert j["sglang"]["release"] == "0.5.12" and j["sglang"]["adapter"] == "list-in-loop"
    assert j["sglang"]["native"]["stored"] == [3, 31, 59] and j["sglang"]["native"]["error"] is None
    spans = {tuple(x["releases"][:1] + x["releases"][-1:]): x for x in j["sglang"]["other_releases"]}
    assert spans[("0.5.13", "0.5.23")]["stored"] == [2, 30, 58]
    # the same draft on the newest release: one layer off
    rep = run_check(KIMI, d, sglang_version="0.5.23")
    assert "sglang-shifted-tap" in codes(rep) and "plus-one-rule" in codes(rep)
    assert any(f.code == "sglang-other-releases" and "0.5.11 .. 0.5.12.post1" in f.message
               for f in rep.findings)


def test_cuda_graphs_hold_the_default_layers_on_0_5_10(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([2, 30, 58]))
    rep = run_check(KIMI, d, sglang_version="0.5.10")
    assert rep.native.graph is not None and rep.native.graph.stored == (2, 30, 58)
    assert "sglang-graph-shifted-tap" in codes(rep)
    assert any("--disable-cuda-graph" in f.fix for f in rep.findings if f.code == "sglang-graph-shifted-tap")
    for flag in ("--disable-cuda-graph", "--disable_cuda_graph"):
        rep = run_check(KIMI, d, f"--tp-size 8 {flag}", sglang_version="0.5.10")
        assert rep.native.graph is None and not [c for c in codes(rep) if c.startswith("sglang-")]


def test_embedding_on_list_in_loop_releases_crashes(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([-1, 2, 30]))
    rep = run_check(KIMI, d, sglang_version="0.5.12")
    err = [f for f in rep.findings if f.code == "sglang-capture-error"]
    assert err and "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'" in err[0].message
    # 0.5.13 keeps -1 (dropped) and still cannot capture the embedding: no ids help
    rep = run_check(KIMI, d, sglang_version="0.5.13")
    assert rep.native.error.startswith("2 of 3 aux hidden states captured")
    for r in (run_check(KIMI, d, sglang_version="0.5.12"), rep):
        assert all("no id list captures it" in f.fix and "TypeError" in f.fix for f in r.errors
                   if f.code.startswith(("sglang-", "plus")))
    rep = run_check(KIMI, d, sglang_version="0.5.12")
    assert any(f.code == "plus-one-rule" and "adds 1 to every draft id" in f.message for f in rep.findings)
    # on 0.5.14 stock SGLang can capture the embedding: [0, 3, 31]
    rep = run_check(KIMI, d, sglang_version="0.5.14")
    assert any("[0, 3, 31]" in f.fix for f in rep.findings if f.code == "plus-one-rule")
    assert rep.native.error.startswith("2 of 3 aux hidden states captured")


def test_default_release_installed_or_newest(tmp_path, monkeypatch):
    d = write_json(tmp_path / "draft.json", draft_config([1, 29, 57]))
    monkeypatch.setattr(release_catalogue, "installed_sglang_version", lambda: None)
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", d)
    assert "SGLang release modelled: 0.5.23 (no SGLang installed here: the newest modelled)" in out
    monkeypatch.setattr(release_catalogue, "installed_sglang_version", lambda: "0.5.14")
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", d)
    assert code == 0 and "SGLang release modelled: 0.5.14 (installed here)" in out
    monkeypatch.setattr(release_catalogue, "installed_sglang_version", lambda: "0.6.1")
    rep = run_check(DSV3_61, d)
    assert rep.release.version == "0.5.23"
    assert any(f.code == "sglang-release-assumed" and "0.6.1" in f.message for f in rep.findings)


def test_with_plugin_needs_the_plugin_registry(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([-1, 2, 30]))
    rep = run_check(KIMI, d, sglang_version="0.5.10", with_plugin=True)
    assert "plugin-unavailable" in codes(rep) and rep.plugin_taps is None
    assert "sglang-capture-error" in codes(rep)  # stock capture stays an error: the plugin cannot serve it
    rep = run_check(KIMI, d, sglang_version="0.5.11", with_plugin=True)
    assert not codes(rep) and "adapter list-in-loop" in rep.plugin_note


def test_capture_only_mode_lines(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([1, 29, 57]))
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", d, "--sglang-version",
                         "0.5.23")
    assert code == 0, out + err
    assert ("--return-aux-hidden-state-layer-ids 1 29 57 (the draft's ids) captures [LayerOutput(1), "
            "LayerOutput(29), LayerOutput(57)]") in out
    assert ("the trained taps [LayerOutput(1), LayerOutput(29), LayerOutput(57)]: --return-aux-hidden-state-layer-ids "
            "2 30 58") in out
    # LayerOutput(0) first: layer input 1 is shifted to 2 by the model's own rule, in this mode too
    d = write_json(tmp_path / "d0.json", draft_config([0, 29, 57]))
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", d, "--sglang-version",
                         "0.5.23")
    assert "the trained taps [LayerOutput(0), LayerOutput(29), LayerOutput(57)]: no ids capture them" in out
    assert "(the draft's ids) captures [Embedding, LayerOutput(28), LayerOutput(56)]" in out


def test_specforge_reading_is_its_pinned_sglang(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([2, 30, 58]))
    rep = run_check(KIMI, d, sglang_version="0.5.12")
    w = [f for f in rep.findings if f.code == "ids-convention-unknown"]
    assert w and "specforge 0.2.0 pins sglang 0.5.14" in w[0].message
    assert "LayerOutput(1), LayerOutput(29), LayerOutput(57)" in w[0].message


def test_vllm_nested_ids_fall_back_silently(tmp_path):
    d = write_json(tmp_path / "draft.json", draft_config([-1, 2, 30]))
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--engine", "vllm",
                         "--json", tmp_path / "r.json")
    assert code == 1, out + err
    assert "vLLM release modelled: 0.34.0" in out and "ignores eagle_config.eagle_aux_hidden_state_layer_ids" in out
    assert "[error] vllm-nested-ids-ignored" in out and "stock SGLang" not in out
    j = json.load(open(tmp_path / "r.json"))
    assert j["engine"] == "vllm" and j["sglang"] is None
    assert j["vllm"]["ids"] is None and j["vllm"]["stored"] == [2, 30, 58]
    # 0.33 still has the V1 runner, which reads the nested key
    rep = run_check(KIMI, d, engine="vllm", vllm_version="0.33.0")
    assert rep.vllm_alternative is not None and rep.vllm_alternative.reading.key.startswith("eagle_config")
    assert "vllm-runner-dependent" in codes(rep, "info")


def test_vllm_top_level_layer_inputs_capture_the_trained_taps(tmp_path):
    # trained on LayerOutput(2, 30, 58) (SpecForge-HF ids in eagle_config); vLLM reads layer inputs at the top level
    d = write_json(tmp_path / "draft.json", draft_config([2, 30, 58], eagle_aux_hidden_state_layer_ids=[3, 31, 59]))
    rep = run_check(KIMI, d, engine="vllm")
    assert rep.vllm.captured_taps == (LayerOutput(2), LayerOutput(30), LayerOutput(58))
    assert not [f for f in rep.findings if f.code.startswith("vllm-") and f.severity == "error"]


def test_vllm_undeclared_top_level_ids_read_as_the_vllm_plugin_serves_them(tmp_path):
    """Top-level ids without a convention (speculators' way): vLLM's meaning, layer inputs, for the doctor as for
    stock vLLM and the vLLM plugin (eagle3_capture/vllm/declaration.py); 61 = the final boundary."""
    d = write_json(tmp_path / "draft.json", draft_config(None, eagle_aux_hidden_state_layer_ids=[2, 31, 61]))
    rep = run_check(KIMI, d, engine="vllm", vllm_version="0.33.0")
    want = (LayerOutput(1), LayerOutput(30), LayerOutput(60))
    assert rep.declared.taps == want and rep.vllm.captured_taps == want and tuple(rep.plugin_taps) == want
    assert not codes(rep) and "vllm-ids-read-as-layer-inputs" in codes(rep, "info")
    assert "vLLM plugin on vLLM 0.33.0" in rep.plugin_note
    # declared draft ids: read as declared, by the doctor and the plugin alike
    d = write_json(tmp_path / "declared.json", draft_config(None, eagle_aux_hidden_state_layer_ids=[-1, 30, 60]))
    cfg = json.load(open(d))
    cfg["eagle_config"] = {"eagle_aux_hidden_state_convention": "draft_ids"}
    d = write_json(tmp_path / "declared.json", cfg)
    rep = run_check(KIMI, d, engine="vllm", vllm_version="0.33.0")
    assert rep.declared.taps[1:] == (LayerOutput(30), LayerOutput(60)) and rep.plugin_taps == list(rep.declared.taps)
    assert "vllm-ids-read-as-layer-inputs" not in codes(rep, "info")


def test_vllm_undeclared_ids_that_read_two_ways_are_a_warning(tmp_path):
    # SpecForge's nested draft ids and the same numbers at the top level, no convention: vLLM serves layer inputs
    d = write_json(tmp_path / "draft.json", draft_config([2, 30, 58], eagle_aux_hidden_state_layer_ids=[2, 30, 58]))
    rep = run_check(KIMI, d, engine="vllm")
    w = [f for f in rep.findings if f.code == "vllm-ids-ambiguous"]
    assert w and w[0].severity == "warning", rep.findings
    assert "LayerOutput(1), LayerOutput(29), LayerOutput(57)" in w[0].message
    assert "LayerOutput(2), LayerOutput(30), LayerOutput(58)" in w[0].message
    # the minus-one id undeclared: refused by the plugin, invalid for the doctor (never silently served)
    d = write_json(tmp_path / "minus.json", draft_config(None, eagle_aux_hidden_state_layer_ids=[-1, 30, 60]))
    rep = run_check(KIMI, d, engine="vllm")
    assert rep.plugin_taps is None and "refuses this draft at load" in rep.plugin_note
    assert "declared-taps-invalid" in codes(rep)


# ----------------------------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, needles", [
    (["--sglang-version", "0.5.7"], ["--sglang-version", "older than", "0.5.8 .. 0.5.23"]),
    (["--sglang-version", "0.5.24"], ["--sglang-version", "newer than"]),
    (["--sglang-version", "latest"], ["--sglang-version", "expected an SGLang release version"]),
    (["--sglang-version", "0.5.12.post3"], ["not a release on the registry"]),
    (["--engine", "trtllm"], ["--engine", "expected one of sglang, vllm, got 'trtllm'"]),
    (["--engine", "vllm", "--vllm-version", "0.1"], ["--vllm-version", "not modelled"]),
    (["--engine", "vllm", "--with-plugin"], ["--with-plugin is about SGLang"]),
    (["--engine", "vllm", "--sglang-version", "0.5.12"], ["--sglang-version is about SGLang"]),
    (["--engine", "vllm", "--server-args", "--tp-size 8"], ["--server-args is about SGLang"]),
    (["--vllm-version", "0.33.0"], ["--vllm-version goes with --engine vllm"]),
])
def test_bad_release_and_engine_flags(extra, needles):
    d = os.path.join(CFG, "draft_eagle_config_ids.json")
    code, out, err = cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, *extra)
    assert_clean_error(code, out, err, *needles)
    assert len(err.strip().splitlines()) == 1, err



CFG = os.path.dirname(KIMI)


@pytest.mark.parametrize("target, draft, needles", [
    ("missing.json", "draft_eagle_config_ids.json", ["no such file"]),
    ("target_deepseek_v3_61.json", "missing.json", ["no such file"]),
    ("target_malformed.json", "draft_eagle_config_ids.json", ["malformed JSON"]),
    ("target_missing_layers.json", "draft_eagle_config_ids.json", ["missing", "num_hidden_layers"]),
    ("target_deepseek_v3_61.json", "draft_malformed.json", ["malformed JSON"]),
    ("target_deepseek_v3_61.json", "draft_missing_hidden.json", ["hidden_size"]),
    ("target_deepseek_v3_61.json", "draft_bad_convention.json", ["eagle_aux_hidden_state_convention"]),
])
def test_bad_configs(target, draft, needles):
    assert_clean_error(*cli("doctor", "check", "--target-config", os.path.join(CFG, target), "--draft-config",
                            os.path.join(CFG, draft)), *needles)


def test_bad_flag_values_and_half_a_fingerprint(tmp_path):
    d = os.path.join(CFG, "draft_eagle_config_ids.json")
    assert_clean_error(*cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--server-args",
                            "--speculative-eagle-topk one"), "expects an integer")
    assert_clean_error(*cli("doctor", "check", "--target-config", KIMI, "--draft-config", d, "--reference",
                            tmp_path / "r.safetensors"), "go together")


def test_no_traceback_in_a_fresh_process(tmp_path):
    code, out, err = cli_subprocess("doctor", "check", "--target-config", tmp_path / "nothing.json",
                                    "--draft-config", tmp_path / "nothing.json")
    assert_clean_error(code, out, err, "no such file")
    code, out, err = cli_subprocess("doctor", "check", "--target-config", KIMI)  # argparse: missing option
    assert code == 2 and "Traceback" not in err and "--draft-config" in err
    code, out, err = cli_subprocess("doctor", "check", "--target-config", KIMI, "--draft-config",
                                    os.path.join(CFG, "draft_eagle_config_ids.json"), "--sglang-version", "0.5")
    assert_clean_error(code, out, err, "--sglang-version")


def test_check_loads_no_torch(tmp_path):
    """`doctor check` without --reference reads configs and flags only: it never imports torch (the doctor's
    package docstring promises it), in a fresh interpreter; its exit code is the usual one."""
    import subprocess
    import sys

    d = str(write_json(tmp_path / "draft.json", draft_config([-1, 2, 30])))
    script = ("import sys\nfrom eagle3_capture.cli import main\n"
              f"code = main(['doctor', 'check', '--target-config', {KIMI!r}, '--draft-config', {d!r}, "
              "'--server-args', '--speculative-algorithm EAGLE3 --tp 8'])\n"
              "print('torch' in sys.modules, code)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "False 1", p.stdout[-500:]
