"""Partly random targets are refused: transformers fills the weights a checkpoint lacks (or holds in another shape)
with random values and only logs a report, so a checkpoint missing a layer, one with a weight of another shape or
weights of another model, and a draft directory given as the target, end in exit 2 naming those weights -- in
dump-reference, accept and online alike, before any reference or prediction is computed. A target config with
num_hidden_layers 0 is refused too."""
import json
import os

import pytest
import torch

from doctor_helpers import assert_clean_error, cli, demo_fast, target_variant, write_json


def _variant(root, name, state=None, config=None):
    """A copy of the demo's target directory with its weights and/or config changed."""
    return target_variant(demo_fast()[1], os.path.join(root, name), state, config)


VARIANTS = {
    "missing_layer": (lambda st: {k: v for k, v in st.items() if ".layers.3." not in k}, None,
                      ["missing", "random values", "model.layers.3.* (16)"]),
    "missing_norm": (lambda st: {k: v for k, v in st.items() if k != "model.norm.weight"}, None,
                     ["1 missing", "model.norm.weight"]),
    "other_shape": (lambda st: {**st, "model.norm.weight": torch.ones(7)}, None,
                    ["of another shape", "model.norm.weight (7,) in the checkpoint, (64,) in the model"]),
    "unexpected": (lambda st: {**st, "model.extra.weight": torch.zeros(3)}, None,
                   ["1 unexpected", "model.extra.weight"]),
    "no_layers": (None, lambda c: c.update(num_hidden_layers=0), ["num_hidden_layers 0", "at least one decoder layer"]),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("targets"))
    out = {name: (_variant(root, name, st, cfg), needles) for name, (st, cfg, needles) in VARIANTS.items()}
    res, demo = demo_fast()
    out["draft_as_target"] = (os.path.join(demo, "draft"),
                              ["missing", "unexpected", "midlayer.* (10)", "an EAGLE-3 draft checkpoint, not a target"])
    prompts = write_json(os.path.join(root, "p.json"), [[5, 6, 7, 8, 9]])
    return out, prompts, os.path.join(demo, "draft"), root


def _one_line(code, out, err, *needles):
    assert_clean_error(code, out, err, *needles)
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


@pytest.mark.parametrize("name", sorted(VARIANTS) + ["draft_as_target"])
def test_dump_reference_accept_and_online_refuse_partly_random_targets(targets, name, tmp_path):
    variants, prompts, draft, root = targets
    path, needles = variants[name]
    ref = tmp_path / "ref.safetensors"
    _one_line(*cli("doctor", "dump-reference", "--model", path, "--prompts", prompts, "--out", ref, "--threads", 1),
              *needles)
    assert not ref.exists()
    _one_line(*cli("doctor", "accept", "--target", path, "--draft", draft, "--prompts", prompts, "--new-tokens", 4,
                   "--no-progress", "--threads", 1), *needles)
    rec = tmp_path / "r.jsonl"
    rec.write_text(json.dumps({"input_ids": [5, 6, 7, 8, 9], "output_ids": [1, 2, 3, 4], "meta_info": {
        "completion_tokens": 4, "spec_verify_ct": 1, "spec_correct_drafts_histogram": [0, 0, 1]}}) + "\n")
    _one_line(*cli("doctor", "online", "--server", rec, "--target", path, "--draft", draft, "--prompts", prompts,
                   "--no-progress", "--threads", 1, "--server-args", "--speculative-algorithm EAGLE3 "
                   "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"), *needles)


def test_the_demo_target_itself_loads(targets):
    """The refusal is not of everything: the demo's own saved target loads with nothing missing."""
    from eagle3_capture.doctor.target_side.model import load_target

    res, demo = demo_fast()
    t = load_target(os.path.join(demo, "target"), quiet=True)
    assert t.num_layers == 8
