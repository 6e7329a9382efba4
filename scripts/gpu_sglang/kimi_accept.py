"""A draft that accepts, at Kimi-K2.5's width: trained on the server's own dump, then online = offline against
that server (scripts/gpu_sglang).

    python scripts/gpu_sglang/kimi_accept.py --out DIR [--phase collect|train|online|miswired|all] [--state DIR]
        [--experts 4] [--gain 0.3] [--prompts 32] [--new-tokens 32] [--train-iters 300] [--budget-s 560]
        [--device cuda|cpu] [--small] [--layers N] [--plan PLAN.json] [--result PATH] [--command TEXT]

Each phase fits one device call from a cold machine (scripts/gpu_sglang/kimi_plan.py checks first); collect and
train leave their files in --state for the next call (the GPU script keeps it at a fixed path, /tmp/e3kimi-state).

1. **Collect.** ``python -m sglang.launch_server`` serves the Kimi-shaped target (kimi_compare.py's, reshaped at
   load) with the plugin, its full-stream dump on for the doctor's requests and an untrained Llama draft; the
   prompts are served greedily, then the doctor's own teacher-forced pass (``ServerTarget.teacher_force``: one
   prefill of prompt + served tokens per prompt, the target's greedy token at every position from SGLang's input
   logprobs) reads the residual stream at the draft's taps back from the dump. No target outside the server. The
   taps, tokens and labels go to STATE/train_data.pt.
2. **Train** (its own process, which exits before the next server loads: a server started beside the training
   process was killed during its load on the H100). A ``LlamaForCausalLMEagle3`` draft at the target's width: its
   embedding and lm_head rows from the target's (kimi_shape gives them exactly), a d2t hot-token map of the most frequent served tokens, the rest
   trained with the doctor's multi-step loop (``doctor.demo.train``) on those taps.
3. **Online = offline.** A second server with the trained draft (and its dump); ``eagle3-capture doctor online
   --server URL --draft D --dump DIR`` serves the held-out prompts, predicts every verify from the dump, and says
   whether predicted = served (accept length, per-prompt verify counts and histograms, every verify a bf16
   near-tie decided listed). The result's ``handoff`` says that the training process (train.json names it) had
   finished and was gone when this server was launched.

``--miswired`` instead serves the untrained draft with every id one layer later and gives the doctor the draft as
written: ``doctor online`` must exit 1 and its fingerprint name each served slot as the next layer, bit for bit
from the full stream of the same forwards (the miswire a one-off convention slip makes, at 61 layers).

Writes DIR/kimi_<phase>.json (machine, torch, command, kimi_plan's card / experts / budget, the figures of every
step, the doctor's JSON) and exits 0 when the phase did its part: online, when the training process was gone before
its server was launched, the trained draft accepts (accept length > 1.5, ``--min-accept-length``) and doctor
online's verdict holds (predicted = served by the bf16 criterion, doctor/replay/near_ties).
``--device cpu --small --layers 8`` dry-runs every phase on SGLang's CPU path (tests/gpu_programs/test_kimi_harness.py
runs collect -> train -> online so, each its own process, on a state folder like the GPU machine's).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kimi_shape  # noqa: E402
from compare import CPU_DRY_RUN_ENV, child_env, machine  # noqa: E402
from kimi_compare import GAIN, RESHAPE_ENV, draft_arch, draft_ids, prompts, target_of, write_draft  # noqa: E402
from make_pair import CHAIN  # noqa: E402
from server_flags import accepted, eager_options, graph_options  # noqa: E402

GRAPH_DECODE, GRAPH_PREFILL = (1, 4, 16), (64, 512)  # the batch sizes captured (as on the H200 probe)
MIN_ACCEPT_LENGTH = 1.5  # the online phase's bar for a draft that accepts (issue: > 1.5 on held-out prompts)
_RELEASE: Dict[str, dict] = {}


def release_options(env: Dict[str, str]) -> dict:
    """server_flags.accepted for the servers' environment, read once per process."""
    key = env.get("PYTHONPATH", "")
    if key not in _RELEASE:
        _RELEASE[key] = accepted(env, cwd=REPO)
    return _RELEASE[key]


DUMP_ENV = {"EAGLE3_CAPTURE_DUMP_MAX": "100000", "EAGLE3_CAPTURE_DUMP_REQUESTS": "100000",
            "EAGLE3_CAPTURE_DUMP_STREAM": "all"}


