"""doctor accept (offline acceptance through the project's draft fc op) and doctor dump-reference, on the demo's
pair; the metric formulas on hand-made data; bad inputs."""
import json
import os
import shutil

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast, write_json
from eagle3_capture.doctor.replay.metrics import metrics
from eagle3_capture.doctor.sglang_model.serving import chain_accepted


# ----------------------------------------------------------------------------------------------------------------
# the formulas
# ----------------------------------------------------------------------------------------------------------------

def test_metrics_by_hand():
    c = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 1, 1], [1, 1, 0]], dtype=torch.bool)
    m = metrics(c)
    assert m.teacher_forced == [0.75, 0.75, 0.75]
    assert m.conditional_support == [4, 3, 2]
    assert m.conditional == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    # tau = 1 + a1 + a1*a2 + a1*a2*a3
    assert m.tau(3) == pytest.approx(1 + 0.75 + 0.5 + 0.25)
    assert m.tau(1) == pytest.approx(1.75) and m.tau(0) == 1.0
    # ... which is the mean accepted length of the chain
    for n in (1, 2, 3):
        assert m.tau(n) == pytest.approx(1 + chain_accepted(c, n).float().mean().item())


@pytest.fixture(scope="module")
def demo():
    return demo_fast()


@pytest.fixture(scope="module")
def small_prompts(demo, tmp_path_factory):
    res, out = demo
    prompts = json.load(open(os.path.join(out, "prompts.json")))[:12]
    return write_json(str(tmp_path_factory.mktemp("acc") / "prompts.json"), prompts)


def test_draft_fc_through_the_op_equals_plain_torch(demo):
    """The draft's fc in doctor accept runs through ops.draft_fc; it must equal the plain-torch fc it was trained
    with."""
    from eagle3_capture.doctor.draft.checkpoint import load_draft

    res, out = demo
    d = load_draft(os.path.join(out, "draft"))
    x = torch.randn(5, 7, 3 * d.arch.target_hidden_size, generator=torch.Generator().manual_seed(0)) * 10
    torch.testing.assert_close(d.project(x, use_op=True), d.project(x, use_op=False), rtol=2e-5, atol=2e-5)


def test_accept_on_the_demo_pair(demo, small_prompts, tmp_path):
    res, out = demo
    code, text, err = cli("doctor", "accept", "--target", "demo", "--draft", os.path.join(out, "draft"),
                          "--prompts", small_prompts, "--server-args",
                          "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
                          "--speculative-num-draft-tokens 4", "--new-tokens", 12, "--json", tmp_path / "a.json",
                          "--tensors", tmp_path / "a.safetensors", "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 0, text + err
    j = json.load(open(tmp_path / "a.json"))
    m = j["metrics"]
    assert j["server"]["num_steps"] == 3 and m["steps"] == 3 and m["anchors"] == 12 * 13
    assert j["tau"] == pytest.approx(m["tau_by_chain_length"]["3"])
    assert m["teacher_forced"][0] > 0.4  # a trained draft on its own target
    assert "served accept length" in text and "tau" in text and "teacher-forced" in text
    # the served figure: SGLang's walk, per prompt and in total, in meta_info's terms
    sv = j["served"]
    assert sv["max_new_tokens"] == 12 and len(sv["per_prompt"]) == 12
    assert sv["completion_tokens"] == 12 * 12 == sum(p["completion_tokens"] for p in sv["per_prompt"])
    assert sv["verify_ct"] == sum(p["verify_ct"] for p in sv["per_prompt"]) == sum(sv["correct_drafts_histogram"])
    assert sv["served_accept_length"] == pytest.approx(sv["completion_tokens"] / sv["verify_ct"], abs=1e-6)
    for p in sv["per_prompt"]:
        assert len(p["correct_drafts_histogram"]) <= 4 and sum(p["correct_drafts_histogram"]) == p["verify_ct"]
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "a.safetensors"))
    assert t["correct"].shape == (12 * 13, 3)
    assert 1 + t["accepted"].float().mean().item() == pytest.approx(j["tau"], abs=1e-5)

    # the same draft fed the miswired taps, predicted through --taps: clearly lower
    code, text2, err = cli("doctor", "accept", "--target", "demo", "--draft", os.path.join(out, "draft"),
                           "--prompts", small_prompts, "--taps", "layer_inputs:1,4,7", "--new-tokens", 12,
                           "--json", tmp_path / "b.json", "--no-progress", "--device", "cpu")
    assert code == 0, err
    jb = json.load(open(tmp_path / "b.json"))
    assert jb["taps"] == ["LayerOutput(0)", "LayerOutput(3)", "LayerOutput(6)"]
    assert jb["metrics"]["teacher_forced"][0] < m["teacher_forced"][0] - 0.05

    # the saved transformers checkpoint of the target gives the same numbers as the built-in one
    code, text3, err = cli("doctor", "accept", "--target", os.path.join(out, "target"), "--draft",
                           os.path.join(out, "draft"), "--prompts", small_prompts, "--new-tokens", 12,
                           "--json", tmp_path / "c.json", "--no-progress", "--device", "cpu")
    assert code == 0, err
    jc = json.load(open(tmp_path / "c.json"))
    assert jc["metrics"]["teacher_forced"] == pytest.approx(m["teacher_forced"], abs=1e-6)
    # no flags: SGLang's auto values for a DeepseekV3 target (3, 1, 4)
    assert (jc["server"]["num_steps"], jc["server"]["num_draft_tokens"]) == (3, 4)


