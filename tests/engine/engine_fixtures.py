"""Fixtures of the engine tests: SGLang 0.5.23's real serving loop (``sglang.Engine`` and
``python -m sglang.launch_server``) running EAGLE-3 on the CPU for the demo pair, once per configuration.

(Not a conftest.py, for the reason given in tests/plugin/sglang_fixtures.py.)

- The pair is the fast demo's tiny DeepseekV3 target and the draft trained on it (taps [Embedding, LayerOutput(0),
  LayerOutput(3)] = draft ids [-1, 0, 3]), trained once per test process.
- Each server runs in its own process tree with the test-only CPU stand-ins (tests/sglang_cpu_plugin, switched on
  by E3_SGLANG_CPU_STANDINS=1) and Triton's interpreter; this project's plugin loads through SGLang's own
  load_plugins() as in any deployment. Its switches come from the caller's environment unless a configuration sets
  them: run with EAGLE3_CAPTURE_DISABLE=taps and the plugin-on tests fail, as they should.
- Few prompts, short continuations: each engine costs 1-3 minutes on two cores. Servers may run two at a time, each
  from its own thread (engine_runs.py): the files written here are made under a lock, and every server process
  started here is stopped by `stop_every_server()` if the session ends before its run does.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

from doctor_helpers import demo_fast  # noqa: E402
from free_ports import free_port  # noqa: E402

PROMPTS = 8
NEW_TOKENS = 16
CHAIN = (3, 1, 4)   # num-steps, eagle-topk, num-draft-tokens: SGLang's auto values for DeepSeek targets
TREE = (3, 2, 6)
ENGINE_TIMEOUT_S = 900

# OMP_NUM_THREADS=1: one torch thread a server process (a TP rank included). Servers run two at a time on two cores
# (engine_runs.py), beside their clients; without sgl_kernel's AMX path SGLang binds no threads on the CPU, and
# torch's two OpenMP threads per process would oversubscribe the cores and spin between ops.
BASE_ENV = {"E3_SGLANG_CPU_STANDINS": "1", "TRITON_INTERPRET": "1", "TORCHDYNAMO_DISABLE": "1",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
# SGLang's scheduler polls for requests in a busy loop unless told to sleep when idle (every release 0.5.12-0.5.23
# has the flag; it waits on its sockets, so a request wakes it at once): without it each server burns a core while
# it waits for the doctor or the tests, which two servers at a time on two cores cannot afford (serve.py passes
# sleep_on_idle too)
IDLE_FLAGS = ("--sleep-on-idle",)


def flags_text(flags) -> str:
    s, k, d = flags
    return (f"--speculative-algorithm EAGLE3 --speculative-num-steps {s} --speculative-eagle-topk {k} "
            f"--speculative-num-draft-tokens {d}")


@dataclass
class Pair:
    root: str
    target: str
    draft: str          # as trained and shipped: draft ids [-1, 0, 3]
    prompts: str        # the first PROMPTS held-out prompts
    held_out: str = ""  # all of the demo's held-out prompts (64)

    def first_prompts(self, n: int) -> str:
        """A prompts file holding the first n held-out prompts (written once)."""
        path = os.path.join(self.root, f"first_{n}_prompts.json")
        with _FILES:
            if not os.path.exists(path):
                with open(self.held_out or self.prompts) as f, open(path, "w") as g:
                    json.dump(json.load(f)[:n], g)
        return path

    def draft_variant(self, name: str, **eagle_config) -> str:
        """A copy of the draft whose config's eagle_config has these keys changed (weights untouched)."""
        path = os.path.join(self.root, f"draft_{name}")
        with _FILES:
            if not os.path.isdir(path):
                shutil.copytree(self.draft, path)
                p = os.path.join(path, "config.json")
                with open(p) as f:
                    cfg = json.load(f)
                cfg["eagle_config"].update(eagle_config)
                with open(p, "w") as f:
                    json.dump(cfg, f, indent=1)
        return path


