"""vLLM 0.32.0's real serving loop on the CPU (offline ``vllm.LLM``: EngineCore and the CPU worker with Model Runner
V1, EAGLE-3 with 3 speculative tokens, greedy) serving the tiny DeepseekV3 pair of vllm_pair.py, with this project's
plugin loaded by vLLM's own ``load_general_plugins()`` from the installed entry point, and without it
(``EAGLE3_CAPTURE_DISABLE=all``).

What is compared: the served tokens (against each other and against the target's own greedy continuation in
transformers), vLLM's per-position acceptance counters (``vllm:spec_decode_num_accepted_tokens_per_pos``), and the
aux hidden states the target's forward hands the draft (recorded by a plain forward hook in the worker, see
serve_llm.py) against a float64 forward of the same target in transformers.
"""
from __future__ import annotations

import pytest
import torch

from vllm_fixtures import K, MAX_TOKENS, PROMPTS, STOCK, pair, serve  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

INTERIOR_TAPS_STOCK_IDS = [1, 2, 4]
OBSERVE = 4  # target forwards recorded: every prompt's prefill is among the first few (the engine admits them in one
#              or two steps)  # [LayerOutput(0), LayerOutput(1), LayerOutput(3)] as vLLM layer inputs


def stock_interior(pair):
    """Stock vLLM with the interior draft's taps written in its own convention: top-level layer-input ids."""
    return serve(pair, "stock_interior", pair.variant("draft_interior", "interior_stock_ids",
                                                      top=INTERIOR_TAPS_STOCK_IDS), env=STOCK, observe=OBSERVE)


def plugin_interior(pair):
    """The plugin with the draft as trained: nested draft ids [0, 1, 3], convention declared (V1 reads nested)."""
    return serve(pair, "plugin_interior", pair.draft("draft_interior"), observe=OBSERVE)


def plugin_embedding(pair):
    """The plugin with the embedding draft as trained: draft ids [-1, 1, 2], convention declared."""
    return serve(pair, "plugin_embedding", pair.draft("draft_embedding"), observe=OBSERVE)


# ----------------------------------------------------------------------------------------------------------------
# references
# ----------------------------------------------------------------------------------------------------------------

_ref = {}


def reference(pair, dtype=torch.float64):
    """The target in transformers: greedy continuations (float32, the served dtype) and the residual stream of the
    prompts (``dtype``): [B, P, L+1, H], index 0 the Embedding, k+1 LayerOutput(k)."""
    if dtype in _ref:
        return _ref[dtype]
    from transformers import AutoModelForCausalLM

    from eagle3_capture.doctor.target_side.model import greedy_continue, residual_stream

    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    prompts = torch.tensor(pair.prompts())
    greedy = greedy_continue(model, prompts, MAX_TOKENS)[:, prompts.shape[1]:]
    if dtype != torch.float32:
        # torch's grouped_mm (transformers' default MoE path) has no float64 kernel on the CPU
        model.set_experts_implementation("eager")
    stack = residual_stream(model.to(dtype), prompts)[0]
    _ref[dtype] = (greedy.tolist(), stack)
    return _ref[dtype]


def captured_prefill(run, pair):
    """The aux hidden states the target handed the draft for every prompt's prefill, found by the prompt's tokens and
    positions in the observed forwards (vllm_observer.prefill_rows): [PROMPTS, P, K, H]."""
    from vllm_observer import prefill_rows

    out = []
    for i, prompt in enumerate(pair.prompts()):
        rows = prefill_rows(run.result["observed"], prompt)
        assert rows is not None, f"{run.name}: prompt {i}'s prefill is in none of the observed forwards"
        out.append(torch.tensor(rows).transpose(0, 1))  # [P, K, H]
    return torch.stack(out)


def assert_taps(run, pair, cols):
    """Each captured slot equals the reference tap it declares (float32 against float64), and is farther from every
    other residual-stream tap than from its own."""
    _, stack = reference(pair)
    got = captured_prefill(run, pair).double()
    assert got.shape[2] == len(cols)
    scale = stack.abs().amax()
    for slot, col in enumerate(cols):
        err = (got[:, :, slot] - stack[:, :, col]).abs().amax() / scale
        assert err < 1e-4, f"{run.name}: slot {slot} differs from residual-stream index {col} by {err:.2e}"
        for other in range(stack.shape[2]):
            if other != col:
                far = (got[:, :, slot] - stack[:, :, other]).abs().amax() / scale
                assert far > 100 * err, f"{run.name}: slot {slot} is as close to index {other} as to {col}"


# ----------------------------------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------------------------------

def test_plugin_equals_stock_outputs_and_acceptance(pair):
    stock, plugin = stock_interior(pair), plugin_interior(pair)
    assert stock.ok, stock.log[-3000:]
    assert plugin.ok, plugin.log[-3000:]
    greedy, _ = reference(pair)
    assert stock.result["outputs"] == greedy, "stock vLLM's output differs from the target's greedy continuation"
    assert plugin.result["outputs"] == stock.result["outputs"]
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"):
        assert plugin.metric(name) == stock.metric(name), name
    assert len(plugin.accepted_per_pos) == K and plugin.accepted_per_pos[0] > 0, plugin.accepted_per_pos
    # the startup line: release, adapter, taps in every convention, what stock would store
    line = plugin.lines("eagle3_capture: vLLM 0.32.0")
    assert len(line) == 1, plugin.log[-3000:]
    assert ("adapter aux-list" in line[0] and "draft ids [0, 1, 3]" in line[0]
            and "aux_hidden_state_layers [1, 2, 4]" in line[0] and "stock vLLM stores [0, 1, 3]" in line[0]), line[0]
    assert not stock.lines("eagle3_capture: vLLM 0.32.0")


