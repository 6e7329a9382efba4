"""doctor check: declared taps in every convention, stock SGLang 0.5.23's capture, the plugin's, every config
inconsistency and flag trap with a fix, exit code 1 on an error finding, 2 on a bad input (never a traceback)."""
import json
import os

import pytest

from doctor_helpers import DSV3_61, KIMI, assert_clean_error, cli, cli_subprocess, draft_config, write_json
from eagle3_capture.doctor.deployment.check import run_check


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
    assert j["sglang_0523_native"]["stored"] == [-1, 2, 30]
    assert any(f["code"] == "plus-one-rule" for f in j["findings"])


# ----------------------------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------------------------

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
