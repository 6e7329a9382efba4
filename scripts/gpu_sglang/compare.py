"""SGLang 0.5.23's real serving loop on one GPU, CUDA graphs on against off, with this project's plugin and
without it (scripts/gpu_sglang; run by scripts/gpu_sglang.sh after make_pair.py).

Serves the demo pair once per configuration (scripts/gpu_sglang/serve_gpu.py, its own process each, every one
time-boxed inside one deadline):

    plugin_eager    plugin on, --disable-cuda-graph, capture dump on
    plugin_graphs   plugin on, CUDA graphs on (SGLang's defaults: decode FULL, prefill BREAKABLE), capture dump on
    stock_graphs    stock SGLang (EAGLE3_CAPTURE_DISABLE=all: the plugin registers nothing), the draft's ids in
                    stock's own convention, CUDA graphs on
    plugin_metrics  plugin on, CUDA graphs on, SGLang's Prometheus metrics on (--enable-metrics: the plugin counts
                    per-position acceptance), the pair's expected-acceptance profile (EAGLE3_CAPTURE_PROFILE) when
                    make_pair.py could write one; no capture dump
    stock_eager     stock SGLang with --disable-cuda-graph

Side by side (the default on CUDA) every server starts at once; once all are through round 1 the timed rounds are
released one server at a time: the eager servers' (``--eager-rounds``) first, then ``--rounds`` R rounds of each
graph-on server INTERLEAVED -- round r releases plugin_graphs, stock_graphs, plugin_metrics with the order rotated
by r - 1 (:func:`interleaved`), so drift (clocks, other load) falls on every configuration alike and none always
goes first. A round is released only while the deadline leaves time for it; when time runs short the rest are not
released (the servers are told to stop and shut down) and the JSON says how many ran.

Reported, in one JSON: the same greedy outputs (graphs on vs off, plugin vs stock, plugin_metrics vs stock_graphs,
each vs the target's own transformers greedy continuation), the same per-request verify counts and accept
histograms, the plugin's startup and self-test lines, what the capture dump holds (served prompts or only CUDA-graph
warm-ups), the metrics plugin_metrics exported, and tokens/s per timed round with median and min/max per
configuration and the ratios plugin_graphs / stock_graphs and plugin_metrics / stock_graphs per round (report.py).
A configuration that fails is reported with its error and the tail of its log, and the rest still run.
``--device cpu`` is a dry run on SGLang's CPU path (the CPU engine tests' stand-ins): the same table, every server
with graphs off (there are none on the CPU), one after another.

    python scripts/gpu_sglang/compare.py --pair DIR --out DIR [--budget-s 400] [--rounds 5] [--result PATH]
        [--only NAMES]

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
from typing import Dict, List, Optional, Sequence, Tuple

from report import (STARTUP, accept_figures, comparisons, compare_requests, dump_index, findings, log_checks,
                    per_request, profile_check, read_jsonl, speed, startup_taps, verdict)
from make_pair import CHAIN  # num-steps, eagle-topk, num-draft-tokens (SGLang's auto values for DeepSeek targets)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STANDINS = os.path.join(HERE, "standins")

ORDER = ("plugin_eager", "plugin_graphs", "stock_graphs", "plugin_metrics", "stock_metrics", "stock_eager")
# added by themselves when the pair has a draft without the embedding tap (make_pair.py: a release that cannot
# capture it, 0.5.12): plugin = stock on that copy
NOEMB = ("plugin_noemb_graphs", "stock_noemb_graphs")
DUMP_MAX = 32

def config_table(pair: dict, out: str, device: str = "cuda") -> Dict[str, dict]:
    """Every configuration's CUDA-graph mode, draft and plugin switches. On the CPU (a dry run: no CUDA graphs there)
    every configuration is served with graphs off under its own name, so the dry run goes through the GPU run's
    whole table -- the metrics server and the no-embedding pair included -- and each run's JSON says graphs off."""
    table = _configs(pair, out)
    if device == "cpu":
        for cfg in table.values():
            cfg["graph"] = "off"
    return table