def free_port() -> int:
    """A free port below 55536 (older SGLang releases take the HTTP port + 10000 as their gRPC port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port <= 55535:
            return port
    raise RuntimeError("no free port below 55536 in 200 tries")


PORT_ATTEMPTS = 3
PORT_TAKEN = "address already in use"  # uvicorn's bind error ([Errno 98]), as launch_server logs it


class Server:
    """``python -m sglang.launch_server`` on 127.0.0.1 (its own process group), healthy on enter, killed on exit."""

    def __init__(self, name: str, target: str, draft: str, out: str, env: Dict[str, str], device: str,
                 context: int, mem_fraction: float, timeout_s: float):
        self.port, self.timeout_s, self.target = free_port(), timeout_s, target
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(out, f"{name}.log")
        s, k, d = CHAIN
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--load-format", "dummy",
                    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                    "--speculative-draft-load-format", "auto", "--speculative-num-steps", str(s),
                    "--speculative-eagle-topk", str(k), "--speculative-num-draft-tokens", str(d),
                    "--device", device, "--dtype", "bfloat16" if device == "cuda" else "float32",
                    "--attention-backend", "triton", "--skip-tokenizer-init", "--mem-fraction-static",
                    str(mem_fraction), "--max-total-tokens", "16384", "--chunked-prefill-size", "1024",
                    "--context-length", str(context), "--max-running-requests", "16", "--host", "127.0.0.1",
                    "--port", str(self.port)]
        self.env = child_env(env, device)
        # spelled as the installed release's parser spells them (server_flags.py)
        options = release_options(self.env)["options"]
        self.graph_options = (graph_options(options, GRAPH_DECODE, GRAPH_PREFILL) if device == "cuda" else
                              eager_options(options))
        self.cmd += self.graph_options
        self.proc = None
        self.start_s = None
        self.launched_at = None  # epoch seconds: the phases' handoff is judged on these (train ends before it)

    def __enter__(self):
        t0 = self.launched_at = time.time()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._launch()
            while time.time() - t0 < self.timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"launch_server exited {self.proc.returncode}: {self.tail()}")
                if PORT_TAKEN in self.tail(20000).lower():
                    break  # another process bound the port between free_port() and launch_server's bind
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                        if r.status == 200 and self._is_ours():
                            self.start_s = round(time.time() - t0, 1)
                            return self
                except OSError:
                    pass
                time.sleep(2)
            else:
                break  # out of time
            self._kill()
            if attempt == PORT_ATTEMPTS:
                raise RuntimeError(f"launch_server could not bind a port in {PORT_ATTEMPTS} tries (the last: "
                                   f"{self.port}, taken by another process): {self.tail()}")
            self._new_port()
        self.__exit__()
        raise RuntimeError(f"launch_server not healthy after {self.timeout_s:.0f} s: {self.tail()}")

    def _launch(self) -> None:
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
                                     start_new_session=True)

    def _new_port(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd[self.cmd.index("--port") + 1] = str(self.port)

    def _is_ours(self) -> bool:
        """The healthy server on the port is this launch_server (its model path), not another process's: a port
        taken under it would otherwise answer for it. Releases without /get_model_info are taken at /health's
        word."""
        try:
            with urllib.request.urlopen(self.url + "/get_model_info", timeout=5) as r:
                info = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            return e.code == 404
        except ValueError:  # not JSON: not an SGLang server
            return False
        return os.path.realpath(str(info.get("model_path", ""))) == os.path.realpath(self.target)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self._log.close()

    def tail(self, n: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def __exit__(self, *exc):
        self._kill()


def serve(url: str, ps: List[List[int]], new_tokens: int, timeout_s: float) -> List[List[int]]:
    """Greedy continuations of `ps` from the server (the doctor's own client, 16 at a time; each answer within
    `timeout_s`: the phase's seconds left, as a CPU dry run's batch outlasts any fixed per-request limit)."""
    from eagle3_capture.doctor.sglang_model.http import generate

    return [r.output_ids for r in generate(url, ps, new_tokens, timeout=timeout_s, concurrency=16, progress=False)]


def hot_tokens(seqs: List[List[int]], n: int, vocab: int) -> "object":
    """The `n` target ids the draft may propose: the most frequent in `seqs`, then the lowest ids not yet taken
    (a d2t map needs exactly n distinct ids); sorted, as SpecForge writes them."""
    import torch

    counts = collections.Counter(t for s in seqs for t in s)
    ids = [t for t, _ in counts.most_common(n)]
    taken = set(ids)
    ids += [t for t in range(vocab) if t not in taken][: n - len(ids)]
    return torch.tensor(sorted(ids), dtype=torch.int64)


def trained_draft(cfg: dict, gain: float, taps, seq, greedy, iters: int, device: str, out: str,
                  seed: int = 0) -> dict:
    """Step 2: the draft built, initialised from the target's embedding and lm_head, trained, saved (bf16)."""
    import torch

    from eagle3_capture.doctor.demo.train import TrainConfig, train_draft
    from eagle3_capture.doctor.draft.checkpoint import save_draft
    from eagle3_capture.doctor.draft.model import Eagle3Draft

    arch = draft_arch("llama", cfg, draft_ids(cfg["num_hidden_layers"]))
    torch.manual_seed(seed)
    draft = Eagle3Draft(arch).to(device)
    # the target's embedding (batch 0) and lm_head (the last batch), as the reshape hook gave them to the server
    ends = dict(t for batch in kimi_shape.layer_batches(cfg, gain, 0, torch.float32, device,
                                                         batches=[0, cfg["num_hidden_layers"] + 1]) for t in batch)
    embed, head = ends["model.embed_tokens.weight"], ends["lm_head.weight"]
    hot = hot_tokens(seq.tolist() + greedy.clamp(min=0).tolist(), arch.draft_vocab_size, arch.vocab_size).to(device)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed)
        draft.lm_head.weight.copy_(head[hot])
        draft.d2t.copy_(hot - torch.arange(hot.numel(), device=device))
    draft.embed_tokens.weight.requires_grad_(False)
    t0 = time.time()
    log = train_draft(draft, taps.to(device, torch.float32), seq.to(device), greedy.to(device),
                      TrainConfig(iters=iters, batch=16, steps=CHAIN[0], lr=2e-3, seed=seed))
    draft = draft.to(torch.bfloat16 if device == "cuda" else torch.float32)
    save_draft(draft, out, {"torch_dtype": "bfloat16" if device == "cuda" else "float32"})
    served_hot = float(torch.isin(greedy[greedy >= 0].to(device), hot).float().mean())
    return {"path": out, "train": {k: v for k, v in log.items() if k != "loss_curve"}, "loss_curve": log["loss_curve"],
            "seconds": round(time.time() - t0, 1), "hot_tokens": int(hot.numel()),
            "labels_in_the_hot_set": round(served_hot, 4)}


