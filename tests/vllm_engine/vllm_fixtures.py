"""Fixtures of the vLLM tests: the pair (vllm_pair.py), draft variants, and runs of vLLM's real serving loop
(serve_llm.py in a process of its own), each configuration once per test session.

Not a conftest.py: tests/ is on pytest's pythonpath, and these names should not reach the other suites.
Every run is a full engine start (40-85 s on two cores): ``make test-vllm`` runs the whole session through its
HEAVY prefix (a shared machine's lock), so nothing here takes one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import vllm_pair  # noqa: E402

PROMPTS = 8
MAX_TOKENS = 24
K = 3  # num_speculative_tokens
RUN_TIMEOUT_S = 900
# vLLM's CPU backends for the pair (vllm_pair.py says why); the KV cache small; the plugin's own settings come from
# each configuration (a caller's EAGLE3_CAPTURE_* is dropped so a stock run is stock).
BASE_ENV = {"VLLM_MLA_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
STOCK = {"EAGLE3_CAPTURE_DISABLE": "all"}


@dataclass
class Pair:
    root: str

    @property
    def target(self) -> str:
        return os.path.join(self.root, "target")

    def draft(self, name: str) -> str:
        return os.path.join(self.root, name)

    def prompts(self, n: int = PROMPTS):
        with open(os.path.join(self.root, "prompts.json")) as f:
            return json.load(f)[:n]

    def prompts_file(self, n: int = PROMPTS) -> str:
        path = os.path.join(self.root, f"first_{n}_prompts.json")
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump(self.prompts(n), f)
        return path

    def variant(self, base: str, name: str, top=None, nested=None, convention=None) -> str:
        """A copy of draft ``base`` whose config carries exactly these id keys (weights untouched)."""
        path = os.path.join(self.root, "variants", name)
        if not os.path.isdir(path):
            tmp = path + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(self.draft(base), tmp)
            p = os.path.join(tmp, "config.json")
            with open(p) as f:
                cfg = json.load(f)
            ec = cfg["eagle_config"]
            for k in ("eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_convention"):
                ec.pop(k, None)
            cfg.pop("eagle_aux_hidden_state_layer_ids", None)
            if top is not None:
                cfg["eagle_aux_hidden_state_layer_ids"] = top
            if nested is not None:
                ec["eagle_aux_hidden_state_layer_ids"] = nested
            if convention is not None:
                ec["eagle_aux_hidden_state_convention"] = convention
            with open(p, "w") as f:
                json.dump(cfg, f, indent=1)
            os.replace(tmp, path)
        return path


@dataclass
class Run:
    name: str
    returncode: int
    log: str
    result: Optional[dict]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None

    def metric(self, name: str):
        return self.result["metrics"][name]

    @property
    def accepted_per_pos(self):
        return [int(v) for v in self.metric("vllm:spec_decode_num_accepted_tokens_per_pos")]

    @property
    def counters(self):
        """vLLM's speculative-decoding counters of the run, as the doctor reads them from a server's /metrics."""
        from eagle3_capture.doctor.vllm_model import SpecCounters

        return SpecCounters(int(self.metric("vllm:spec_decode_num_drafts")),
                            int(self.metric("vllm:spec_decode_num_draft_tokens")),
                            int(self.metric("vllm:spec_decode_num_accepted_tokens")), self.accepted_per_pos)

    def lines(self, needle: str):
        return [ln for ln in self.log.splitlines() if needle in ln]


@pytest.fixture(scope="session")
def pair() -> Pair:
    return Pair(vllm_pair.ensure())


_runs: Dict[str, Run] = {}


def serve(pair: Pair, name: str, draft: str, env: Optional[dict] = None, observe: int = 0,
          prompts: int = PROMPTS) -> Run:
    """vLLM's loop serving ``prompts`` held-out prompts greedily with ``draft`` (once per name per session)."""
    if name in _runs:
        return _runs[name]
    out_dir = os.path.join(pair.root, "runs", name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    run = {"target": pair.target, "draft": draft, "prompts": pair.prompts(prompts), "max_tokens": MAX_TOKENS,
           "k": K, "observe": observe}
    run_path, out_path = os.path.join(out_dir, "run.json"), os.path.join(out_dir, "out.json")
    with open(run_path, "w") as f:
        json.dump(run, f)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_CAPTURE_")}
    full_env.update(BASE_ENV)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "serve_llm.py"), run_path, out_path], env=full_env,
                          cwd=out_dir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    with open(os.path.join(out_dir, "log.txt"), "w") as f:
        f.write(log)
    result = None
    if proc.returncode == 0 and os.path.exists(out_path):
        with open(out_path) as f:
            result = json.load(f)
    _runs[name] = Run(name, proc.returncode, log, result)
    return _runs[name]


def doctor(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_capture", "doctor", *map(str, args)], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)


# vLLM's chain of K speculative tokens (num_speculative_tokens = K, one draft token per step), in SGLang's flags: the
# doctor's replay of the served loop reads them
CHAIN_FLAGS = (f"--speculative-algorithm EAGLE3 --speculative-num-steps {K} --speculative-eagle-topk 1 "
               f"--speculative-num-draft-tokens {K + 1}")
_predictions: Dict[str, object] = {}


def predicted(pair: Pair, draft_name: str):
    """``doctor accept``'s prediction of vLLM's counters (SpecCounters) for the first PROMPTS prompts, MAX_TOKENS
    tokens each, served greedily with draft ``draft_name`` (once per draft per session)."""
    if draft_name not in _predictions:
        from eagle3_capture.doctor.vllm_model import predicted_counters

        out = os.path.join(pair.root, "runs", f"accept_{draft_name}.json")
        proc = doctor("accept", "--target", pair.target, "--draft", pair.draft(draft_name), "--prompts",
                      pair.prompts_file(), "--server-args", CHAIN_FLAGS, "--new-tokens", MAX_TOKENS, "--json", out,
                      "--no-progress", "--device", "cpu", "--threads", 1)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with open(out) as f:
            served = json.load(f)["served"]
        _predictions[draft_name] = predicted_counters(served["correct_drafts_histogram"], K)
    return _predictions[draft_name]


_ref: Dict[str, tuple] = {}


def reference(pair: Pair, dtype: str = "float64"):
    """The target in transformers: greedy continuations (float32, the served dtype) and the residual stream of the
    prompts (``dtype``): [B, P, L+1, H], index 0 the Embedding, k+1 LayerOutput(k)."""
    if dtype in _ref:
        return _ref[dtype]
    import torch
    from transformers import AutoModelForCausalLM

    from eagle3_capture.doctor.target_side.model import greedy_continue, residual_stream

    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    prompts = torch.tensor(pair.prompts())
    greedy = greedy_continue(model, prompts, MAX_TOKENS)[:, prompts.shape[1]:]
    if dtype != "float32":
        # torch's grouped_mm (transformers' default MoE path) has no float64 kernel on the CPU
        model.set_experts_implementation("eager")
    stack = residual_stream(model.to(getattr(torch, dtype)), prompts)[0]
    _ref[dtype] = (greedy.tolist(), stack)
    return _ref[dtype]


__all__ = ["Pair", "Run", "pair", "serve", "doctor", "predicted", "reference", "PROMPTS", "MAX_TOKENS", "K", "STOCK",
           "BASE_ENV", "CHAIN_FLAGS"]