def _configs(pair: dict, out: str) -> Dict[str, dict]:
    dumps = os.path.join(out, "dumps")
    return {
        # eager: every forward runs the hooks, DUMP_MAX reaches past the first prefills into served traffic
        "plugin_eager": {"graph": "off", "draft": pair["draft"],
                         "env": {"EAGLE3_CAPTURE_DUMP_MAX": str(DUMP_MAX),
                                 "EAGLE3_CAPTURE_DUMP": os.path.join(dumps, "plugin_eager")}},
        # graphs: the plugin's default bounds; the dump must hold served forwards only, verifies replayed from
        # graphs among them (never SGLang's warm-up and capture passes)
        "plugin_graphs": {"graph": "on", "draft": pair["draft"],
                          "env": {"EAGLE3_CAPTURE_DUMP": os.path.join(dumps, "plugin_graphs")}},
        "stock_graphs": {"graph": "on", "draft": pair["draft_stock"], "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
        # the plugin with SGLang's metrics on: what counting acceptance (and watching it against the profile) costs
        # beside plugin_graphs; no dump, whose writes would be inside its tokens/s
        "plugin_metrics": {"graph": "on", "draft": pair["draft"], "metrics": True,
                           "env": {"EAGLE3_CAPTURE_PROFILE": pair["profile"]} if pair.get("profile") else {}},
        # stock SGLang with its metrics on: plugin_metrics' baseline (SGLang's own metrics cost per step too)
        "stock_metrics": {"graph": "on", "draft": pair["draft_stock"], "metrics": True,
                          "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
        "stock_eager": {"graph": "off", "draft": pair["draft_stock"], "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
        # a release that cannot capture the embedding (0.5.12): plugin = stock on a copy with LayerOutput taps only
        # (its own taps in the plugin's startup line)
        "plugin_noemb_graphs": {"graph": "on", "draft": pair.get("draft_noemb"), "env": {},
                                "taps": startup_taps(pair.get("noemb_ids") or [])},
        "stock_noemb_graphs": {"graph": "on", "draft": pair.get("draft_noemb"),
                               "env": {"EAGLE3_CAPTURE_DISABLE": "all"}},
    }


# a dry run on a machine without a GPU: SGLang's CPU path with the CPU engine tests' stand-ins (no CUDA graphs)
CPU_DRY_RUN_ENV = {"E3_SGLANG_CPU_STANDINS": "1", "TRITON_INTERPRET": "1", "TORCHDYNAMO_DISABLE": "1"}


# On the GPU machine (torch 2.11): the sglang-kernel version check off (stand-ins), SGLang's own Python radix-tree
# core instead of its Rust one (mem_cache.*.so links torch 2.14's libtorch through tch and panics on torch 2.11 at
# the first cache insert: "Rust TreeCore panicked: ... UnknownKind(31)"), and fewer inductor compile workers per
# server (servers start side by side). flashinfer is not on the machine; releases up to 0.5.12 import
# flashinfer.sampling unguarded on CUDA, so a stand-in provides that one module (scripts/gpu_sglang/standins), and
# SGLANG_IS_FLASHINFER_AVAILABLE=false keeps SGLang from taking that stand-in for flashinfer anywhere else; likewise
# deep_gemm (imported unguarded by 0.5.20) and SGLANG_ENABLE_JIT_DEEPGEMM=false.
CUDA_ENV = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1", "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
            "TORCHINDUCTOR_COMPILE_THREADS": "4", "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
            "SGLANG_ENABLE_JIT_DEEPGEMM": "false"}


def config_graph(name: str) -> str:
    return "off" if name.endswith("_eager") else "on"


# a dry run's folder of import-only stand-ins per PYTHONPATH ("" when that SGLang release needs none)
_CPU_KERNEL_STANDIN: Dict[str, str] = {}
_NEEDS_KERNEL_STANDIN = """
import os, sys
from e3_sglang_cpu import sgl_kernel_standin as s
modules = s.needed_modules()
print(s.make_folder(os.path.join(sys.argv[1], "+".join(modules)), modules) if modules else "")
"""


def cpu_kernel_standin(env: Dict[str, str]) -> str:
    """A CPU dry run of a release that imports sgl_kernel whatever the device (0.5.12: its memory pool, reached from
    the scheduler) needs the import-only sgl_kernel on its servers' path, as the release smoke's servers get it
    (tests/sglang_cpu_plugin/e3_sglang_cpu/sgl_kernel_standin.py); later releases must not see it (they would take
    it for the real one). Decided once per PYTHONPATH in a child process with the servers' environment (this
    process never imports SGLang): a folder holding only the stand-ins that release needs (one folder per set, so
    one release's never reach another's path), or "" when it needs none."""
    key = env.get("PYTHONPATH", "")
    if key not in _CPU_KERNEL_STANDIN:
        root = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"e3-import-standins-{os.getuid()}")
        p = subprocess.run([sys.executable, "-c", _NEEDS_KERNEL_STANDIN, root], capture_output=True, text=True,
                           env=env, cwd=REPO, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"checking whether this SGLang needs the import-only sgl_kernel failed (exit "
                               f"{p.returncode}): {p.stderr[-1500:]}")
        lines = p.stdout.strip().splitlines()
        _CPU_KERNEL_STANDIN[key] = lines[-1] if lines else ""
    return _CPU_KERNEL_STANDIN[key]


def child_env(extra: Dict[str, str], device: str = "cuda") -> Dict[str, str]:
    """The server's environment: on CUDA the compiled-package stand-ins importable in every SGLang process and the
    kernel version check off; on the CPU the CPU engine tests' stand-ins (and the import-only sgl_kernel where the
    release needs it, :func:`cpu_kernel_standin`); the plugin's switches unset unless the configuration sets
    them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_CAPTURE")}
    if device == "cuda":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), STANDINS) if p)
        env.update(CUDA_ENV)
    else:
        env.update(CPU_DRY_RUN_ENV)
        folder = cpu_kernel_standin(env)
        if folder:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), folder) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------------------------

SERVE = os.path.join(HERE, "serve_gpu.py")


class Server:
    """One serve_gpu.py process. Side by side (``gated``), it waits after round 1 for ``release(r)`` before each
    timed round r and writes ``done.<r>`` after it, so the servers can start together and still time alone."""

    def __init__(self, name: str, cfg: dict, pair: dict, out: str, timed_repeats: int, new_tokens: int,
                 device: str, gated: bool, rounds: int = 1, mem_fraction: float = 0.2):
        self.name, self.cfg, self.rounds = name, cfg, rounds if timed_repeats else 0
        self.odir = os.path.join(out, "runs", name)
        os.makedirs(self.odir, exist_ok=True)
        self.ready_file = os.path.join(self.odir, "ready")
        s, k, d = CHAIN
        self.cmd = [sys.executable, SERVE, "--target", pair["target"], "--draft",
                    cfg["draft"], "--prompts", pair["prompts"], "--out-dir", self.odir, "--cuda-graph", cfg["graph"],
                    "--steps", str(s), "--topk", str(k), "--draft-tokens", str(d), "--new-tokens", str(new_tokens),
                    "--timed-repeats", str(timed_repeats), "--timed-rounds", str(self.rounds), "--device", device,
                    "--mem-fraction", str(mem_fraction)]
        if cfg.get("metrics"):
            self.cmd.append("--enable-metrics")
        self.cmd += [str(x) for x in cfg.get("serve_args", ())]  # serve_gpu.py's other options (the Kimi run's)
        if gated and self.rounds:
            self.cmd.append("--gated")
        self.device = device
        self.proc = None
        self.rc = None
        self.t0 = None
        self.timeout_note = None
        self.round_s: List[float] = []  # go -> done of each timed round released, as this side saw it
        self.logpath = os.path.join(self.odir, "server.log")

    def start(self, log) -> None:
        log(f"--- {self.name}: cuda graphs {self.cfg['graph']}, env {self.cfg['env']}"
            + (", metrics on" if self.cfg.get("metrics") else ""))
        self.t0 = time.time()
        try:
            with open(self.logpath, "w") as lf:
                self.proc = subprocess.Popen(self.cmd, stdout=lf, stderr=subprocess.STDOUT,
                                             env=child_env(self.cfg["env"], self.device), cwd=REPO,
                                             start_new_session=True)
        except OSError as e:
            self.rc = f"could not start: {e}"

    def reread(self) -> None:
        """--rejudge: the exit status a finished run had (0 when its summary holds no error)."""
        spath = os.path.join(self.odir, "summary.json")
        summary = json.load(open(spath)) if os.path.exists(spath) else {"error": "no summary.json"}
        self.rc = 3 if summary.get("error") else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        return os.path.exists(self.ready_file)

    def _touch(self, name: str) -> None:
        path = os.path.join(self.odir, name)
        with open(path + ".tmp", "w") as f:
            f.write(str(time.time()))
        os.replace(path + ".tmp", path)

    def release(self, r: int) -> None:
        self._touch(f"go.{r}")

    def stop(self) -> None:
        """No more timed rounds: the server shuts down after the one it serves (if any)."""
        self._touch("stop")

    def done(self, r: int) -> bool:
        return os.path.exists(os.path.join(self.odir, f"done.{r}"))

    def expected_round_s(self, default_s: float) -> float:
        """How long its next timed round should take: its slowest so far (with a margin), else the default."""
        return 1.5 * max(self.round_s) if self.round_s else default_s

    def wait_done(self, r: int, timeout_s: float) -> bool:
        """Until done.<r> or the process ended; on a timeout the server is killed. True when the round was served."""
        t0 = time.time()
        while not self.done(r):
            if not self.alive():
                self.wait(0)
                return False
            if time.time() - t0 > timeout_s:
                self.kill(f"timed round {r} not done within {timeout_s:.0f} s")
                return False
            time.sleep(0.02)
        self.round_s.append(time.time() - t0)
        return True

    def wait(self, timeout_s: float, why: str = "") -> None:
        if self.proc is None:
            return
        try:
            self.rc = self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.kill(why or f"timed out after {timeout_s:.0f} s")

    def kill(self, why: str) -> None:
        if self.alive():
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.rc = "timeout"
        self.timeout_note = why

    def result(self, log) -> dict:
        seconds = round(time.time() - self.t0, 1) if self.t0 else None  # None: --rejudge
        text = ""
        if os.path.exists(self.logpath):
            with open(self.logpath, errors="replace") as f:
                text = f.read()
        summary = {}
        spath = os.path.join(self.odir, "summary.json")
        if os.path.exists(spath):
            with open(spath) as f:
                summary = json.load(f)
        r1 = read_jsonl(os.path.join(self.odir, "round1.jsonl"))
        timed = timed_rows(self.odir)
        cfg, rc = self.cfg, self.rc
        # the plugin switches the server really had (its summary records them; --rejudge reads older runs)
        env = ({k: v for k, v in summary["env"].items() if k.startswith("EAGLE3_CAPTURE")}
               if isinstance(summary.get("env"), dict) else cfg["env"])
        res = {"name": self.name, "cuda_graph": cfg["graph"], "draft": os.path.basename(cfg["draft"]),
               "env": env, "metrics_on": bool(cfg.get("metrics")), "rc": rc, "seconds": seconds,
               "ok": rc == 0 and bool(r1), "error": summary.get("error"),
               "engine_start_s": summary.get("engine_start_s"), "round1": summary.get("round1"),
               "round2": summary.get("round2"), "timed": summary.get("timed"), "timed_rounds_asked": self.rounds,
               "stopped_before_round": summary.get("stopped_before_round"),
               "waited_for_timed_round_s": summary.get("waited_for_timed_round_s"),
               "flush_retries": summary.get("flush_retries"),
               "server_info": summary.get("server_info"), "windows": summary.get("windows"),
               "metrics": summary.get("metrics"), "log": log_checks(text, cfg.get("taps", STARTUP)),
               "round1_rows": r1, "timed_rows": timed}
        if rc == "timeout":
            res["error"] = f"{self.timeout_note} (at: {_last_stage(text)})"
        if not res["ok"]:
            res["log_tail"] = text[-6000:]
            res["first_error_lines"] = _first_errors(text)
        if timed and r1:
            # every timed round serves round 1's prompts repeats times over: the same outputs each time
            flat = [row for rows in timed for row in rows]
            reps = len(flat) // len(r1)
            res["timed_equal_round1"] = compare_requests(per_request(r1) * reps, per_request(flat),
                                                         fields=("output_ids",))
        res["served_verifies"] = sum(q["verify_ct"] or 0 for q in per_request(r1 + [x for t in timed for x in t]))
        log(f"    {self.name}: rc {rc} in {seconds} s; start {res['engine_start_s']} s; round1 {res['round1']}; "
            f"timed tokens/s {[t.get('tokens_per_s') for t in res['timed'] or []]}; error {res['error']}")
        return res


def timed_rows(odir: str) -> List[List[dict]]:
    """The responses of every timed round a server wrote: round2.jsonl, round3.jsonl, ... up to the first gap."""
    out, r = [], 2
    while os.path.exists(os.path.join(odir, f"round{r}.jsonl")):
        out.append(read_jsonl(os.path.join(odir, f"round{r}.jsonl")))
        r += 1
    return out


def run_in_turn(servers: List[Server], deadline: float, per_config_s: float, min_s: float, log) -> Dict[str, str]:
    """One server after the other, each inside the deadline (all its timed rounds back to back); returns the ones
    not started."""
    skipped = {}
    for s in servers:
        left = deadline - time.time()
        if left < min_s:
            skipped[s.name] = f"not started: {left:.0f} s left of the budget"
            log(f"--- {s.name}: {skipped[s.name]}")
            continue
        s.start(log)
        s.wait(min(per_config_s, left))
    return skipped


def interleaved(names: Sequence[str], rounds: int) -> List[Tuple[str, int]]:
    """The release order of `rounds` timed rounds of each server: round r releases every name once, the order
    rotated left by r - 1 (a, b, c; b, c, a; c, a, b; ...), so no configuration always goes first and drift over
    the rounds falls on all alike. [(name, r), ...]."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    names = list(names)
    out = []
    for r in range(1, rounds + 1):
        k = (r - 1) % len(names) if names else 0
        out += [(n, r) for n in names[k:] + names[:k]]
    return out


def timed_groups(servers: Sequence[Server]) -> List[List[Tuple[str, int]]]:
    """The release order, in two groups: the eager servers' rounds (interleaved among themselves; then they shut
    down), then the graph-on servers' rounds interleaved: the comparisons that matter (graphs on, plugin against
    stock) run beside the fewest other processes, and beside the same ones in every round."""
    groups = []
    for graph in ("off", "on"):
        group = [s for s in servers if s.cfg["graph"] == graph]
        rounds = {s.name: s.rounds for s in group}
        groups.append([(n, r) for n, r in interleaved([s.name for s in group], max(rounds.values(), default=0))
                       if r <= rounds[n]])
    return groups


def timed_plan(servers: Sequence[Server]) -> List[Tuple[str, int]]:
    """:func:`timed_groups`, one after the other."""
    return [x for g in timed_groups(servers) for x in g]


def _stop_and_wait(servers: Sequence[Server], deadline: float, shutdown_s: float) -> None:
    """Tell every live server of `servers` to stop (no more rounds: shut down), all at once; wait for them."""
    for s in servers:
        if s.alive():
            s.stop()
    for s in servers:
        if s.proc is not None and s.rc is None:
            s.wait(min(shutdown_s, max(0.0, deadline - time.time())), why="its shutdown outran the deadline")


def run_side_by_side(servers: List[Server], deadline: float, per_round_s: float, log, reserve_s: float = 20.0,
                     shutdown_s: float = 90.0) -> dict:
    """Start every server at once (their imports, compiles and CUDA-graph captures overlap), wait until each has
    served round 1 or exited, then release the timed rounds of :func:`timed_groups` one at a time, so no two servers
    run a timed round, and no start-up, round 1 or shutdown runs beside one: after each group its servers are told
    to stop and shut down together. A round is released only when its expected time (the server's slowest so far
    x 1.5, else `per_round_s`) and `reserve_s` fit before the deadline; after the first that does not, no more are
    released. Returns the schedule: the plan, what was released, what was not and why."""
    for s in servers:
        s.start(log)
    by_name = {s.name: s for s in servers}
    gate = deadline - per_round_s * sum(1 for s in servers if s.rounds) - reserve_s
    while time.time() < gate and any(s.alive() and not s.ready() for s in servers):
        time.sleep(0.5)
    for s in servers:
        if s.alive() and not s.ready():
            s.kill(f"not through round 1 by the deadline ({gate - s.t0:.0f} s after its start)")
    log("    side by side: " + ", ".join(f"{s.name} {'ready' if s.ready() else 'rc ' + str(s.proc.poll() if s.proc else s.rc)}"
                                         for s in servers))
    groups = timed_groups(servers)
    plan = [x for g in groups for x in g]
    sched = {"plan": [list(x) for x in plan], "released": [], "not_released": {}, "stopped_for_budget": None}

    def not_released(name: str) -> None:
        sched["not_released"][name] = sched["not_released"].get(name, 0) + 1

    for group in groups:
        for name, r in group:
            s = by_name[name]
            if sched["stopped_for_budget"] or not s.alive():
                not_released(name)
                continue
            need = s.expected_round_s(per_round_s)
            left = deadline - time.time()
            if left < need + reserve_s:
                sched["stopped_for_budget"] = (f"{left:.0f} s left before {name} round {r} (expected {need:.0f} s "
                                               f"+ {reserve_s:.0f} s kept for the shutdowns and the report)")
                log(f"    stopping the timed rounds: {sched['stopped_for_budget']}")
                not_released(name)
                continue
            s.release(r)
            t0 = time.time()
            served = s.wait_done(r, min(left - reserve_s, max(4 * need, per_round_s)))
            sched["released"].append([name, r, round(time.time() - t0, 2), served])
        _stop_and_wait([by_name[n] for n in dict.fromkeys(n for n, _ in group)], deadline, shutdown_s)
    _stop_and_wait(servers, deadline, shutdown_s)  # any without timed rounds
    return sched


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
    p.add_argument("--side-by-side", choices=("on", "off"), default=None,
                   help="on (default on cuda): start every server at once, time them one at a time, the graph-on "
                        "servers' rounds interleaved; off (default on cpu): one after another")
    p.add_argument("--per-round-s", type=float, default=30,
                   help="side by side: time kept for a server's first timed round (later ones: 1.5 x its slowest)")
    p.add_argument("--reserve-s", type=float, default=20,
                   help="side by side: no round is released unless this much time would be left after it")
    p.add_argument("--only", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    p.add_argument("--timed-repeats", type=int, default=8, help="each timed round serves the prompts this many times")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of each graph-on server (interleaved)")
    p.add_argument("--eager-rounds", type=int, default=1, help="timed rounds of each --disable-cuda-graph server")
    p.add_argument("--mem-fraction", type=float, default=0.12,
                   help="each server's mem_fraction_static (five side by side on one GPU)")
    p.add_argument("--result", default=None, help="write the result JSON here too")
    p.add_argument("--command", default=None, help="the command line to record in the result")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of the pipeline on SGLang's CPU path (every configuration with graphs off, "
                        "one server after another)")
    p.add_argument("--rejudge", action="store_true",
                   help="serve nothing: read the runs already under --out (e.g. a GPU run's logs.tar.gz, unpacked) "
                        "and judge them with this code")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in ORDER + NOEMB]
    if unknown:
        p.error(f"--only: unknown configuration(s) {unknown}; expected some of {list(ORDER)}")
    if a.rounds < 1 or a.eager_rounds < 1 or a.timed_repeats < 0:
        p.error(f"--rounds and --eager-rounds must be >= 1 and --timed-repeats >= 0; got {a.rounds}, "
                f"{a.eager_rounds}, {a.timed_repeats}")
    if not 0.0 < a.mem_fraction < 1.0:
        p.error(f"--mem-fraction must be in (0, 1), got {a.mem_fraction}")
    if a.budget_s <= 0 or a.per_round_s <= 0 or a.reserve_s < 0:
        p.error(f"--budget-s and --per-round-s must be > 0, --reserve-s >= 0; got {a.budget_s}, {a.per_round_s}, "
                f"{a.reserve_s}")
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
    for key, name in (("prompts", "prompts.json"), ("reference", "reference_greedy.json"),
                      ("profile", "profile.json")):
        if pair.get(key) and not os.path.exists(pair[key]):  # an unpacked copy of another machine's run
            pair[key] = os.path.join(a.pair, name)
    with open(pair["prompts"]) as f:
        prompts = json.load(f)
    reference = None
    if pair.get("reference") and os.path.exists(pair["reference"]):
        with open(pair["reference"]) as f:
            reference = json.load(f)["outputs"]
    table = config_table(pair, a.out, a.device)
    if pair.get("draft_noemb"):  # the release cannot capture the embedding: its plugin = stock pair runs too
        names += [n for n in NOEMB if n not in names]
    elif any(n in NOEMB for n in names):
        log(f"no draft without the embedding in {a.pair}: {', '.join(NOEMB)} left out")
        names = [n for n in names if n not in NOEMB]
    side = (a.side_by_side or ("on" if a.device == "cuda" else "off")) == "on"
    servers = [Server(n, table[n], pair, a.out, a.timed_repeats, pair["new_tokens"], a.device, side,
                      0 if n in NOEMB else a.rounds if table[n]["graph"] == "on" else a.eager_rounds, a.mem_fraction)
               for n in names]  # the no-embedding pair is compared on round 1 only: no timed rounds
    skipped, schedule = {}, None
    if a.rejudge:
        for s in servers:
            if not any(os.path.exists(os.path.join(s.odir, f)) for f in ("summary.json", "server.log")):
                skipped[s.name] = "not in the runs rejudged (served by an older compare.py?)"
                continue
            s.reread()
    elif side:
        schedule = run_side_by_side(servers, deadline, a.per_round_s, log, a.reserve_s)
    else:
        skipped = run_in_turn(servers, deadline, a.per_config_s, a.min_s, log)
    runs: Dict[str, dict] = {}
    for s in servers:
        if s.name in skipped:
            continue
        r = s.result(log)
        if "EAGLE3_CAPTURE_DUMP" in s.cfg["env"]:
            r["dump"] = dump_index(s.cfg["env"]["EAGLE3_CAPTURE_DUMP"], prompts, r.get("windows"))
            if a.rejudge:
                r["dump"]["dir"] = os.path.relpath(r["dump"]["dir"], a.out)
        runs[s.name] = r
    served_on = None
    earlier = os.path.join(a.out, "gpu_sglang.json")
    if a.rejudge and os.path.exists(earlier):  # the machine the runs were served on, not this one
        with open(earlier) as f:
            served_on = json.load(f).get("machine")
    comp = comparisons(runs, reference)
    # a release that adds 1 to every id (0.5.12) cannot capture the draft's embedding tap: stock's servers raise
    stock_raises = bool(pair.get("draft_noemb"))
    result = {
        "what": "SGLang 0.5.23's real serving loop (sglang.Engine, EAGLEWorkerV2) on one GPU with the demo pair "
                "(tiny DeepseekV3 target + trained LlamaForCausalLMEagle3 draft, float32, triton attention, chain "
                f"{CHAIN[0]}/{CHAIN[1]}/{CHAIN[2]}): CUDA graphs on vs off, plugin vs stock SGLang given ids in its "
                "own convention; sgl_kernel / flash_mla / cutlass stood in by scripts/gpu_sglang/standins",
        "command": a.command or " ".join(sys.argv), "machine": served_on or machine(), "pair": pair,
        "prompts": len(prompts), "new_tokens": pair["new_tokens"], "timed_repeats": a.timed_repeats,
        "rounds": {"graphs": a.rounds, "eager": a.eager_rounds}, "mem_fraction": a.mem_fraction,
        "device": a.device, "side_by_side": side, "schedule": schedule,
        "rejudged_on": {"platform": platform.platform(), "python": platform.python_version()} if a.rejudge else None,
        "environment": {**{k: os.environ.get(k) for k in ("TORCHDYNAMO_DISABLE", "CUDA_VISIBLE_DEVICES")},
                        **(CUDA_ENV if a.device == "cuda" else CPU_DRY_RUN_ENV)},
        "configs": {n: {k: v for k, v in r.items() if k not in ("round1_rows", "timed_rows")}
                    for n, r in runs.items()},
        "accept": {n: accept_figures(r["round1_rows"]) for n, r in runs.items() if r.get("ok")},
        "comparisons": comp, "speed": speed(runs), "acceptance_watch": profile_check(runs, pair),
        "skipped": skipped, "findings": findings(runs, comp),
    }
    result["stock_raises"] = stock_raises
    result["failures"] = verdict(runs, comp, stock_raises) + [f"{n}: {why}" for n, why in skipped.items()]
    result["ok"] = not result["failures"]
    # --rejudge keeps the served run's own result beside its runs and writes only --result
    for path in filter(None, (None if a.rejudge else os.path.join(a.out, "gpu_sglang.json"), a.result)):
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