def test_captured_states_equal_the_declared_taps(pair):
    stock, plugin = stock_interior(pair), plugin_interior(pair)
    assert stock.ok and plugin.ok
    assert torch.equal(captured_prefill(plugin, pair), captured_prefill(stock, pair))
    assert_taps(plugin, pair, [1, 2, 4])  # the final boundary (index L = 4) included


def test_embedding_served_where_stock_crashes(pair):
    emb = plugin_embedding(pair)
    assert emb.ok, emb.log[-3000:]
    greedy, _ = reference(pair)
    assert emb.result["outputs"] == greedy
    assert_taps(emb, pair, [0, 2, 3])
    assert emb.accepted_per_pos[0] > 0, emb.accepted_per_pos
    line = emb.lines("eagle3_capture: vLLM 0.32.0")
    assert len(line) == 1 and "draft ids [-1, 1, 2]" in line[0] and "the embedding taken before the first layer" \
        in line[0], emb.log[-3000:]
    stock = serve(pair, "stock_embedding", pair.variant("draft_embedding", "embedding_stock_ids", top=[0, 2, 3]),
                  env=STOCK)
    assert not stock.ok
    assert stock.lines("unsupported operand type(s) for +: 'Tensor' and 'NoneType'"), stock.log[-3000:]


def test_undeclared_minus_one_refused_at_load_in_one_line(pair):
    run = serve(pair, "minus_one", pair.variant("draft_embedding", "minus_one_top_level", top=[-1, 1, 2]))
    assert not run.ok
    refusals = [ln for ln in run.lines("eagle3_capture: refusing to serve on vLLM 0.32.0") if "RuntimeError" in ln]
    assert refusals, run.log[-3000:]
    assert "eagle_config.eagle_aux_hidden_state_convention = \"draft_ids\"" in refusals[0], refusals[0]


CHAIN_FLAGS = (f"--speculative-algorithm EAGLE3 --speculative-num-steps {K} --speculative-eagle-topk 1 "
               f"--speculative-num-draft-tokens {K + 1}")  # vLLM's chain of K speculative tokens, in SGLang's flags


# What the served chain does after its first draft token is not what the doctor's replay (SGLang's chain) does: on the
# OpenAI server with the embedding draft vLLM counted drafts 94, accepted per position [44, 27, 23] where the replay
# predicts 97 and [44, 24, 24] (same prompts and flags). The first position, which depends only on the captured taps
# and the token, agrees; steps 2..k do not, for a reason not found yet: vLLM's proposer (v1/spec_decode/eagle.py)
# doing something the replay of SGLang's chain does not, or float32 near-ties of the draft's later steps.
CHAIN_GAP = ("vLLM's draft steps 2..k differ from the doctor's replay (cause not found yet): position 0 agrees, later "
             "positions and the verify count do not")


def _predicted(pair, tmp_path, which):
    import json

    from vllm_fixtures import doctor

    from eagle3_capture.doctor.vllm_model import predicted_counters

    out = tmp_path / "accept.json"
    proc = doctor("accept", "--target", pair.target, "--draft", pair.draft(f"draft_{which}"), "--prompts",
                  pair.prompts_file(), "--server-args", CHAIN_FLAGS, "--new-tokens", MAX_TOKENS, "--json", out,
                  "--no-progress", "--device", "cpu", "--threads", 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return predicted_counters(json.loads(out.read_text())["served"]["correct_drafts_histogram"], K)


def _measured(run):
    from eagle3_capture.doctor.vllm_model import SpecCounters

    return SpecCounters(int(run.metric("vllm:spec_decode_num_drafts")),
                        int(run.metric("vllm:spec_decode_num_draft_tokens")),
                        int(run.metric("vllm:spec_decode_num_accepted_tokens")), run.accepted_per_pos)


@pytest.mark.parametrize("which", ["interior", "embedding"])
def test_doctor_predicts_the_first_positions_acceptance(pair, tmp_path, which):
    """``doctor accept`` (the transformers target, the draft in plain torch) predicts how many verifies accept the
    first draft token -- the one step that depends only on the captured taps -- exactly."""
    run = plugin_interior(pair) if which == "interior" else plugin_embedding(pair)
    assert run.ok, run.log[-3000:]
    predicted, measured = _predicted(pair, tmp_path, which), _measured(run)
    assert measured.per_pos[0] == predicted.per_pos[0], (measured, predicted)


@pytest.mark.xfail(strict=True, reason=CHAIN_GAP)
def test_doctor_prediction_equals_served_acceptance(pair, tmp_path):
    run = plugin_embedding(pair)
    assert run.ok, run.log[-3000:]
    assert _measured(run) == _predicted(pair, tmp_path, "embedding")