def test_dump_reference_pre_and_post_norm(demo, small_prompts, tmp_path):
    """The reference holds HF's stack (last entry post-norm) plus the pre-norm final boundary; the final norm
    applied to final_prenorm gives HF's last entry, and hidden_states[0] is the embedding lookup."""
    from safetensors.torch import load_file

    from eagle3_capture.doctor.target_side.model import build_demo_target

    res, out = demo
    code, text, err = cli("doctor", "dump-reference", "--model", os.path.join(out, "target"), "--prompts",
                          small_prompts, "--out", tmp_path / "ref.safetensors", "--device", "cpu")
    assert code == 0, err
    t = load_file(str(tmp_path / "ref.safetensors"))
    hs, pre, ids = t["hidden_states"], t["final_prenorm"], t["input_ids"]
    assert hs.shape[0] == 9 and hs.shape[1] == ids.numel() == 12 * 32 and t["prompt_offsets"][-1] == ids.numel()
    model = build_demo_target(0)
    with torch.no_grad():
        torch.testing.assert_close(hs[0], model.model.embed_tokens(ids))
        torch.testing.assert_close(model.model.norm(pre), hs[8], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(pre, hs[8])
    # and it fingerprints the demo's captures of the first prompts, declared taps read from the demo's configs
    code, text, err = cli("doctor", "fingerprint", "--reference", tmp_path / "ref.safetensors", "--captured",
                          os.path.join(out, "captured_correct.safetensors"), "--draft-config",
                          os.path.join(out, "draft"), "--target-config", os.path.join(out, "target"))
    assert code == 0, text + err
    assert "draft config" in text and "MISMATCH" not in text
    code, text, err = cli("doctor", "fingerprint", "--reference", tmp_path / "ref.safetensors", "--captured",
                          os.path.join(out, "captured_miswired.safetensors"), "--draft-config",
                          os.path.join(out, "draft"), "--target-config", os.path.join(out, "target"))
    assert code == 1 and "fingerprint-missing-embedding" in text
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", tmp_path / "ref.safetensors", "--captured",
                            os.path.join(out, "captured_correct.safetensors"), "--draft-config",
                            os.path.join(out, "draft")), "needs --target-config")


# ----------------------------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------------------------

def test_accept_bad_inputs(demo, small_prompts, tmp_path):
    res, out = demo
    draft = os.path.join(out, "draft")
    base = ("doctor", "accept", "--target", "demo", "--no-progress", "--device", "cpu")
    assert_clean_error(*cli(*base, "--draft", tmp_path / "nodraft", "--prompts", small_prompts), "no such file")
    empty = tmp_path / "emptydraft"
    os.makedirs(empty)
    shutil.copy(os.path.join(draft, "config.json"), empty / "config.json")
    assert_clean_error(*cli(*base, "--draft", empty, "--prompts", small_prompts), "no *.safetensors")
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", tmp_path / "none.json"), "no such file")
    p = write_json(tmp_path / "oov.json", [[1, 2, 999]])
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", p), "token id 999", "vocabulary")
    p = write_json(tmp_path / "text.json", ["hello world"])
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", p), "no tokenizer")
    (tmp_path / "bad.json").write_text("[[1, 2,")
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", tmp_path / "bad.json"), "malformed JSON")
    p = write_json(tmp_path / "obj.json", {"a": 1})
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", p), "expected a JSON list")
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", small_prompts, "--taps", "draft_ids:-1,3"),
                       "K=3", "K=2")
    assert_clean_error(*cli(*base, "--draft", draft, "--prompts", small_prompts, "--new-tokens", 1), "--new-tokens")
    assert_clean_error(*cli("doctor", "accept", "--target", tmp_path / "notarget", "--draft", draft, "--prompts",
                            small_prompts, "--device", "cpu"), "no such file")
    # a checkpoint whose fc does not fit its config
    wrong = tmp_path / "wrongfc"
    shutil.copytree(draft, wrong)
    cfg = json.load(open(wrong / "config.json"))
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 3]
    write_json(wrong / "config.json", cfg)
    assert_clean_error(*cli(*base, "--draft", wrong, "--prompts", small_prompts), "in_features")
    # a draft architecture this command does not run, and an MLA one without its MLA sizes
    other = tmp_path / "other"
    shutil.copytree(draft, other)
    cfg = json.load(open(other / "config.json"))
    cfg["architectures"] = ["MistralForCausalLMEagle3"]
    write_json(other / "config.json", cfg)
    assert_clean_error(*cli(*base, "--draft", other, "--prompts", small_prompts), "not supported offline")
    cfg["architectures"] = ["Eagle3DeepseekV2ForCausalLM"]
    write_json(other / "config.json", cfg)
    assert_clean_error(*cli(*base, "--draft", other, "--prompts", small_prompts), "needs q_lora_rank")
    if not torch.cuda.is_available():
        assert_clean_error(*cli("doctor", "accept", "--target", "demo", "--draft", draft, "--prompts", small_prompts,
                                "--device", "cuda"), "no CUDA device")