_FILES = threading.Lock()   # the pair's derived files, written once whichever run's thread asks first
_PAIR: Dict[str, Pair] = {}


@dataclass
class Served:
    """One server run: the responses (serve.py's JSONL lines), where they are, and the server's log."""

    responses: List[dict]
    path: str
    log: str
    seconds: float
    error: Optional[str] = None
    metrics: Optional[str] = None   # the exposition text of /metrics after the last response (metrics=True)
    second_round: Optional[List[dict]] = None  # each prompt once more, alone, after the first round

    @property
    def tokens_per_verify(self) -> float:
        t = sum(r["meta_info"]["completion_tokens"] for r in self.responses)
        v = sum(r["meta_info"]["spec_verify_ct"] for r in self.responses)
        return t / v


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> Pair:
    """The demo pair and the folder of the session's server logs and outputs: one for every module that imports
    this fixture (the runs started from one module are read from others)."""
    if "pair" not in _PAIR:
        res, out = demo_fast()
        root = str(tmp_path_factory.mktemp("engine"))  # pytest keeps the last few runs' logs, not every run's
        with open(os.path.join(out, "prompts.json")) as f:
            prompts = json.load(f)[:PROMPTS]
        p = os.path.join(root, "prompts.json")
        with open(p, "w") as f:
            json.dump(prompts, f)
        _PAIR["pair"] = Pair(root, os.path.join(out, "target"), os.path.join(out, "draft"), p,
                             os.path.join(out, "prompts.json"))
    return _PAIR["pair"]


