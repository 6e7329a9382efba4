"""The doctor's model of SGLang 0.5.23's speculative flag handling, on its own and against SGLang's own functions
(`_handle_eagle_family` for the flags, `organize_draft_results` for the draft-tree size) where SGLang is installed."""
import importlib.util
import types

import pytest
from hypothesis import given, settings, strategies as st

from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.sglang_model.flag_rules import parallel_findings, resolve_speculative, speculative_findings
from eagle3_capture.doctor.sglang_model.server_args import parse_server_args
from eagle3_capture.spec import TapSpec


def codes(findings, severity=None):
    return {f.code for f in findings if severity is None or f.severity == severity}


# ----------------------------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------------------------

def test_parse_values_equals_bools_and_unknown_flags():
    f = parse_server_args("python -m sglang.launch_server --model-path /m --tp 8 --speculative-algorithm EAGLE3 "
                          "--speculative-num-steps=3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
                          "--enable-two-batch-overlap --mem-fraction-static 0.8 --trust-remote-code --page-size 1")
    assert (f.speculative_num_steps, f.speculative_eagle_topk, f.speculative_num_draft_tokens) == (3, 1, 4)
    assert f.tp_size == 8 and f.model_path == "/m" and f.page_size == 1
    assert f.enable_two_batch_overlap and f.speculative_algorithm == "EAGLE3"
    assert "--mem-fraction-static" in f.ignored and "--trust-remote-code" in f.ignored


def test_parse_dp_attention_spellings():
    assert parse_server_args("--attn-dp-size 4").attention_dp == 4
    assert parse_server_args("--dp-size 8 --enable-dp-attention").attention_dp == 8
    assert parse_server_args("--dp-size 8").attention_dp == 1
    assert parse_server_args("").attention_dp == 1


@pytest.mark.parametrize("text, needle", [
    ("--speculative-num-steps three", "expects an integer, got 'three'"),
    ("--speculative-num-steps", "needs a value"),
    ("--page-size 1.5", "expects an integer"),
    ("--enable-two-batch-overlap=maybe", "takes no value"),
    ("--speculative-algorithm 'EAGLE3", "cannot split"),
])
def test_parse_bad_values_are_clear_errors(text, needle):
    with pytest.raises(DoctorError, match=needle):
        parse_server_args(text)


# ----------------------------------------------------------------------------------------------------------------
# resolution, as read from SGLang 0.5.23
# ----------------------------------------------------------------------------------------------------------------

def flags(steps=None, topk=None, draft=None, **kw):
    parts = ["--speculative-algorithm EAGLE3"]
    for name, v in (("num-steps", steps), ("eagle-topk", topk), ("num-draft-tokens", draft)):
        if v is not None:
            parts.append(f"--speculative-{name} {v}")
    for k, v in kw.items():
        parts.append(f"--{k.replace('_', '-')} {v}")
    return parse_server_args(" ".join(parts))


def test_topk1_forces_draft_tokens_the_real_trap():
    r, fs = speculative_findings(flags(1, 1, 16), "DeepseekV3ForCausalLM")
    assert (r.steps, r.topk, r.draft_tokens) == (1, 1, 2)
    assert "draft-tokens-capped" in codes(fs, "error")
    capped = next(f for f in fs if f.code == "draft-tokens-capped")
    assert "16" in capped.message and "2" in capped.message and "--speculative-num-steps 15" in capped.fix


def test_auto_values_per_architecture():
    assert (resolve_speculative(flags(), "DeepseekV3ForCausalLM").steps, ) == (3,)
    r = resolve_speculative(flags(), "DeepseekV3ForCausalLM")
    assert (r.steps, r.topk, r.draft_tokens, r.auto) == (3, 1, 4, True)
    r = resolve_speculative(flags(), "LlamaForCausalLM")
    assert (r.steps, r.topk, r.draft_tokens) == (5, 4, 8)
    r = resolve_speculative(flags(), "Qwen3MoeForCausalLM")
    assert (r.steps, r.topk, r.draft_tokens) == (3, 1, 4)


def test_crashes_are_errors_with_fixes():
    for fl, exc in ((flags(3), "TypeError"), (flags(None, 1), "AssertionError"), (flags(None, None, 4), "AssertionError"),
                    (flags(3, 4, 8, page_size=16, attention_backend="flashmla"), "ValueError")):
        r, fs = speculative_findings(fl, "DeepseekV3ForCausalLM")
        assert r.error.startswith(exc), r.error
        crash = [f for f in fs if f.code == "speculative-flags-crash"]
        assert crash and crash[0].severity == "error" and crash[0].fix


