"""One scheduler-like process of the acceptance export test (test_sglang_acceptance.py), in a fresh process with
``PROMETHEUS_MULTIPROC_DIR`` set before anything imports prometheus_client, as SGLang's launcher sets it:

    python tests/plugin/acceptance_worker.py OUT.json RANK EXAMPLES

It loads the plugin with SGLang's own load_plugins(), stands in SGLang's parallel groups with the ranks of attention-TP
rank RANK of a TP-2 server (this process has no process group: the three rank reads SGLang's parallel_state offers
answer RANK, 0, 0), runs the plugin's real model-load hook with the target's server args (metrics on, 3 steps), then,
for hypothesis-drawn batches of verifies, calls SGLang's real ``Req.update_spec_correct_drafts_histogram`` on real
``Req`` objects, flushes, and checks what prometheus_client's MultiProcessCollector reads from the directory against
the requests' own histograms: what this process wrote equals them on rank 0, is nothing on rank 1. The flush thread runs meanwhile (every second).
OUT.json: the histogram summed over every request, and the checks made.
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
MODEL = "tiny-eagle3"
STEPS = 3


def server_args():
    return SimpleNamespace(enable_metrics=True, served_model_name=MODEL, model_path="/models/tiny",
                           speculative_algorithm="EAGLE3", speculative_num_steps=STEPS, speculative_eagle_topk=1,
                           speculative_num_draft_tokens=STEPS + 1)


def totals(directory: str, pid=None) -> dict:
    """{(exported name, position or ''): value} of this model's series, as SGLang's /metrics would read them from
    every process's files (`pid`: from that process's files only)."""
    import glob

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if pid is None:  # SGLang's /metrics: a registry with the multiprocess collector over the directory
        reg = CollectorRegistry()
        MultiProcessCollector(reg, path=directory)
        metrics = reg.collect()
    else:
        metrics = MultiProcessCollector.merge(glob.glob(os.path.join(directory, f"*_{pid}.db")), accumulate=True)
    out = {}
    for metric in metrics:
        for s in metric.samples:
            if s.name.startswith("eagle3_capture:") and s.labels.get("model_name") == MODEL:
                key = (s.name, s.labels.get("position", ""))
                out[key] = out.get(key, 0) + s.value
    return out


def main() -> int:
    out_path, rank, examples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    import sglang.srt.plugins as sp

    sp.load_plugins()
    from sglang.srt.distributed import parallel_state as ps

    # stand-in for the process groups a TP-2 scheduler has (see the module's text)
    ps.get_attn_tensor_model_parallel_rank = lambda: rank
    ps.get_attn_context_model_parallel_rank = lambda: 0
    ps.get_pp_group = lambda: SimpleNamespace(rank_in_group=0)

    from hypothesis import given, settings, strategies as st
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from eagle3_capture.acceptance.positions import add, attempts_accepted
    from eagle3_capture.sglang.monitor import histogram as acceptance_count, live as acceptance_live, exporter
    from eagle3_capture.sglang import plugin

    runner = SimpleNamespace(server_args=server_args(), tp_rank=rank, is_draft_worker=False)
    assert plugin.load_model_hook(lambda self: "loaded", runner) == "loaded"
    assert exporter.enabled(), exporter.why_off()
    assert acceptance_count.counting() == (rank == 0)
    summed: list = []
    checks = [0]

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None)
    @given(st.lists(st.lists(st.integers(0, STEPS), max_size=60), min_size=1, max_size=8), st.randoms())
    def case(verifies, rnd):
        before = totals(directory, os.getpid())  # this process's own contribution (the other rank runs too)
        reqs = [Req(f"r{i}", "", [1, 2, 3], SamplingParams(max_new_tokens=8)) for i in range(len(verifies))]
        calls = [(i, k) for i, ks in enumerate(verifies) for k in ks]
        rnd.shuffle(calls)  # a batch interleaves its requests' verifies
        for i, k in calls:
            reqs[i].update_spec_correct_drafts_histogram(k)
        acceptance_live.flush()
        after = totals(directory, os.getpid())
        h = [0] * (STEPS + 1)
        for r in reqs:
            h = add(h, r.spec_correct_drafts_histogram)
        att, acc = attempts_accepted(h, STEPS)
        want = {("eagle3_capture:spec_verifies_total", ""): sum(h)}
        for p in range(1, STEPS + 1):
            want[("eagle3_capture:spec_draft_attempts_total", str(p))] = att[p - 1]
            want[("eagle3_capture:spec_draft_accepted_total", str(p))] = acc[p - 1]
        for key, n in want.items():
            got = after.get(key, 0) - before.get(key, 0)
            assert got == (n if rank == 0 else 0), (rank, key, got, n, verifies)
        summed[:] = add(summed, h)
        checks[0] += 1

    case()
    acceptance_live.stop()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "histogram": summed, "checks": checks[0]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