def _env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(BASE_ENV)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def serve_engine(pair: Pair, name: str, draft: str, flags=CHAIN, env: Optional[Dict[str, str]] = None,
                 prompts: Optional[str] = None, new_tokens: int = NEW_TOKENS, tp: int = 1,
                 metrics: bool = False, second_round: bool = False) -> Served:
    """tests/engine/serve.py: one sglang.Engine, the prompts, its responses and log (`metrics`: with
    --enable-metrics, and what its /metrics would show after the last response, in Served.metrics)."""
    out = os.path.join(pair.root, f"{name}.jsonl")
    metrics_path = os.path.join(pair.root, f"{name}.metrics.txt")
    second_path = os.path.join(pair.root, f"{name}.second.jsonl")
    extra = (["--metrics-out", metrics_path] if metrics else []) + (["--second-round", second_path]
                                                                    if second_round else [])
    s, k, d = flags
    t0 = time.time()
    log_path = os.path.join(pair.root, f"{name}.log")
    with open(log_path, "w") as log_file:
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "serve.py"), "--target", pair.target, "--draft",
                              draft, "--prompts", prompts or pair.prompts, "--out", out, "--steps", str(s), "--topk",
                              str(k), "--draft-tokens", str(d), "--new-tokens", str(new_tokens), "--context-length",
                              "56", "--tp", str(tp), *extra],
                             stdout=log_file, stderr=subprocess.STDOUT, text=True, env=_env(env), cwd=REPO,
                             start_new_session=True)
        with _running(p):
            try:
                p.wait(timeout=ENGINE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _stop(p)
                raise
    with open(log_path) as f:
        log = f.read()
    lines = []
    if os.path.exists(out):
        with open(out) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    error = lines[0]["error"] if len(lines) == 1 and "error" in lines[0] else None
    if error is None and p.returncode != 0:
        error = f"serve.py exited {p.returncode}"
    text = None
    if metrics and os.path.exists(metrics_path):
        with open(metrics_path) as f:
            text = f.read()
    second = None
    if second_round and os.path.exists(second_path):
        with open(second_path) as f:
            second = [json.loads(line) for line in f if line.strip()]
    return Served([] if error else lines, out, log, time.time() - t0, error, text, second)


class LaunchedServer:
    """``python -m sglang.launch_server`` on 127.0.0.1, in its own process group; stopped on exit."""

    def __init__(self, pair: Pair, draft: str, flags=CHAIN, env: Optional[Dict[str, str]] = None,
                 extra: Sequence[str] = (), name: str = "launch_server"):
        """`extra`: more launch_server flags (--tp-size 2, --enable-metrics); `name`: of its log file."""
        self.port = free_port()  # below 55536, which SGLang 0.5.12's gRPC port (+10000) needs
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(pair.root, f"{name}.log")
        s, k, d = flags
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", pair.target,
                    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                    "--speculative-num-steps", str(s), "--speculative-eagle-topk", str(k),
                    "--speculative-num-draft-tokens", str(d), "--device", "cpu", "--dtype", "float32",
                    "--attention-backend", "triton", "--disable-cuda-graph", "--skip-tokenizer-init",
                    "--mem-fraction-static", "0.05", "--max-total-tokens", "4096", "--chunked-prefill-size", "512",
                    "--context-length", "56", "--host", "127.0.0.1", "--port", str(self.port), *IDLE_FLAGS, *extra]
        self.env = _env(env)
        self.proc = None
        self._log = None

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
                                     start_new_session=True)
        _LIVE.add(self.proc)
        deadline = time.time() + ENGINE_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launch_server exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(2)
        raise RuntimeError(f"launch_server not healthy after {ENGINE_TIMEOUT_S} s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def metrics(self, settle_s: float = 2.5) -> str:
        """GET /metrics (with --enable-metrics), after `settle_s` so that the plugin's per-second flush of what
        was served so far has run."""
        time.sleep(settle_s)
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def __exit__(self, *exc):
        if self.proc is not None:
            _stop(self.proc)
            _LIVE.discard(self.proc)
        if self._log is not None:
            self._log.close()
        return False


# every server process group started here and not yet ended (serve.py's and launch_server's)
_LIVE: set = set()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group (the server's scheduler and detokenizer included), SIGKILL after 60 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


class _running:
    """Keeps `proc` in the set `stop_every_server` ends, while the block runs."""

    def __init__(self, proc):
        self.proc = proc

    def __enter__(self):
        _LIVE.add(self.proc)
        return self.proc

    def __exit__(self, *exc):
        _LIVE.discard(self.proc)
        return False


def stop_every_server() -> None:
    """Stop every server still running (a session that ends before its runs do: Ctrl-C, -x)."""
    for proc in list(_LIVE):
        _stop(proc)


def post_json(url: str, body: dict, timeout: float = 600) -> dict:
    """POST a JSON body; the decoded JSON answer (an HTTP error raises with the server's text)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}") from None


def wait_for_files(pattern: str, want, timeout: float = 60.0) -> List[str]:
    """The files matching `pattern` once `want(files)` holds (the dump writes from a background thread)."""
    import glob

    deadline = time.time() + timeout
    while True:
        files = sorted(glob.glob(pattern))
        if want(files) or time.time() > deadline:
            return files
        time.sleep(0.5)


def doctor(*argv, timeout: int = 600):
    """(exit code, stdout, stderr) of ``python -m eagle3_capture doctor ...`` in a fresh process."""
    p = subprocess.run([sys.executable, "-m", "eagle3_capture", "doctor", *[str(a) for a in argv]],
                       capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return p.returncode, p.stdout, p.stderr


def dump_records(dump: str) -> List[dict]:
    """Every record of a capture dump directory, each validated against the dump format, in write order (and no
    half-written .tmp file left)."""
    import glob

    import torch

    from eagle3_capture.dump_format import validate_record

    recs = []
    for f in sorted(glob.glob(os.path.join(dump, "*.pt"))):
        rec = torch.load(f, weights_only=True)
        validate_record(rec, f)
        recs.append(rec)
    assert not glob.glob(os.path.join(dump, "*.tmp"))
    return sorted(recs, key=lambda r: r["seq"])
