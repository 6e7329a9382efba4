"""vLLM 0.32.0's OpenAI server (``python -m vllm.entrypoints.openai.api_server``: API server, EngineCore, CPU worker)
with the plugin and the embedding draft: the tokens it serves through ``/v1/completions`` and the acceptance it
counts on ``/metrics`` (``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}``,
``vllm:spec_decode_num_drafts_total``), against ``doctor accept``'s prediction for the same prompts and flags.

What vLLM offers an outside observer, and so the doctor: per request only the tokens (no acceptance, no hidden
states); acceptance only as the server-wide counters, so a measurement is the counters' difference over a window
with nothing else in flight (as here).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from eagle3_capture.doctor.vllm_model import parse_spec_counters
from free_ports import free_port
from vllm_fixtures import BASE_ENV, K, MAX_TOKENS, PROMPTS, pair, predicted, reference  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT_S = 600


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_CAPTURE_")}
    env.update(BASE_ENV)
    spec = json.dumps({"method": "eagle3", "model": pair.draft("draft_embedding"), "num_speculative_tokens": K})
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", pair.target, "--port", str(port),
           "--host", "127.0.0.1", "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "128", "--max-num-seqs", "16", "--seed", "0", "--speculative-config", spec]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n" + log_path.read_text()[-3000:])
            try:
                _get(base + "/health")
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("the vLLM server did not start in time:\n" + log_path.read_text()[-3000:])
                time.sleep(2)
        yield base, log_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_server_serves_the_embedding_tap_and_the_doctor_predicts_its_counters(pair, server):
    base, log_path = server
    log = log_path.read_text()
    lines = [ln for ln in log.splitlines() if "eagle3_capture: vLLM 0.32.0" in ln]
    assert len(lines) == 1 and "draft ids [-1, 1, 2]" in lines[0], log[-3000:]
    before = parse_spec_counters(_get(base + "/metrics"))
    served = []
    for prompt in pair.prompts():
        body = {"model": pair.target, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        served.append(_post(base + "/v1/completions", body)["choices"][0]["token_ids"])
    measured = parse_spec_counters(_get(base + "/metrics")) - before
    assert len(served) == PROMPTS and all(len(s) == MAX_TOKENS for s in served)
    assert served == reference(pair)[0], "the server's tokens differ from the target's greedy continuation"
    assert measured == predicted(pair, "draft_embedding")
    assert measured.per_pos[0] > 0, measured
