"""Training a draft with a reduced vocabulary (SpecForge's d2t hot-token map, as Kimi-K2.5's Llama EAGLE-3 draft
ships: 32000 draft ids over 163840 target ids): target-id labels become draft ids, tokens the draft cannot propose
and tokens the source does not know are skipped, and a d2t that is not a map onto distinct target ids is refused."""
import pytest
import torch

from eagle3_capture.doctor.demo.train import IGNORE, TrainConfig, draft_labels, label_map, train_draft
from eagle3_capture.doctor.draft.model import DraftArch, Eagle3Draft

V, VD, H = 97, 23, 32


def arch(draft_vocab=VD):
    return DraftArch(hidden_size=H, target_hidden_size=H, num_aux=3, vocab_size=V, draft_vocab_size=draft_vocab,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                     layer_ids=[1, 3, 5])


def hot_draft(seed=0):
    torch.manual_seed(seed)
    d = Eagle3Draft(arch())
    hot = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:VD].sort().values
    d.d2t.copy_(hot - torch.arange(VD))
    return d, hot


def test_labels_map_target_ids_to_draft_ids_and_skip_the_rest():
    d, hot = hot_draft()
    to_draft = label_map(d)
    cold = next(t for t in range(V) if t not in set(hot.tolist()))
    labels = torch.tensor([[int(hot[0]), int(hot[7]), cold, -1]])
    assert draft_labels(labels, to_draft).tolist() == [[0, 7, IGNORE, IGNORE]]
    # every hot token round-trips: draft id i proposes target id i + d2t[i]
    assert torch.equal(to_draft[hot], torch.arange(VD))
    assert int((to_draft != IGNORE).sum()) == VD


def test_a_full_vocabulary_draft_needs_no_map_and_keeps_its_labels():
    d = Eagle3Draft(arch(draft_vocab=V))
    assert label_map(d) is None
    labels = torch.tensor([[5, -1, 96]])
    assert draft_labels(labels, None).tolist() == [[5, IGNORE, 96]]


@pytest.mark.parametrize("bad", ["collide", "outside"])
def test_a_d2t_that_is_not_a_map_onto_distinct_target_ids_is_refused(bad):
    d, _ = hot_draft()
    if bad == "collide":
        d.d2t.copy_(torch.zeros(VD, dtype=torch.int64) - torch.arange(VD) + 3)  # every draft id -> target id 3
    else:
        d.d2t[-1] = V  # target id VD - 1 + V
    with pytest.raises(ValueError, match="onto target ids outside"):
        label_map(d)


def test_training_with_a_hot_token_map_learns_the_hot_tokens():
    """Synthetic data whose greedy token is a function of the taps: the loss on the hot tokens falls, and the
    cold ones never enter it (a batch of only cold labels would be NaN, not a skipped step)."""
    d, hot = hot_draft(1)
    N, T, S = 16, 12, 2
    g = torch.Generator().manual_seed(2)
    seq = hot[torch.randint(0, VD, (N, T), generator=g)]
    greedy = torch.roll(seq, -1, dims=1)
    greedy[:, -1] = -1
    greedy[:, 3] = next(t for t in range(V) if t not in set(hot.tolist()))  # a cold token, skipped
    taps = torch.randn(N, T, 3 * H, generator=g)
    log = train_draft(d, taps, seq, greedy, TrainConfig(iters=40, batch=8, steps=S, lr=1e-2, seed=0))
    assert log["iters"] == 40 and all(torch.isfinite(torch.tensor(log["loss_curve"])))
    assert log["loss_last"] < 0.5 * log["loss_first"], log


def test_data_with_no_label_the_draft_can_learn_is_refused():
    d, hot = hot_draft(3)
    cold = torch.tensor([t for t in range(V) if t not in set(hot.tolist())][:1])
    seq = cold.repeat(4, 8)
    with pytest.raises(ValueError, match="no label the draft can learn"):
        train_draft(d, torch.randn(4, 8, 3 * H), seq, seq.clone(), TrainConfig(iters=3, batch=4, steps=2))
