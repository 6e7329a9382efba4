"""vLLM 0.32.0's real serving loop on the CPU (offline ``vllm.LLM``: EngineCore and the CPU worker with Model Runner
V1, EAGLE-3 with 3 speculative tokens, greedy) serving the tiny DeepseekV3 pair of vllm_pair.py, with this project's
plugin loaded by vLLM's own ``load_general_plugins()`` from the installed entry point, and without it
(``EAGLE3_CAPTURE_DISABLE=all``).

What is compared: the served tokens (against each other and against the target's own greedy continuation in
transformers), vLLM's speculative-decoding counters (verifies, draft tokens, accepted tokens, accepted per position:
``vllm:spec_decode_*``) against each other and against ``doctor accept``'s prediction, and the aux hidden states the
target's forward hands the draft (recorded by a plain forward hook in the worker, see serve_llm.py) against a float64
forward of the same target in transformers.
"""
from __future__ import annotations

import pytest
import torch

from vllm_fixtures import K, STOCK, pair, predicted, reference, serve  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

INTERIOR_TAPS_STOCK_IDS = [1, 2, 4]  # [LayerOutput(0), LayerOutput(1), LayerOutput(3)] as vLLM layer inputs
OBSERVE = 4  # target forwards recorded: every prompt's prefill is among the first few (the engine admits them in one
#              or two steps)


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


@pytest.mark.parametrize("which", ["interior", "embedding"])
def test_doctor_prediction_equals_served_acceptance(pair, which):
    """``doctor accept`` (the target in transformers, the draft in plain torch, vLLM's chain of K speculative tokens
    modelled) predicts vLLM's own counters exactly: verifies, draft tokens, accepted tokens, accepted per position."""
    run = plugin_interior(pair) if which == "interior" else plugin_embedding(pair)
    assert run.ok, run.log[-3000:]
    assert run.counters == predicted(pair, f"draft_{which}")