# `eagle3-capture doctor ...` in a process that reports, at its exit, its peak host memory and (on CUDA) the peak
# the torch allocator held: the doctor's cost on a real-width dump
PEAK = "E3_PEAK "
RUN_DOCTOR = f"""
import atexit, json, resource, sys
def peak():
    out = {{"max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        out["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
    print("{PEAK}" + json.dumps(out), file=sys.stderr, flush=True)
atexit.register(peak)
from eagle3_capture.cli import main
sys.exit(main(sys.argv[1:]))
"""


def doctor_online(url: str, prompts_path: str, draft: str, dump: str, new_tokens: int, device: str,
                  out: str, timeout_s: float) -> dict:
    """``doctor online`` against the server (its own process, each of its requests answered within `timeout_s`,
    the whole run within twice that)."""
    t0 = time.time()
    cmd = [sys.executable, "-c", RUN_DOCTOR, "doctor", "online", "--server", url, "--prompts", prompts_path,
           "--draft", draft, "--dump", dump, "--new-tokens", str(new_tokens), "--json", out, "--no-progress",
           "--device", device, "--timeout", f"{timeout_s:.0f}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (os.path.join(REPO, "python"),
                                                                      os.environ.get("PYTHONPATH")))))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=2 * timeout_s)
    peaks = [json.loads(ln[len(PEAK):]) for ln in r.stderr.splitlines() if ln.startswith(PEAK)]
    return {"code": r.returncode, "seconds": round(time.time() - t0, 1), "peak": peaks[-1] if peaks else None,
            "text": r.stdout[-6000:], "err": r.stderr[-3000:],
            "json": json.load(open(out)) if os.path.exists(out) else None}


