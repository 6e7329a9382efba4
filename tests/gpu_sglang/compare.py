"""SGLang 0.5.23's real serving loop on one GPU, CUDA graphs on against off, with this project's plugin and
without it (test-only, tests/gpu_sglang; run by scripts/gpu_sglang.sh after make_pair.py).

Serves the demo pair once per configuration (tests/gpu_sglang/serve_gpu.py, its own process each, every one
time-boxed inside one deadline), in this order:

    plugin_eager   plugin on, --disable-cuda-graph, capture dump on
    plugin_graphs  plugin on, CUDA graphs on (SGLang's defaults: decode FULL, prefill BREAKABLE), capture dump on
    stock_graphs   stock SGLang (EAGLE3_CAPTURE_DISABLE=all: the plugin registers nothing), the draft's ids in
                   stock's own convention, CUDA graphs on
    stock_eager    the same with --disable-cuda-graph (only if time is left)

and reports, in one JSON: the same greedy outputs (graphs on vs off, plugin vs stock, each vs the target's own
transformers greedy continuation), the same per-request verify counts and accept histograms, the plugin's startup
and self-test lines, what the capture dump holds (served prompts or only CUDA-graph warm-ups), and tokens/s of
round 2 (plugin against stock, graphs on and off). A configuration that fails is reported with its error and the
tail of its log, and the rest still run.

    python tests/gpu_sglang/compare.py --pair DIR --out DIR [--budget-s 400] [--result PATH] [--only NAMES]

Exit status: 0 when every configuration that ran served and every comparison held, 1 otherwise (the JSON says
which), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Dict, List

from report import (accept_figures, comparisons, compare_requests, dump_index, findings, log_checks, per_request,
                    read_jsonl, speed, verdict)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STANDINS = os.path.join(HERE, "standins")

ORDER = ("plugin_eager", "plugin_graphs", "stock_graphs", "stock_eager")
CHAIN = (3, 1, 4)  # num-steps, eagle-topk, num-draft-tokens: SGLang's auto values for DeepSeek targets
DUMP_MAX = 32

def config_table(pair: dict, out: str) -> Dict[str, dict]:
    dumps = os.path.join(out, "dumps")
    plugin_env = {"EAGLE3_CAPTURE_DUMP_MAX": str(DUMP_MAX)}
    return {
        "plugin_eager": {"graph": "off", "draft": pair["draft"],
                         "env": {**plugin_env, "EAGLE3_CAPTURE_DUMP": os.path.join(dumps, "plugin_eager")}},
        "plugin_graphs": {"graph": "on", "draft": pair["draft"],
                          "env": {**plugin_env, "EAGLE3_CAPTURE_DUMP": os.path.join(dumps, "plugin_graphs")}},
        "stock_graphs": {"graph": "on", "draft": pair["draft_stock"], "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
        "stock_eager": {"graph": "off", "draft": pair["draft_stock"], "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
    }


# a dry run on a machine without a GPU: SGLang's CPU path with the CPU engine tests' stand-ins (no CUDA graphs)
CPU_DRY_RUN_ENV = {"E3_SGLANG_CPU_STANDINS": "1", "TRITON_INTERPRET": "1", "TORCHDYNAMO_DISABLE": "1"}


def config_graph(name: str) -> str:
    return "off" if name.endswith("_eager") else "on"


def child_env(extra: Dict[str, str], device: str = "cuda") -> Dict[str, str]:
    """The server's environment: on CUDA the compiled-package stand-ins importable in every SGLang process and the
    kernel version check off; the plugin's switches unset unless the configuration sets them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_CAPTURE")}
    if device == "cuda":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), STANDINS) if p)
        env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"
    else:
        env.update(CPU_DRY_RUN_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------------------------------
# reading a run
# ------------------------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------------------------

def run_config(name: str, cfg: dict, pair: dict, out: str, timeout_s: float, timed_repeats: int,
               new_tokens: int, log, device: str = "cuda") -> dict:
    odir = os.path.join(out, "runs", name)
    os.makedirs(odir, exist_ok=True)
    s, k, d = CHAIN
    cmd = [sys.executable, os.path.join(HERE, "serve_gpu.py"), "--target", pair["target"], "--draft", cfg["draft"],
           "--prompts", pair["prompts"], "--out-dir", odir, "--cuda-graph", cfg["graph"], "--steps", str(s),
           "--topk", str(k), "--draft-tokens", str(d), "--new-tokens", str(new_tokens),
           "--timed-repeats", str(timed_repeats), "--device", device]
    log(f"--- {name}: cuda graphs {cfg['graph']}, env {cfg['env']}, timeout {timeout_s:.0f} s")
    t0 = time.time()
    logpath = os.path.join(odir, "server.log")
    rc = None
    with open(logpath, "w") as lf:
        try:
            p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=child_env(cfg["env"], device),
                                 cwd=REPO, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                rc = "timeout"
        except OSError as e:
            rc = f"could not start: {e}"
    seconds = round(time.time() - t0, 1)
    with open(logpath, errors="replace") as f:
        text = f.read()
    summary = {}
    spath = os.path.join(odir, "summary.json")
    if os.path.exists(spath):
        with open(spath) as f:
            summary = json.load(f)
    r1, r2 = read_jsonl(os.path.join(odir, "round1.jsonl")), read_jsonl(os.path.join(odir, "round2.jsonl"))
    res = {"name": name, "cuda_graph": cfg["graph"], "draft": os.path.basename(cfg["draft"]), "env": cfg["env"],
           "rc": rc, "seconds": seconds, "ok": rc == 0 and bool(r1), "error": summary.get("error"),
           "engine_start_s": summary.get("engine_start_s"), "round1": summary.get("round1"),
           "round2": summary.get("round2"), "server_info": summary.get("server_info"),
           "log": log_checks(text), "round1_rows": r1, "round2_rows": r2}
    if rc == "timeout":
        res["error"] = f"timed out after {timeout_s:.0f} s (at: {_last_stage(text)})"
    if not res["ok"]:
        res["log_tail"] = text[-6000:]
        res["first_error_lines"] = _first_errors(text)
    if r2 and r1:
        reps = len(r2) // len(r1)
        res["round2_equals_round1"] = compare_requests(per_request(r1) * reps, per_request(r2),
                                                       fields=("output_ids",))
    log(f"    {name}: rc {rc} in {seconds} s; start {res['engine_start_s']} s; round1 {res['round1']}; "
        f"round2 {res['round2']}; error {res['error']}")
    return res


def _last_stage(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][-200:] if lines else "no output"


def _first_errors(text: str) -> List[str]:
    """The lines that name the first failure: exception lines after the first traceback."""
    out = []
    for ln in text.splitlines():
        if re.search(r"(Error|Exception|NotImplemented)\b.*:", ln) and "Warning" not in ln:
            out.append(ln.strip()[-400:])
        if len(out) >= 6:
            break
    return out


def machine() -> dict:
    m = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        m["torch"] = torch.__version__
        m["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            m["gpu"] = torch.cuda.get_device_name(0)
            m["capability"] = list(torch.cuda.get_device_capability(0))
    except Exception as e:
        m["torch_error"] = str(e)
    from importlib import metadata

    for dist in ("triton", "transformers", "sglang", "apache-tvm-ffi", "xgrammar", "eagle3-capture"):
        try:
            m[dist] = metadata.version(dist)
        except Exception as e:  # not installed: say so rather than fail the report
            m[dist] = f"not installed ({type(e).__name__})"
    try:
        m["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                      "--format=csv,noheader"], capture_output=True, text=True,
                                     timeout=20).stdout.strip()
    except Exception:
        pass
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", required=True, help="make_pair.py's output directory (with pair.json)")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=400, help="one deadline for every server (seconds)")
    p.add_argument("--per-config-s", type=float, default=200, help="at most this long per server")
    p.add_argument("--min-s", type=float, default=45, help="do not start a server with less time left than this")
    p.add_argument("--only", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    p.add_argument("--timed-repeats", type=int, default=4)
    p.add_argument("--result", default=None, help="write the result JSON here too")
    p.add_argument("--command", default=None, help="the command line to record in the result")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of the pipeline on SGLang's CPU path (the *_eager configurations only)")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        p.error(f"--only: unknown configuration(s) {unknown}; expected some of {list(ORDER)}")
    if a.device == "cpu" and any(config_graph(n) == "on" for n in names):
        p.error("--device cpu runs no CUDA graphs: choose the *_eager configurations with --only")
    deadline = time.time() + a.budget_s
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "compare.log"), "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    with open(os.path.join(a.pair, "pair.json")) as f:
        pair = json.load(f)
    if "target" not in pair:
        log(f"no pair: {pair}")
        return 1
    with open(pair["prompts"]) as f:
        prompts = json.load(f)
    reference = None
    if pair.get("reference") and os.path.exists(pair["reference"]):
        with open(pair["reference"]) as f:
            reference = json.load(f)["outputs"]
    table = config_table(pair, a.out)
    runs: Dict[str, dict] = {}
    skipped = {}
    for n in names:
        left = deadline - time.time()
        if left < a.min_s:
            skipped[n] = f"not started: {left:.0f} s left of the budget"
            log(f"--- {n}: {skipped[n]}")
            continue
        r = run_config(n, table[n], pair, a.out, min(a.per_config_s, left), a.timed_repeats, pair["new_tokens"], log,
                       a.device)
        if "EAGLE3_CAPTURE_DUMP" in table[n]["env"]:
            summ = {}
            sp = os.path.join(a.out, "runs", n, "summary.json")
            if os.path.exists(sp):
                with open(sp) as f:
                    summ = json.load(f)
            r["dump"] = dump_index(table[n]["env"]["EAGLE3_CAPTURE_DUMP"], prompts, summ.get("windows"))
        runs[n] = r
    comp = comparisons(runs, reference)
    result = {
        "what": "SGLang 0.5.23's real serving loop (sglang.Engine, EAGLEWorkerV2) on one GPU with the demo pair "
                "(tiny DeepseekV3 target + trained LlamaForCausalLMEagle3 draft, float32, triton attention, chain "
                f"{CHAIN[0]}/{CHAIN[1]}/{CHAIN[2]}): CUDA graphs on vs off, plugin vs stock SGLang given ids in its "
                "own convention; sgl_kernel / flash_mla / cutlass stood in by tests/gpu_sglang/standins",
        "command": a.command or " ".join(sys.argv), "machine": machine(), "pair": pair,
        "prompts": len(prompts), "new_tokens": pair["new_tokens"], "timed_repeats": a.timed_repeats,
        "device": a.device,
        "environment": {k: os.environ.get(k) for k in ("TORCHDYNAMO_DISABLE", "CUDA_VISIBLE_DEVICES")},
        "configs": {n: {k: v for k, v in r.items() if k not in ("round1_rows", "round2_rows")}
                    for n, r in runs.items()},
        "accept": {n: accept_figures(r["round1_rows"]) for n, r in runs.items() if r.get("ok")},
        "comparisons": comp, "speed": speed(runs), "skipped": skipped, "findings": findings(runs),
    }
    result["failures"] = verdict(runs, comp) + [f"{n}: {why}" for n, why in skipped.items()]
    result["ok"] = not result["failures"]
    for path in filter(None, (os.path.join(a.out, "gpu_sglang.json"), a.result)):
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    log(f"speed: {result['speed']}")
    for line in result["findings"]:
        log(f"finding: {line}")
    for line in result["failures"] or ["every comparison held"]:
        log(f"result: {line}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
