"""The doctor's training loop at a width and learning rate, on the CPU: the real-width run's loss climb, reproduced.

kimi_accept's draft (scripts/gpu_sglang: a Llama EAGLE-3 draft beside the Kimi-shaped target, its embedding and
lm_head rows taken from the target at gain 0.3, a d2t hot set) trained with ``doctor.demo.train.train_draft`` on a
learnable synthetic task (the label after a token is a fixed permutation of it; the taps are noise). Adam moves a
matrix's output by about lr x fan-in per step, so a width W at learning rate lr x 7168 / W takes the steps the
7168-wide draft took at lr: ``--lr 0.028 --lr-fan-in 1000000000`` at 512 wide is the unscaled loop at Kimi's width.

    python benchmarks/bench_train_width.py --hidden 512 --iters 100 --lr 0.028 --lr-fan-in 1000000000
    python benchmarks/bench_train_width.py --hidden 512 --iters 100 --lr 0.002          # the loop as it is now

Prints one JSON line: the width, learning rate, lr_fan_in, the loss curve (every other iteration), its first,
largest-after-the-minimum-so-far rise, and last value, and the seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts", "gpu_sglang"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--lr-fan-in", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    if a.hidden < 64 or a.hidden % 4 or a.iters < 2 or a.lr <= 0 or a.lr_fan_in < 1:
        p.error("--hidden must be a multiple of 4 >= 64, --iters >= 2, --lr > 0, --lr-fan-in >= 1")
    import torch

    import kimi_accept
    import kimi_compare
    import kimi_shape
    from eagle3_capture.doctor.demo.train import TrainConfig, train_draft
    from eagle3_capture.doctor.draft.model import Eagle3Draft

    torch.set_num_threads(a.threads)
    cfg = kimi_shape.target_config(4, 2, **dict(kimi_shape.SMALL, hidden_size=a.hidden, num_hidden_layers=8,
                                                vocab_size=4096, intermediate_size=256))
    N, T = 32, 24
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(4096, generator=g)
    seq = torch.randint(0, 4096, (N, T), generator=g)
    greedy = perm[seq]
    greedy[:, :-1] = perm[seq[:, 1:]]
    taps = torch.randn(N, T, 3 * a.hidden, generator=g)
    arch = kimi_compare.draft_arch("llama", cfg, kimi_compare.draft_ids(8))
    torch.manual_seed(0)
    d = Eagle3Draft(arch)
    ends = dict(t for b in kimi_shape.layer_batches(cfg, 0.3, 0, torch.float32, batches=[0, 9]) for t in b)
    hot = kimi_accept.hot_tokens(seq.tolist() + greedy.tolist(), arch.draft_vocab_size, arch.vocab_size)
    with torch.no_grad():
        d.embed_tokens.weight.copy_(ends["model.embed_tokens.weight"])
        d.lm_head.weight.copy_(ends["lm_head.weight"][hot])
        d.d2t.copy_(hot - torch.arange(hot.numel()))
    d.embed_tokens.weight.requires_grad_(False)
    t0 = time.time()
    log = train_draft(d, taps, seq, greedy, TrainConfig(iters=a.iters, batch=16, steps=3, lr=a.lr,
                                                        lr_fan_in=a.lr_fan_in, seed=0))
    c = log["loss_curve"]
    low, climb = c[0], 0.0
    for v in c:
        low = min(low, v)
        climb = max(climb, v - low)
    print(json.dumps({"hidden": a.hidden, "lr": a.lr, "lr_fan_in": a.lr_fan_in, "iters": a.iters,
                      "loss_first": round(c[0], 3), "largest_rise_after_a_minimum": round(climb, 3),
                      "loss_last": round(c[-1], 3), "loss_curve": [round(v, 2) for v in c],
                      "seconds": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