def test_tree_capacity_and_other_warnings():
    r, fs = speculative_findings(flags(2, 4, 64), "DeepseekV3ForCausalLM")
    assert r.tree_capacity == 4 + 1 * 16
    assert "draft-tree-too-small" in codes(fs, "error")
    _, fs = speculative_findings(flags(2, 4, 21), "DeepseekV3ForCausalLM")
    assert "draft-tree-too-small" not in codes(fs)
    _, fs = speculative_findings(flags(1, 1, 2), "DeepseekV3ForCausalLM")
    assert codes(fs) == {"single-step-chain"}
    _, fs = speculative_findings(flags(3, 1, 4), "DeepseekV3ForCausalLM")
    assert codes(fs) == set()
    _, fs = speculative_findings(parse_server_args("--speculative-algorithm EAGLE --speculative-num-steps 3 "
                                                   "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"))
    assert "wrong-algorithm" in codes(fs, "error")
    _, fs = speculative_findings(parse_server_args("--tp 8"))
    assert "no-speculative-algorithm" in codes(fs, "warning")


def test_parallel_flags_name_the_lost_taps():
    spec = TapSpec.from_draft_ids([-1, 2, 30], 61, 7168)
    fs = parallel_findings(parse_server_args("--enable-two-batch-overlap"), spec, first_k_dense_replace=3)
    tbo = [f for f in fs if f.code == "tbo-drops-taps"]
    assert tbo and tbo[0].severity == "error" and "LayerOutput(30)" in tbo[0].message
    # layer inputs [0, 3, 31]: only the embedding's (0) is below first_k_dense_replace = 3
    assert "captured 1 of 3" in tbo[0].message and "LayerOutput(2)" in tbo[0].message
    # taps all in the dense layers: nothing lost
    early = TapSpec.from_draft_ids([-1, 0, 1], 61, 7168)
    assert not parallel_findings(parse_server_args("--enable-two-batch-overlap"), early, first_k_dense_replace=3)
    fs = parallel_findings(parse_server_args("--pp-size 2"), spec, 3)
    assert "pp-drops-taps" in codes(fs, "error")
    fb = TapSpec.from_draft_ids([-1, 2, 60], 61, 7168)
    fs = parallel_findings(parse_server_args("--attn-dp-size 8"), fb, 3)
    assert "dp-attention-final-boundary" in codes(fs, "error") and "dp-attention" in codes(fs, "warning")
    fs = parallel_findings(parse_server_args("--attn-dp-size 8"), spec, 3)
    assert codes(fs) == {"dp-attention"}


# ----------------------------------------------------------------------------------------------------------------
# against SGLang 0.5.23's own functions (marked `sglang`: these need it installed)
# ----------------------------------------------------------------------------------------------------------------

def _sglang_available():
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("sglang.srt") is not None


def sglang_resolve(fl, architecture):
    """SGLang's own `_handle_eagle_family` on the same flags: (steps, topk, draft) or the exception type name.

    ServerArgs is built with device="cpu" (then the function runs on a CPU-only machine); the model
    config it reads for the architecture is supplied through the record's memo, which `model_config_of` hands back
    when no build key is recorded. page_size is given explicitly (the post-process pass that defaults it to 1 on
    this platform does not run here)."""
    from sglang.srt.arg_groups import speculative_hook as sh
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import ServerArgs

    kw = dict(model_path="dummy", device="cpu", speculative_algorithm=fl.speculative_algorithm,
              speculative_num_steps=fl.speculative_num_steps, speculative_eagle_topk=fl.speculative_eagle_topk,
              speculative_num_draft_tokens=fl.speculative_num_draft_tokens,
              page_size=fl.page_size if fl.page_size is not None else 1)
    if fl.attention_backend is not None:
        kw["attention_backend"] = fl.attention_backend
    sa = ServerArgs(**kw)
    sa._model_config = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=[architecture]))
    try:
        sh._handle_eagle_family(sa)
    except (AssertionError, TypeError, ValueError) as e:
        return type(e).__name__
    v = resolved_view(sa)
    return (v.speculative_num_steps, v.speculative_eagle_topk, v.speculative_num_draft_tokens)


def doctor_resolve(fl, architecture):
    r = resolve_speculative(fl, architecture)
    if r.error:
        return r.error.split(" ")[0].split(":")[0]
    return (r.steps, r.topk, r.draft_tokens)