PHASES = ("collect", "train", "online", "miswired", "all")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--phase", choices=PHASES, default="all",
                   help="collect, train (its own process, which exits before any server starts), online; all: the "
                        "three in turn (train still in a child process); miswired: the fingerprint at depth")
    p.add_argument("--state", default=None,
                   help="where collect leaves the dump's taps and train the draft for the next phase (default "
                        "OUT/state; on the GPU machine a fixed folder that survives between back-to-back calls)")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--gain", type=float, default=GAIN, help="kimi_shape's projection gain for the target")
    p.add_argument("--prompts", type=int, default=32, help="served and teacher-forced for training")
    p.add_argument("--held-out", type=int, default=8, help="prompts for doctor online (not trained on)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--train-iters", type=int, default=300)
    p.add_argument("--min-accept-length", type=float, default=MIN_ACCEPT_LENGTH,
                   help="online: the served accept length the trained draft must exceed (a CPU dry run, whose few "
                        "prompts teach the draft nothing that carries to held-out ones, passes 1)")
    p.add_argument("--budget-s", type=float, default=560)
    p.add_argument("--mem-fraction", type=float, default=0.6)
    p.add_argument("--small", action="store_true", help="kimi_shape.SMALL widths (a dry run)")
    p.add_argument("--layers", type=int, default=None, help="override the target's 61 layers (a dry run: >= 8)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--miswired", action="store_true", help="the same as --phase miswired")
    p.add_argument("--plan", default=None, help="kimi_plan.py's JSON for this phase (recorded in the result)")
    p.add_argument("--result", default=None)
    p.add_argument("--command", default=None)
    a = p.parse_args(argv)
    if a.miswired:
        a.phase = "miswired"
    if min(a.prompts, a.held_out, a.prompt_len, a.new_tokens, a.train_iters) < 1:
        p.error("--prompts, --held-out, --prompt-len, --new-tokens and --train-iters must be >= 1")
    if not 1.0 <= a.min_accept_length <= 1 + CHAIN[0]:
        p.error(f"--min-accept-length must be in [1, {1 + CHAIN[0]}] (num-steps {CHAIN[0]} + 1), got "
                f"{a.min_accept_length}")
    if a.device == "cpu" and not a.small:
        p.error("--device cpu needs --small (a 44 GB target does not fit the CPU machine)")
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    state = a.state or os.path.join(a.out, "state")
    os.makedirs(state, exist_ok=True)
    cfg = target_of(a, p)
    kept = os.path.join(state, "target", "config.json")
    if a.phase in ("train", "online"):  # the target collect served: the next phases must serve the same one
        if not os.path.exists(kept):
            p.error(f"--phase {a.phase} needs the collect phase's files in {state} (target/config.json missing): "
                    "run --phase collect first")
        with open(kept) as f:
            cfg_kept = json.load(f)
        if cfg_kept != cfg:
            p.error(f"--phase {a.phase}: {state} holds a target with {cfg_kept['n_routed_experts']} experts and "
                    f"{cfg_kept['num_hidden_layers']} layers; these arguments name {cfg['n_routed_experts']} and "
                    f"{cfg['num_hidden_layers']}: give the collect phase's --experts/--layers/--small")
    left = lambda: a.budget_s - (time.time() - t_start)  # noqa: E731
    result: Dict[str, object] = {"what": "a draft trained on the Kimi-shaped server's own dump; doctor online "
                                         "against that server", "phase": a.phase,
                                 "command": a.command or " ".join(sys.argv), "machine": machine(),
                                 "device": a.device, "gain": a.gain, "state": state,
                                 "plan": json.load(open(a.plan)) if a.plan else None, "target":
                                 {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "n_routed_experts",
                                                      "num_experts_per_tok", "vocab_size")},
                                 "prompts": a.prompts, "held_out": a.held_out, "new_tokens": a.new_tokens,
                                 "min_accept_length": a.min_accept_length, "pid": os.getpid(),
                                 "started_at": t_start}

    def finish(ok: bool, failures: List[str]) -> int:
        result["ok"], result["failures"] = ok, failures
        result["finished_at"] = time.time()
        result["seconds"] = round(result["finished_at"] - t_start, 1)
        for path in filter(None, (os.path.join(a.out, f"kimi_{a.phase}.json"), a.result)):
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
        print(json.dumps({k: result.get(k) for k in ("phase", "ok", "failures", "seconds")}), flush=True)
        return 0 if ok else 1

    context = a.prompt_len + a.new_tokens + 2 * (CHAIN[0] + 1) + 8
    base_env = {RESHAPE_ENV: f"{a.gain}:0", **(CPU_DRY_RUN_ENV if a.device == "cpu" else {})}
    if a.phase == "miswired":
        target = write_target(cfg, a.out)
        held_path = write_prompts(a, cfg, a.out)[1]
        untrained = write_draft("llama", cfg, os.path.join(a.out, "draft_untrained"), device=a.device)["path"]
        return finish(*miswired(a, cfg, target, untrained, held_path, context, base_env, left, result))
    steps = ["collect", "train", "online"] if a.phase == "all" else [a.phase]
    failures: List[str] = []
    for step in steps:
        try:
            if step == "collect":
                result["collect"] = collect(a, cfg, state, context, base_env, left)
            elif step == "train":
                result["train"] = (train_in_child(a, state, argv) if a.phase == "all" else
                                   train(a, cfg, state))
            else:
                failures = online_phase(a, cfg, state, context, base_env, left, result)
        except Exception as e:  # the step that failed is the result
            return finish(False, [f"{step}: {type(e).__name__}: {e}"[:2000]])
    return finish(not failures, failures)


