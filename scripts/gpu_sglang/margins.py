"""Where served outputs part from the target's float64 greedy continuation, and by how much the target hesitated
there (scripts/gpu_sglang; run on the CPU after a GPU comparison, on its unpacked logs).

For every request whose output differs between any two servers or from the transformers float32 continuation,
the target's own greedy continuation is recomputed in float64 (transformers, eager experts) and, for each server,
the first position where the served output leaves it is reported with the float64 top-2 logit margin there: a
small margin is a near-tie that float32 / TF32 arithmetic (SGLang's Triton GEMMs and attention use TF32 for float32
inputs) can flip, and one flip changes the rest of the continuation.

    python scripts/gpu_sglang/margins.py --pair DIR --runs DIR/compare/runs --out margins.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", required=True, help="make_pair.py's output directory")
    p.add_argument("--runs", required=True, help="compare.py's runs/ directory (one folder per server)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, HERE)
    from report import read_jsonl

    with open(os.path.join(a.pair, "prompts.json")) as f:
        prompts = json.load(f)
    with open(os.path.join(a.pair, "reference_greedy.json")) as f:
        ref = json.load(f)["outputs"]
    runs = {n: [r["output_ids"] for r in read_jsonl(os.path.join(a.runs, n, "round1.jsonl"))]
            for n in sorted(os.listdir(a.runs)) if os.path.exists(os.path.join(a.runs, n, "round1.jsonl"))}
    outs = dict(runs, transformers_float32=ref)
    differing = sorted({i for i in range(len(prompts)) if len({json.dumps(o[i]) for o in outs.values()}) > 1})
    model = AutoModelForCausalLM.from_pretrained(os.path.join(a.pair, "demo", "target"), dtype=torch.float64,
                                                 experts_implementation="eager").eval()
    report = {"what": "float64 top-2 logit margin of the target at each output's first departure from its float64 "
                      "greedy continuation", "requests": {}}
    n_new = len(ref[0])
    for i in differing:
        seq, greedy, margins = list(prompts[i]), [], []
        with torch.no_grad():
            for _ in range(n_new):
                top = torch.topk(model(torch.tensor([seq])).logits[0, -1], 2)
                greedy.append(int(top.indices[0]))
                margins.append(float(top.values[0] - top.values[1]))
                seq.append(greedy[-1])
        rec = {"float64_greedy": greedy, "min_margin": min(margins), "servers": {}}
        for name, o in outs.items():
            k = next((j for j, (x, y) in enumerate(zip(o[i], greedy)) if x != y), None)
            rec["servers"][name] = {"first_departure": k, "margin_there": None if k is None else margins[k],
                                    "output": o[i]}
        report["requests"][str(i)] = rec
        print(f"request {i}: " + ", ".join(f"{n} departs at {v['first_departure']} (margin {v['margin_there']})"
                                            for n, v in rec["servers"].items()))
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
