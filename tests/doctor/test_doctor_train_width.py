"""The doctor's training loop at any width (doctor/demo/train.py): its per-matrix learning rate is scaled by
fan-in, so one Adam step moves a 2048-wide draft's logits about as far as a 256-wide one's. Without the scaling
(the loop as it was) the move grows with the width -- 8x here, 28x at Kimi-K2.5's 7168, where the real-width run's
loss climbed from 25.4 to 37 after the warm-up -- and the first test fails. At the demo's widths nothing changes."""
import json
import os

import pytest
import torch

from eagle3_capture.doctor.demo.train import TrainConfig, fan_in_lr, param_groups, train_draft
from eagle3_capture.doctor.draft.model import DraftArch, Eagle3Draft


def _draft(H: int, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    arch = DraftArch(hidden_size=H, target_hidden_size=H, num_aux=3, vocab_size=512, draft_vocab_size=512,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=H // 4, intermediate_size=H,
                     layer_ids=[1, 3, 5])
    d = Eagle3Draft(arch)
    d.embed_tokens.weight.requires_grad_(False)
    return d


def _first_step_move(H: int, lr_fan_in: int) -> float:
    """Mean |change| of the step-1 logits after one training step (same data and seed at every width)."""
    d = _draft(H)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 512, (4, 12), generator=g)
    greedy = torch.roll(seq, -1, 1)
    taps = torch.randn(4, 12, 3 * H, generator=g)
    with torch.no_grad():
        before = d.unroll(taps[:, :9], seq[:, 1:], 3)[0].clone()
    train_draft(d, taps, seq, greedy, TrainConfig(iters=1, batch=4, steps=3, lr=2e-3, lr_fan_in=lr_fan_in, seed=0))
    with torch.no_grad():
        after = d.unroll(taps[:, :9], seq[:, 1:], 3)[0]
    return float((after - before).abs().mean())


def test_one_step_moves_the_logits_alike_at_every_width():
    narrow, wide = _first_step_move(256, 256), _first_step_move(2048, 256)
    assert 0.5 < wide / narrow < 2.0, (narrow, wide)
    # the loop without the scaling: the wide draft's logits move by about the width ratio more
    unscaled = _first_step_move(2048, 10 ** 9)
    assert unscaled / narrow > 4.0, (narrow, unscaled)


def test_the_learning_rate_per_parameter():
    d = _draft(1024)
    assert fan_in_lr(d.fc.weight, 2e-3, 256) == pytest.approx(2e-3 * 256 / 3072)   # fc: K*H in
    assert fan_in_lr(d.lm_head.weight, 2e-3, 256) == pytest.approx(2e-3 / 4)
    assert fan_in_lr(d.norm.weight, 2e-3, 256) == 2e-3                             # vectors keep it
    groups = param_groups(d, 2e-3, 256)
    trainable = [p for p in d.parameters() if p.requires_grad]
    assert sum(len(g["params"]) for g in groups) == len(trainable)               # each once, the frozen none
    assert all(p is not d.embed_tokens.weight for g in groups for p in g["params"])
    for bad in ((0.0, 256), (2e-3, 0), (2e-3, 1.5)):
        with pytest.raises(ValueError, match="lr_fan_in"):
            param_groups(d, *bad)


def test_the_demo_draft_trains_as_before():
    """Every fan-in of the demo's draft is at most 256: one group, the demo's own learning rate."""
    path = os.path.join(os.path.dirname(__import__("eagle3_capture").__file__), "data")
    size = json.load(open(os.path.join(path, "demo.json")))["draft"]
    H = json.load(open(os.path.join(path, "demo_target_config.json")))["hidden_size"]
    arch = DraftArch(hidden_size=H, target_hidden_size=H, num_aux=3, vocab_size=256, draft_vocab_size=256,
                     num_attention_heads=size["num_attention_heads"], num_key_value_heads=size["num_key_value_heads"],
                     head_dim=size["head_dim"], intermediate_size=size["intermediate_size"], layer_ids=[-1, 0, 3])
    groups = param_groups(Eagle3Draft(arch), 3e-3, TrainConfig().lr_fan_in)
    assert [g["lr"] for g in groups] == [3e-3]
