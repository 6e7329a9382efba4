"""Serve prompts through SGLang 0.5.23's real ``sglang.Engine`` (EAGLE-3) on the CPU and record each response.

A script, run in its own process by the engine tests (an Engine owns scheduler and detokenizer processes, and
SGLang's ``load_plugins()`` runs once per process). The caller's environment chooses what loads: this project's
plugin (``EAGLE3_CAPTURE_DISABLE``, ``EAGLE3_CAPTURE_DUMP``, ``SGLANG_PLUGINS``) and the test-only CPU stand-ins
(``E3_SGLANG_CPU_STANDINS=1``, with ``TRITON_INTERPRET=1``; tests/sglang_cpu_plugin).

    python tests/engine/serve.py --target DIR --draft DIR --prompts prompts.json --out responses.jsonl \
        --steps 3 --topk 1 --draft-tokens 4 --new-tokens 16

Writes one JSON line per prompt, ``{"input_ids", "output_ids", "meta_info"}`` (what ``doctor online`` reads from
a file), or, when the engine fails, ``{"error": "<type>: <message>"}`` as the only line, and exits 3.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True, help="a JSON list of token-id lists")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--max-prompts", type=int, default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--metrics-out", default=None,
                   help="run with --enable-metrics and write what SGLang's /metrics would show (its multiprocess "
                        "collector over the engine's PROMETHEUS_MULTIPROC_DIR) after the last response")
    p.add_argument("--second-round", default=None,
                   help="after the first round, send each prompt once more, alone, and write one JSON line per "
                        "prompt here: the response, or {'error': ...} when the engine refused it")
    a = p.parse_args()

    with open(a.prompts) as f:
        prompts = json.load(f)
    if a.max_prompts is not None:
        prompts = prompts[: a.max_prompts]
    import sglang

    t0 = time.time()
    try:
        engine = sglang.Engine(
            model_path=a.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=a.draft,
            speculative_num_steps=a.steps, speculative_eagle_topk=a.topk, speculative_num_draft_tokens=a.draft_tokens,
            device="cpu", dtype="float32", tp_size=a.tp, attention_backend="triton", disable_cuda_graph=True,
            skip_tokenizer_init=True, mem_fraction_static=0.05, max_total_tokens=4096, chunked_prefill_size=512,
            max_running_requests=a.max_running, context_length=a.context_length, log_level="info",
            enable_metrics=a.metrics_out is not None,
            sleep_on_idle=True,  # no busy loop while waiting for requests (tests/engine/engine_fixtures.py: IDLE_FLAGS)
        )
    except BaseException as e:  # the engine's own failure is the result some tests want
        with open(a.out, "w") as f:
            f.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        traceback.print_exc()
        return 3
    t1 = time.time()
    try:
        outs = engine.generate(input_ids=prompts, sampling_params={
            "temperature": 0, "max_new_tokens": a.new_tokens, "ignore_eos": True})
    except BaseException as e:
        with open(a.out, "w") as f:
            f.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        traceback.print_exc()
        engine.shutdown()
        return 3
    t2 = time.time()
    with open(a.out, "w") as f:
        for ids, o in zip(prompts, outs):
            f.write(json.dumps({"input_ids": ids, "output_ids": o.get("output_ids"),
                                "meta_info": o.get("meta_info")}) + "\n")
    if a.second_round is not None:
        second_round(engine, prompts, a.new_tokens, a.second_round)
    if a.metrics_out is not None:
        write_metrics(a.metrics_out)
    print(f"serve.py: engine start {t1 - t0:.1f} s, {len(prompts)} prompts in {t2 - t1:.1f} s", file=sys.stderr)
    engine.shutdown()
    return 0


def second_round(engine, prompts, new_tokens: int, path: str) -> None:
    with open(path, "w") as f:
        for ids in prompts:
            try:
                o = engine.generate(input_ids=ids, sampling_params={
                    "temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True})
                row = {"input_ids": ids, "output_ids": o.get("output_ids"), "meta_info": o.get("meta_info")}
            except Exception as e:  # the refusal some tests want
                row = {"input_ids": ids, "error": f"{type(e).__name__}: {e}"}
            f.write(json.dumps(row) + "\n")


def write_metrics(path: str, settle_s: float = 3.0) -> None:
    """The exposition text SGLang's /metrics serves (sglang/srt/utils/common.py add_prometheus_middleware: a
    MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR), once the plugin's counters have been flushed (every
    second, from each scheduler process)."""
    import os

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    time.sleep(settle_s)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    with open(path, "wb") as f:
        f.write(generate_latest(registry))


if __name__ == "__main__":
    sys.exit(main())