CASES = [
    (flags(1, 1, 16), "DeepseekV3ForCausalLM"), (flags(), "DeepseekV3ForCausalLM"), (flags(), "LlamaForCausalLM"),
    (flags(), "Grok1ForCausalLM"), (flags(), "Qwen3MoeForCausalLM"), (flags(3, 1, 4), "DeepseekV3ForCausalLM"),
    (flags(5, 4, 8), "LlamaForCausalLM"), (flags(3), "DeepseekV3ForCausalLM"), (flags(None, 1), "LlamaForCausalLM"),
    (flags(None, None, 4), "DeepseekV3ForCausalLM"), (flags(5, 8, 64), "DeepseekV3ForCausalLM"),
    (flags(2, 4, 3), "DeepseekV3ForCausalLM"), (flags(5, 1, 3), "DeepseekV3ForCausalLM"),
    (flags(0, 1, 1), "DeepseekV3ForCausalLM"), (flags(3, 1), "DeepseekV3ForCausalLM"),
    (flags(3, 4, 8, page_size=16, attention_backend="flashmla"), "DeepseekV3ForCausalLM"),
    (flags(3, 4, 8, page_size=16, attention_backend="triton"), "DeepseekV3ForCausalLM"),
    (flags(3, 1, 8, page_size=64, attention_backend="flashmla"), "DeepseekV3ForCausalLM"),
]


@pytest.mark.sglang
@pytest.mark.parametrize("fl, arch", CASES, ids=[f"{c[0].raw.replace('--speculative-', '')[19:]}|{c[1][:8]}"
                                                   for c in CASES])
def test_verdicts_match_sglangs_own_function(fl, arch):
    assert _sglang_available(), "this test is marked `sglang`: install sglang==0.5.23 (make test does)"
    assert doctor_resolve(fl, arch) == sglang_resolve(fl, arch)


@pytest.mark.sglang
@settings(max_examples=40, deadline=None)
@given(steps=st.one_of(st.none(), st.integers(0, 6)), topk=st.one_of(st.none(), st.integers(1, 6)),
       draft=st.one_of(st.none(), st.integers(1, 40)), page=st.sampled_from([1, 16]),
       backend=st.sampled_from([None, "triton", "flashmla", "fa3"]),
       arch=st.sampled_from(["DeepseekV3ForCausalLM", "LlamaForCausalLM", "KimiK25ForConditionalGeneration"]))
def test_random_flags_match_sglang(steps, topk, draft, page, backend, arch):
    assert _sglang_available(), "this test is marked `sglang`: install sglang==0.5.23 (make test does)"
    extra = {"page_size": page}
    if backend:
        extra["attention_backend"] = backend
    fl = flags(steps, topk, draft, **extra)
    assert doctor_resolve(fl, arch) == sglang_resolve(fl, arch)


@pytest.mark.sglang
@pytest.mark.parametrize("steps, topk", [(1, 2), (2, 2), (3, 4), (5, 8)])
def test_tree_capacity_matches_organize_draft_results(steps, topk):
    """The draft-tree rule against SGLang's own organize_draft_results: torch.topk fails exactly when
    num_draft_tokens - 1 exceeds the doctor's capacity."""
    assert _sglang_available(), "this test is marked `sglang`: install sglang==0.5.23 (make test does)"
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results

    b = 2
    score_list = [torch.rand(b, 1, topk)] + [torch.rand(b, topk, topk) for _ in range(steps - 1)]
    token_list = [torch.randint(0, 100, (b, topk))] + [torch.randint(0, 100, (b, topk * topk))
                                                       for _ in range(steps - 1)]
    parents_list = [torch.zeros(b, topk + 1, dtype=torch.long)] + [torch.zeros(b, topk, dtype=torch.long)
                                                                   for _ in range(steps - 1)]
    cap = resolve_speculative(flags(steps, topk, 4), "DeepseekV3ForCausalLM").tree_capacity
    organize_draft_results(score_list, token_list, parents_list, cap + 1)  # the largest allowed
    with pytest.raises(RuntimeError):
        organize_draft_results(score_list, token_list, parents_list, cap + 2)
    _, fs = speculative_findings(flags(steps, topk, cap + 2), "DeepseekV3ForCausalLM")
    assert "draft-tree-too-small" in codes(fs, "error")
    _, fs = speculative_findings(flags(steps, topk, cap + 1), "DeepseekV3ForCausalLM")
    assert "draft-tree-too-small" not in codes(fs)