def write_target(cfg: dict, where: str) -> str:
    target = os.path.join(where, "target")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return target


def write_prompts(a, cfg: dict, where: str):
    """The training prompts and the held-out ones (a fixed seed: every phase and every run draws the same)."""
    every = prompts(a.prompts + a.held_out, a.prompt_len, cfg["vocab_size"], seed=5)
    train_ps, held = every[:a.prompts], every[a.prompts:]
    held_path = os.path.join(where, "held_out_prompts.json")
    with open(held_path, "w") as f:
        json.dump(held, f)
    return train_ps, held_path


def collect(a, cfg: dict, state: str, context: int, base_env: dict, left) -> dict:
    """Phase 1: the untrained draft's server with its full-stream dump on serves the training prompts, then the
    doctor's teacher-forced pass; the taps at the draft's ids, the tokens and the greedy labels go to
    STATE/train_data.pt for the train phase."""
    import torch

    from eagle3_capture.doctor.target_side.server_side import ServerTarget
    from eagle3_capture.doctor.target_side.side import layer_inputs
    from eagle3_capture.spec import TapSpec

    target = write_target(cfg, state)
    train_ps, _ = write_prompts(a, cfg, state)
    untrained = write_draft("llama", cfg, os.path.join(state, "draft_untrained"), device=a.device)["path"]
    dump = os.path.join(state, "dump_collect")
    with Server("collect", target, untrained, a.out, {**base_env, "EAGLE3_CAPTURE_DUMP": dump, **DUMP_ENV},
                a.device, context, a.mem_fraction, max(60.0, left() - 60)) as srv:
        t0 = time.time()
        outs = serve(srv.url, train_ps, a.new_tokens, max(60.0, left()))
        side = ServerTarget.teacher_force(srv.url, dump, train_ps, outs, CHAIN[0], timeout=max(60.0, left()),
                                          vocab_size=cfg["vocab_size"])
        spec = TapSpec.from_draft_ids(draft_ids(cfg["num_hidden_layers"]), cfg["num_hidden_layers"],
                                      cfg["hidden_size"])
        batch = side.batch(train_ps, list(range(len(train_ps))), a.new_tokens, layer_inputs(spec))
        figures = {"server_start_s": srv.start_s, "server_launched_at": srv.launched_at,
                   "graph_options": srv.graph_options,
                   "seconds": round(time.time() - t0, 1),
                   "distinct_served_tokens_per_prompt": round(sum(len(set(o)) for o in outs) / len(outs), 2),
                   "taps": list(batch.taps.shape), "notes": side.notes[:4]}
    torch.save({"taps": batch.taps, "seq": batch.seq, "greedy": batch.greedy}, os.path.join(state, "train_data.pt"))
    with open(os.path.join(state, "collect.json"), "w") as f:
        json.dump(figures, f, indent=1)
    return figures


