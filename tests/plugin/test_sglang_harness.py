"""The harness itself, before the plugin is involved: on the installed SGLang release (whichever of 0.5.12-0.5.23),
stock SGLang's real DeepseekV3 built and loaded by harness.py runs a prefill and a decode step on the CPU, and what
its own capture stores equals the HF model's hidden states at the layer inputs that release's own
set_eagle3_layers_to_capture chose. A fresh process without the plugin (scenarios.py stock)."""
import pytest
import torch

from scenarios import STOCK_IDS, run_script
from sglang_fixtures import harness, require_sglang  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

ATOL = 2e-5  # fp32: SGLang's MLA / MoE kernels vs HF's eager modules, measured ~3e-7


@pytest.fixture(scope="module")
def stock(harness, tmp_path_factory):
    out = tmp_path_factory.mktemp("stock") / "stock.pt"
    # SGLANG_PLUGINS names no installed plugin: SGLang's load_plugins() (if anything calls it) loads none
    run_script("stock", out, {"SGLANG_PLUGINS": "none-eagle3-capture-test", "EAGLE3_CAPTURE_DISABLE": "all"})
    return torch.load(out)


@pytest.mark.parametrize("ids", STOCK_IDS, ids=str)
def test_stock_capture_equals_hf_hidden_states(harness, stock, ids):
    rec = stock["ids"][str(ids)]
    L = stock["num_layers"]
    assert rec["layers_to_capture"] == harness.stock_layers_to_capture(ids, L)
    assert all(1 <= i < L for i in rec["layers_to_capture"]), rec["layers_to_capture"]
    H = stock["hf_hidden"][0].shape[1]
    n = len(harness.PROMPT)
    for step, (aux, rows) in enumerate(zip(rec["aux"], (slice(0, n), slice(n, n + 1)))):
        assert aux.shape == (rows.stop - rows.start, len(ids) * H), (step, aux.shape)
        for s, i in enumerate(rec["layers_to_capture"]):
            err = (aux[:, s * H:(s + 1) * H] - stock["hf_hidden"][i][rows]).abs().max().item()
            assert err <= ATOL, f"sglang {stock['sglang']}: step {step} slot {s} (layer input {i}) off by {err}"
    # and SGLang's model is HF's model: next-token logits at the last prompt token and after the decode token
    assert (rec["logits"][0] - stock["hf_logits"][n - 1]).abs().max() < 1e-4
    assert (rec["logits"][1] - stock["hf_logits"][n]).abs().max() < 1e-4


def test_stock_capture_through_sglangs_model_runner(harness, stock):
    """The same capture through SGLang's own ModelRunner.forward (harness.ServedRunner, the path every served
    forward takes: its EagerRunner from 0.5.14, forward_extend / forward_decode on 0.5.12), bit for bit the model
    forward's."""
    rec, direct = stock["served"], stock["ids"][str(STOCK_IDS[0])]
    assert rec["layers_to_capture"] == direct["layers_to_capture"]
    for got, want in zip(rec["aux"], direct["aux"]):
        assert torch.equal(got, want)


def test_stock_rules_differ_where_the_release_says(harness, stock):
    """[1, 2, 4] is shifted by every release; [2, 3, 4] only by a release whose rule adds 1 to every id. Either way
    the capture above matched HF at the layer inputs stored: the harness computes what the release computes."""
    L = stock["num_layers"]
    assert stock["ids"][str([1, 2, 4])]["layers_to_capture"] == [2, 3, 5]
    assert stock["ids"][str([2, 3, 4])]["layers_to_capture"] in ([2, 3, 4], [3, 4, 5])
    assert harness.stock_layers_to_capture([2, 3, 4], L) == stock["ids"][str([2, 3, 4])]["layers_to_capture"]


def test_stock_layer_input_0(harness, stock):
    """Layer input 0 (the embedding output), stored directly in layers_to_capture: where the release's capture
    handles it, the slot is the embedding; SGLang 0.5.12's loop computes `hidden_states + residual` with residual
    still None there (models/deepseek_v2.py, DeepseekV2Model.forward) and raises."""
    rec = stock["input0"]
    if rec["error"] is not None:
        assert "NoneType" in rec["error"], rec["error"]
        pytest.skip(f"stock SGLang {stock['sglang']} cannot capture layer input 0: DeepseekV2Model.forward adds a "
                    f"residual that is still None at layer 0 ({rec['error']})")
    H = stock["hf_hidden"][0].shape[1]
    n = len(harness.PROMPT)
    assert (rec["aux"][:, :H] - stock["hf_hidden"][0][:n]).abs().max() <= ATOL
    assert (rec["aux"][:, H:] - stock["hf_hidden"][2][:n]).abs().max() <= ATOL