def test_dump_reference_bad_inputs(tmp_path):
    p = write_json(tmp_path / "p.json", [[3, 4, 5]])
    assert_clean_error(*cli("doctor", "dump-reference", "--model", tmp_path / "nomodel", "--prompts", p, "--out",
                            tmp_path / "r.safetensors", "--device", "cpu"), "no such file")
    os.makedirs(tmp_path / "notamodel")
    write_json(tmp_path / "notamodel" / "config.json", {"model_type": "nonexistent_arch_xyz"})
    assert_clean_error(*cli("doctor", "dump-reference", "--model", tmp_path / "notamodel", "--prompts", p, "--out",
                            tmp_path / "r.safetensors", "--device", "cpu"), "could not load")
    (tmp_path / "empty.txt").write_text("\n\n")
    assert_clean_error(*cli("doctor", "dump-reference", "--model", "demo", "--prompts", tmp_path / "empty.txt",
                            "--out", tmp_path / "r.safetensors", "--device", "cpu"), "no prompts")


@pytest.mark.parametrize("sub", ["check", "fingerprint", "dump-reference", "accept", "online", "demo", "watch"])
def test_every_subcommand_has_help(sub):
    code, out, err = cli("doctor", sub, "--help")
    assert code == 0 and "usage: eagle3-capture doctor " + sub in out


def test_top_level_commands_kept():
    code, out, err = cli("--help")
    assert code == 0 and all(c in out for c in ("info", "selfcheck", "doctor"))


def test_load_draft_reads_what_the_index_names_and_refuses_raw_fp8(demo, tmp_path):
    """The draft the doctor runs: a shard index decides which files are read (a stale file beside it is not), and
    an fp8 tensor other than the fc (which load_draft_fc dequantizes) is refused instead of cast raw."""
    from safetensors.torch import load_file, save_file

    from eagle3_capture.doctor.common import DoctorError
    from eagle3_capture.doctor.draft.checkpoint import load_draft

    res, out = demo
    src = os.path.join(out, "draft")
    t = load_file(os.path.join(src, "model.safetensors"))
    d = tmp_path / "sharded"
    os.makedirs(d)
    shutil.copy(os.path.join(src, "config.json"), d / "config.json")
    names = sorted(t)
    half = len(names) // 2
    save_file({k: t[k] for k in names[:half]}, str(d / "a.safetensors"))
    save_file({k: t[k] for k in names[half:]}, str(d / "b.safetensors"))
    write_json(d / "model.safetensors.index.json",
               {"weight_map": {k: ("a.safetensors" if i < half else "b.safetensors") for i, k in enumerate(names)}})
    stale = {k: torch.zeros_like(v) for k, v in t.items() if k.startswith("midlayer.")}
    save_file(stale, str(d / "stale-old.safetensors"))  # not in the index: must not overwrite the real weights
    a, b = load_draft(src), load_draft(str(d))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    q = tmp_path / "fp8"
    os.makedirs(q)
    shutil.copy(os.path.join(src, "config.json"), q / "config.json")
    t8 = dict(t)
    k8 = next(k for k in names if k.startswith("midlayer.") and k.endswith("weight") and t[k].dim() == 2)
    t8[k8] = t[k8].to(torch.float8_e4m3fn)
    save_file(t8, str(q / "model.safetensors"))
    with pytest.raises(DoctorError, match=f"{k8} is torch.float8_e4m3fn.*dequantizes only the fc"):
        load_draft(str(q))