def train(a, cfg: dict, state: str) -> dict:
    """Phase 2 (its own process: every byte it held is free before the online server loads): the draft trained on
    collect's taps, saved to STATE/draft_trained."""
    import torch

    data_path = os.path.join(state, "train_data.pt")
    if not os.path.exists(data_path):
        raise FileNotFoundError(f"{data_path}: the collect phase's taps are not there (run --phase collect first)")
    data = torch.load(data_path)
    out = trained_draft(cfg, a.gain, data["taps"], data["seq"], data["greedy"], a.train_iters, a.device,
                        os.path.join(state, "draft_trained"))
    # who trained, and when it was done: the online phase checks that this process is gone before its server loads
    out["process"] = {"pid": os.getpid(), "cmdline": _cmdline(os.getpid()), "finished_at": time.time()}
    with open(os.path.join(state, "train.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def train_in_child(a, state: str, argv) -> dict:
    """--phase all: the train phase in a child process, which has exited (its memory with it) when this returns."""
    args = list(argv if argv is not None else sys.argv[1:])
    drop = {"--phase", "--result", "--state", "--plan"}
    kept, skip = [], False
    for x in args:
        if skip:
            skip = False
            continue
        if x in drop:
            skip = True
            continue
        if x == "--miswired" or any(x.startswith(d + "=") for d in drop):
            continue
        kept.append(x)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *kept, "--phase", "train", "--state", state],
                       capture_output=True, text=True, cwd=REPO, timeout=3600)
    if r.returncode != 0 or not os.path.exists(os.path.join(state, "train.json")):
        raise RuntimeError(f"the train phase exited {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    with open(os.path.join(state, "train.json")) as f:
        return json.load(f)


def online_phase(a, cfg: dict, state: str, context: int, base_env: dict, left, result: dict) -> List[str]:
    """Phase 3: a server serving the trained draft (its dump on), doctor online on the held-out prompts; the
    failures (none: the draft accepts and the prediction is the served figures, near-ties aside)."""
    draft_dir = os.path.join(state, "draft_trained")
    if not os.path.exists(os.path.join(draft_dir, "model.safetensors")):
        raise FileNotFoundError(f"{draft_dir}: no trained draft (run --phase train first)")
    target, held_path = os.path.join(state, "target"), os.path.join(state, "held_out_prompts.json")
    if "train" not in result and os.path.exists(os.path.join(state, "train.json")):
        with open(os.path.join(state, "train.json")) as f:
            result["train"] = json.load(f)
    dump2 = os.path.join(a.out, "dump_online")
    trainer = (result.get("train") or {}).get("process") or {}
    running = trainer_running(trainer)  # just before the launch
    with Server("online", target, draft_dir, a.out, {**base_env, "EAGLE3_CAPTURE_DUMP": dump2, **DUMP_ENV},
                a.device, context, a.mem_fraction, max(60.0, left() - 60)) as srv:
        result["handoff"] = handoff(trainer, srv.launched_at, running)
        online = doctor_online(srv.url, held_path, draft_dir, dump2, a.new_tokens, a.device,
                               os.path.join(a.out, "online.json"), max(60.0, left()))
        online["server_start_s"], online["graph_options"] = srv.start_s, srv.graph_options
        online["server_launched_at"] = srv.launched_at
    result["online"] = online
    written = [os.path.join(r, f) for r, _, fs in os.walk(dump2) for f in fs] if os.path.isdir(dump2) else []
    result["dump_online"] = {"files": len(written), "bytes": sum(os.path.getsize(f) for f in written)}
    return result["handoff"]["failures"] + judge_online(online, result, a.min_accept_length)


def _cmdline(pid: int) -> Optional[str]:
    """A process's command line (None when it is gone, or on a system without /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def trainer_running(trainer: dict) -> bool:
    """Whether the process train.json names is still running (that pid, still that program)."""
    return trainer.get("pid") is not None and _cmdline(trainer["pid"]) == trainer.get("cmdline")


def handoff(trainer: dict, launched_at: float, running: bool) -> dict:
    """Whether the process that trained the draft (train.json's ``process``) had finished, and was gone
    (``running``: :func:`trainer_running` just before the launch), when the online server was launched (a server
    started beside the trainer was killed during its load on the H100); the failures, none when so."""
    pid, done = trainer.get("pid"), trainer.get("finished_at")
    out = {"trainer_pid": pid, "trainer_finished_at": done, "server_launched_at": launched_at,
           "trainer_running_at_launch": running, "failures": []}
    if pid is None or done is None:
        out["failures"].append("train.json does not say which process trained the draft, or when it finished")
    elif pid == os.getpid() or running or done >= launched_at:
        out["failures"].append(f"the training process {pid} had not exited when the online server was launched "
                               f"(finished at {done}, launched at {launched_at}, still running: {running})")
    return out


def judge_online(online: dict, result: dict, min_accept: float = MIN_ACCEPT_LENGTH) -> List[str]:
    """The online phase's criterion: the draft accepts (served accept length > `min_accept`, 1.5 unless a dry run
    says otherwise) and doctor online's prediction is what the server served (verify counts and histograms per
    prompt, near-tie positions aside)."""
    failures = []
    if online["code"] != 0:
        failures.append(f"doctor online exited {online['code']}: {online['err'][-400:] or online['text'][-400:]}")
    served = online_figure(online["json"], "online")
    predicted = online_figure(online["json"], "predicted")
    j = online["json"] or {}
    result["accept_length"] = {"served": served, "predicted": predicted}
    equal = isinstance(j.get("online"), dict) and isinstance(j.get("predicted"), dict) and all(
        j["online"].get(k) == j["predicted"].get(k) for k in ("completion_tokens", "verify_ct",
                                                               "correct_drafts_histogram"))
    result["online_equals_offline"] = {"verdict": j.get("verdict"), "ok": j.get("ok"), "counts_equal": equal,
                                       "near_ties": j.get("near_ties")}
    if served is None or served <= min_accept:
        failures.append(f"the trained draft does not accept: served accept length {served} <= {min_accept}")
    if not j.get("ok"):
        failures.append(f"predicted != served: {j.get('verdict')}")
    return failures


def miswired(a, cfg: dict, target: str, draft: str, held_path: str, context: int, base_env: dict, left,
             result: dict):
    """The fingerprint at depth: the server serves the draft with every id one layer later (LayerOutput(k + 1)),
    the doctor is given the draft as trained; the online check must fail (exit 1) and name each served slot as
    the layer after the declared one, bit for bit from the full stream of the same forwards. (ok, failures)."""
    ids = draft_ids(cfg["num_hidden_layers"])
    later = os.path.join(a.out, "draft_one_layer_later")
    os.makedirs(later, exist_ok=True)
    with open(os.path.join(draft, "config.json")) as f:
        dcfg = json.load(f)
    dcfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]
    with open(os.path.join(later, "config.json"), "w") as f:
        json.dump(dcfg, f, indent=1)
    link = os.path.join(later, "model.safetensors")
    if not os.path.lexists(link):
        os.symlink(os.path.join(draft, "model.safetensors"), link)
    dump = os.path.join(a.out, "dump_miswired")
    try:
        with Server("miswired", target, later, a.out, {**base_env, "EAGLE3_CAPTURE_DUMP": dump, **DUMP_ENV},
                    a.device, context, a.mem_fraction, max(60.0, left() - 60)) as srv:
            online = doctor_online(srv.url, held_path, draft, dump, a.new_tokens, a.device,
                                   os.path.join(a.out, "online_miswired.json"), max(60.0, left()))
            online["server_start_s"] = srv.start_s
    except Exception as e:
        return False, [f"miswired: {type(e).__name__}: {e}"[:2000]]
    fp = ((online["json"] or {}).get("fingerprint") or {}).get("slots") or []
    slots = [{k: s.get(k) for k in ("verdict", "best", "expected", "margin", "ok")} for s in fp]
    result["what"] = "a server serving its draft's taps one layer later: doctor online names each slot"
    result["miswired"] = {"code": online["code"], "seconds": online["seconds"], "peak": online["peak"],
                          "slots": slots, "verdict": (online["json"] or {}).get("verdict"), "text": online["text"]}
    want = [(i + 2, i + 1) for i in ids]  # layer inputs: served LayerOutput(k + 1) = k + 2, declared k + 1
    failures = []
    if online["code"] != 1:
        failures.append(f"doctor online exited {online['code']} on the miswired server, expected 1: "
                        f"{online['err'][-400:]}")
    got = [(s.get("best"), s.get("expected")) for s in fp]
    if got != want or any(s.get("verdict") != "exact" for s in fp):
        failures.append(f"the fingerprint named (served, declared) layer inputs {got} with verdicts "
                        f"{[s.get('verdict') for s in fp]}, expected {want}, each exact")
    return not failures, failures


def online_figure(report: Optional[dict], which: str) -> Optional[float]:
    """doctor online's served accept length of `which` ("online": what the server served, "predicted": the
    doctor's replay from the dump); None when absent."""
    part = report.get(which) if isinstance(report, dict) else None
    v = part.get("served_accept_length") if isinstance(part, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


if __name__ == "__main__":
    sys.exit(main())
