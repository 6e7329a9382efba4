"""One run of vLLM's real serving loop (offline ``vllm.LLM``: EngineCore and the CPU worker, EAGLE-3 speculative
decoding), in a process of its own, writing what it served to a JSON file:

    python tests/vllm_engine/serve_llm.py RUN.json OUT.json

RUN.json: {"target", "draft", "prompts" (token id lists), "max_tokens", "k" (num_speculative_tokens),
"observe" (optional: record the target's captured aux hidden states of the first ``observe`` forwards)}.
OUT.json: {"outputs" (token ids per prompt), "metrics" ({name: value or per-position list}), "observed"
(optional: path of a safetensors file with the captured rows), "seconds"}.

The ``__main__`` guard is required: vLLM spawns its processes. The environment (VLLM_PLUGINS, EAGLE3_CAPTURE_*,
VLLM_MLA_DISABLE) comes from the caller. ``observe`` registers a plain torch forward hook on the target
causal LM through ``LLM.apply_model`` (vLLM's own way to reach the worker's model), and reads what it kept
the same way: the model's real forward output, (hidden_states, aux_hidden_states), whatever the plugin did.
"""
from __future__ import annotations

import functools
import json
import sys
import time

import vllm_observer  # importable by name in every vLLM process: the caller puts tests/vllm_engine on PYTHONPATH


def _metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        name = m.name
        if name.startswith("vllm:spec_decode") or name in ("vllm:generation_tokens", "vllm:prompt_tokens"):
            out[name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def main(run_path: str, out_path: str) -> int:
    with open(run_path) as f:
        run = json.load(f)
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=run["target"], skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
              max_model_len=run.get("max_model_len", 128), max_num_seqs=run.get("max_num_seqs", 16),
              disable_log_stats=False, seed=0,
              speculative_config={"method": "eagle3", "model": run["draft"],
                                  "num_speculative_tokens": run["k"]})
    started = time.perf_counter() - t0
    observed = None
    if run.get("observe"):
        llm.apply_model(functools.partial(vllm_observer.attach, int(run["observe"])))
    params = SamplingParams(max_tokens=run["max_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in run["prompts"]], params, use_tqdm=False)
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": _metrics(llm),
              "start_seconds": round(started, 1), "seconds": round(time.perf_counter() - t0, 1)}
    if run.get("observe"):
        observed = llm.apply_model(vllm_observer.collect)[0]
        result["observed"] = observed
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
