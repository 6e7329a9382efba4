"""Sweep of bad inputs (issue 25's kinds and more), each run in a child process forked from a warm one, with a time
limit, and counted by outcome: a clean error (exit 2, one line), a finding (exit 1), a result (exit 0), a
traceback, a run killed at the time limit (a hang), a crash (a signal), and for `doctor watch` "could not judge"
(exit 3). Each case states what it must give; the table says how many cases of each kind gave what, and lists the
ones that did not give what they must.

Not a pytest module (no test_ prefix): it takes minutes. One file (about 600 lines): one case builder per kind
around the forked runner and the outcome table they share (issue 32's kinds: sweep_issue32_*.py). Run it from the
repository root:

    PYTHONPATH=$PWD/python python tests/sweep_bad_inputs.py [--only KIND] [--timeout S] [--json OUT]

Kinds: 1 online's recorded figures, 2 partly random targets, 4 sizes, 5 inputs that printed tracebacks, 6 the
Python API, 8 messages that must name the right thing; 32.2 ... 32.8: issue 32's doctor kinds
(tests/sweep_issue32_doctor.py); 42.1 ... 42.6: issue 42's kinds (tests/sweep_issue42.py: misspelt safety settings,
watch readings, profile files, Prometheus rules, dump contracts, the request guard; 42.1 starts SGLang, run the
sweep under `flock /tmp/e3-heavy.lock` on a shared machine). (Kind 7, the gather's exit after an agreement error, needs
two processes per run: tests/test_gather_agreement.py repeats it.) The demo pair is trained once into
/tmp/eagle3_sweep_demo (a `doctor demo --fast` in a subprocess) unless --demo names one.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# bootstrap (a script, run outside pytest): the folders pytest gets from pyproject's pythonpath, read from there
# (one line of it: tomllib is Python 3.11+, the project runs on 3.10)
with open(os.path.join(REPO, "pyproject.toml")) as _f:
    _line = re.search(r"^pythonpath = \[(.*)\]$", _f.read(), re.M)
for _folder in reversed(re.findall(r'"([^"]+)"', _line.group(1))):
    sys.path.insert(0, os.path.join(REPO, _folder))

CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
CLEAN, FINDING, OK, TRACEBACK, HANG, CRASH, MULTILINE = ("clean error", "finding", "result", "traceback", "hang",
                                                       "crash", "error of several lines")
UNJUDGED = "could not judge"   # doctor watch's exit 3: no alarm seen, a reading could not be judged


class Case:
    def __init__(self, kind, name, fn, want, needles=()):
        self.kind, self.name, self.fn, self.want, self.needles = kind, name, fn, set(want), needles


def cli(*argv):
    from eagle3_capture.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return code, out.getvalue(), err.getvalue()


def api(fn):
    """A Python API call as a case: a raised exception of the expected kind is the clean error."""
    def run():
        try:
            fn()
        except (ValueError, TypeError, RuntimeError) as e:  # the API's errors (TapError is a ValueError)
            return 2, "", f"error: {type(e).__name__}: {' '.join(str(e).split())}"
        return 0, "", ""
    return run


def classify(code, out, err):
    if "Traceback" in out or "Traceback" in err:
        return TRACEBACK
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        return CLEAN if len(lines) == 1 and "error:" in lines[0] else MULTILINE
    return {1: FINDING, 0: OK, 3: UNJUDGED}.get(code, f"exit {code}")


def run_forked(fn, timeout):
    """(outcome, message) of fn() in a forked child; the child is killed at `timeout` s."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            code, out, err = fn()
            payload = json.dumps([code, out[-4000:], err[-4000:]])
        except BaseException as e:  # anything out of a case is what the sweep reports
            import traceback

            payload = json.dumps([-1, "", "Traceback\n" + "".join(traceback.format_exception(e))[-3000:]])
        data = payload.encode()
        while data:
            data = data[os.write(w, data):]
        os._exit(0)
    os.close(w)
    chunks, t_end, status = [], time.time() + timeout, None
    while True:
        ready, _, _ = select.select([r], [], [], 0.2)
        if ready:
            chunk = os.read(r, 65536)
            if chunk:
                chunks.append(chunk)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            break
        if time.time() > t_end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return HANG, f"killed after {timeout:g} s"
    os.close(r)
    if os.WIFSIGNALED(status):
        return CRASH, f"signal {os.WTERMSIG(status)}"
    try:
        code, out, err = json.loads(b"".join(chunks).decode())
    except ValueError:
        return CRASH, f"no report (exit status {status})"
    msg = (err.strip().splitlines() or [""])[-1] if code == 2 else (out.strip().splitlines() or [""])[-1]
    return classify(code, out, err), (err[-600:] if code == -1 else msg[:400])


# ----------------------------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------------------------

def demo_dir(path):
    if not os.path.isdir(os.path.join(path, "draft")):
        print(f"training the demo pair into {path} (about a minute)...", flush=True)
        subprocess.run([sys.executable, "-m", "eagle3_capture", "doctor", "demo", "--fast", "--no-plot",
                        "--no-progress", "--out", path], check=True, capture_output=True)
    return path


def served_lines(demo, prompts, n, flags=(3, 1, 4)):
    """What a correct server returns for these prompts (the offline replay), as recorded JSONL objects."""
    from doctor_helpers import replay_demo

    S, k, D = flags
    out = []
    for prompt, cont, s in replay_demo(demo, prompts, n, flags):
        a = sum(i * x for i, x in enumerate(s.histogram))
        out.append({"input_ids": prompt, "output_ids": cont,
                    "meta_info": {"completion_tokens": s.completion_tokens, "spec_verify_ct": s.verify_ct,
                                  "spec_correct_drafts_histogram": s.histogram, "spec_num_correct_drafts": a,
                                  "spec_num_proposed_drafts": s.verify_ct * (D - 1), "prompt_tokens": len(prompt),
                                  "spec_accept_length": s.completion_tokens / s.verify_ct,
                                  "spec_accept_rate": a / (s.verify_ct * (D - 1)), "num_retractions": 0}})
    return out


def write_jsonl(path, lines):
    with open(path, "w") as f:
        for x in lines:
            f.write((x if isinstance(x, str) else json.dumps(x)) + "\n")
    return path


def online_cases(demo, tmp, rng):
    """Kind 1: recorded responses, the issue's cases and mutations around a correct server's answer, each judged by
    the fuzz's oracle (tests/doctor/test_doctor_cli_fuzz.py: sglang_could_report)."""
    from test_doctor_cli_fuzz import sglang_could_report, ONLINE_N

    with open(os.path.join(demo, "prompts.json")) as f:
        prompts = json.load(f)[:2]
    pp = os.path.join(tmp, "online_prompts.json")
    with open(pp, "w") as f:
        json.dump(prompts, f)
    good = served_lines(demo, prompts, ONLINE_N)
    draft = os.path.join(demo, "draft")
    cases = []

    def case(name, lines, want, *needles):
        p = write_jsonl(os.path.join(tmp, f"online_{len(cases)}.jsonl"), lines)
        cases.append(Case(1, name, lambda p=p: cli("doctor", "online", "--server", p, "--prompts", pp, "--target",
                                                   "demo", "--draft", draft, "--server-args", CHAIN, "--no-progress",
                                                   "--threads", 1), want, needles))

    def with_meta(i, **m):
        lines = json.loads(json.dumps(good))
        lines[i]["meta_info"].update(m)
        return lines

    c = good[0]["meta_info"]["completion_tokens"]
    case("a correct server's figures", good, {OK})
    case("zero verifies", [dict(x, meta_info={**x["meta_info"], "spec_verify_ct": 0, "spec_correct_drafts_histogram":
                                              [], "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0})
                           for x in good], {CLEAN}, "spec_verify_ct 0")
    case("histogram beyond num-steps", with_meta(0, spec_verify_ct=2, spec_correct_drafts_histogram=[0, 0, 0, 0, 1, 1],
                                                 spec_num_proposed_drafts=6, spec_num_correct_drafts=9), {CLEAN},
         "at most 3")
    case("more verifies than tokens", with_meta(0, spec_verify_ct=c + 2, spec_correct_drafts_histogram=[c + 2],
                                                spec_num_proposed_drafts=3 * (c + 2), spec_num_correct_drafts=0),
         {CLEAN}, "more verifies")
    case("histogram against completion_tokens", with_meta(0, spec_verify_ct=1, spec_correct_drafts_histogram=[0, 1],
                                                          spec_num_proposed_drafts=3, spec_num_correct_drafts=1),
         {CLEAN}, "completion_tokens")
    case("two records for one prompt", good + [good[0]], {CLEAN}, "lines 1 and 3")
    case("completion_tokens 0", [dict(x, output_ids=[], meta_info={"completion_tokens": 0, "spec_verify_ct": 0,
                                                                   "spec_correct_drafts_histogram": []})
                                 for x in good], {CLEAN}, "completion_tokens 0")
    new = json.loads(json.dumps(good))
    for x in new:
        for k in ("spec_verify_ct", "spec_correct_drafts_histogram"):
            x["meta_info"].pop(k)
    case("the newer names alone", new, {OK})
    n6 = 10 ** 6
    case("completion_tokens 1e6 (consistent)", [{"input_ids": x["input_ids"], "output_ids": [1] * n6, "meta_info": {
        "completion_tokens": n6, "spec_verify_ct": n6 // 4, "spec_correct_drafts_histogram": [0, 0, 0, n6 // 4]}}
        for x in good], {CLEAN}, "max_position_embeddings")
    case("a line that is not JSON", ["{nope"], {CLEAN}, "line 1")
    case("no meta_info", [{k: v for k, v in x.items() if k != "meta_info"} for x in good], {CLEAN}, "meta_info")
    # mutations, judged by the oracle
    fields = ["completion_tokens", "spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_correct_drafts",
              "spec_num_proposed_drafts", "spec_accept_length", "spec_accept_rate", "num_retractions",
              "prompt_tokens", "output_ids"]
    values = [None, -1, 0, 1, 2.0, True, "3", [], [1], 10 ** 6, 1e300]
    for m in range(120):
        lines = json.loads(json.dumps(good))
        x = lines[rng.randrange(len(lines))]
        names = rng.choice(["old", "new", "both"])
        meta = x["meta_info"]
        if names == "old":
            meta.pop("spec_num_correct_drafts"), meta.pop("spec_num_proposed_drafts")
        elif names == "new":
            meta.pop("spec_verify_ct"), meta.pop("spec_correct_drafts_histogram")
        for key in rng.sample(fields, rng.randint(1, 2)):
            how = rng.choice(["nudge", "nudge", "drop", "value"])
            if key == "output_ids":
                x["output_ids"] = x["output_ids"][:-1] if how == "drop" else x["output_ids"] + [1]
            elif how == "drop":
                meta.pop(key, None)
            elif how == "value":
                meta[key] = rng.choice(values)
            elif key == "spec_correct_drafts_histogram" and isinstance(meta.get(key), list):
                h = list(meta[key]) + [0]
                i = rng.randrange(len(h) + 2)
                h += [0] * (i + 1 - len(h))
                h[i] = max(0, h[i] + rng.choice([-1, 1]))
                meta[key] = h
            elif isinstance(meta.get(key), (int, float)) and not isinstance(meta.get(key), bool):
                meta[key] = meta[key] + rng.choice([-2, -1, 1, 2])
        others = [y for y in lines if y is not x]
        possible = all(sglang_could_report(y["meta_info"], len(y["output_ids"]), len(y["input_ids"]))
                       for y in others) and sglang_could_report(meta, len(x["output_ids"]), len(x["input_ids"]))
        case(f"mutation {m} ({names} names)", lines, {OK, FINDING} if possible else {CLEAN})
    return cases


def target_variant(demo, tmp, name, state=None, config=None):
    from doctor_helpers import target_variant as variant

    return variant(demo, os.path.join(tmp, f"target_{name}"), state, config)


def target_cases(demo, tmp):
    """Kind 2: partly random targets, through dump-reference, accept and online."""
    import torch

    draft = os.path.join(demo, "draft")
    pp = os.path.join(tmp, "p1.json")
    with open(pp, "w") as f:
        json.dump([[5, 6, 7, 8, 9]], f)
    rec = write_jsonl(os.path.join(tmp, "rec1.jsonl"), [{"input_ids": [5, 6, 7, 8, 9], "output_ids": [1, 2, 3, 4],
                                                         "meta_info": {"completion_tokens": 4, "spec_verify_ct": 1,
                                                                       "spec_correct_drafts_histogram": [0, 0, 1]}}])
    variants = {
        "missing layer 3": (target_variant(demo, tmp, "missing", lambda st: {k: v for k, v in st.items()
                                                                            if ".layers.3." not in k}), "missing"),
        "missing final norm": (target_variant(demo, tmp, "nonorm", lambda st: {k: v for k, v in st.items()
                                                                               if k != "model.norm.weight"}), "missing"),
        "a weight of another shape": (target_variant(demo, tmp, "shape", lambda st: {
            **st, "model.norm.weight": torch.ones(7)}), "another shape"),
        "an unexpected weight": (target_variant(demo, tmp, "extra", lambda st: {
            **st, "model.extra.weight": torch.zeros(3)}), "unexpected"),
        "num_hidden_layers 0": (target_variant(demo, tmp, "nolayers", config=lambda c: c.update(num_hidden_layers=0)),
                                "num_hidden_layers 0"),
        "a draft directory as the target": (draft, "EAGLE-3 draft checkpoint"),
    }
    cases = []
    for name, (path, needle) in variants.items():
        out = os.path.join(tmp, f"ref_{len(cases)}.safetensors")
        cases.append(Case(2, f"dump-reference: {name}", lambda p=path, o=out: cli(
            "doctor", "dump-reference", "--model", p, "--prompts", pp, "--out", o, "--threads", 1), {CLEAN}, (needle,)))
        cases.append(Case(2, f"accept: {name}", lambda p=path: cli(
            "doctor", "accept", "--target", p, "--draft", draft, "--prompts", pp, "--new-tokens", 4, "--no-progress",
            "--threads", 1), {CLEAN}, (needle,)))
        cases.append(Case(2, f"online: {name}", lambda p=path: cli(
            "doctor", "online", "--server", rec, "--target", p, "--draft", draft, "--prompts", pp, "--no-progress",
            "--threads", 1, "--server-args", CHAIN), {CLEAN}, (needle,)))
    cases.append(Case(2, "accept: the demo's own saved target (must load)", lambda: cli(
        "doctor", "accept", "--target", os.path.join(demo, "target"), "--draft", draft, "--prompts", pp,
        "--new-tokens", 4, "--no-progress", "--threads", 1), {OK}))
    return cases


def flag_cases(demo, tmp):
    """Kinds 4 and 5: sizes, and the inputs that printed tracebacks."""
    draft = os.path.join(demo, "draft")
    pp = os.path.join(tmp, "p2.json")
    with open(os.path.join(demo, "prompts.json")) as f:
        prompts = json.load(f)[:2]
    with open(pp, "w") as f:
        json.dump(prompts, f)
    fifo = os.path.join(tmp, "a_fifo")
    os.mkfifo(fifo)

    def accept(*extra):
        return lambda: cli("doctor", "accept", "--target", "demo", "--draft", draft, "--prompts", pp, "--no-progress",
                           "--threads", 1, *extra)

    def online(server, *extra):
        return lambda: cli("doctor", "online", "--server", server, "--target", "demo", "--draft", draft, "--prompts",
                           pp, "--no-progress", "--threads", 1, *extra)

    def dump(*extra):
        return lambda: cli("doctor", "dump-reference", "--model", "demo", "--prompts", pp, "--out",
                           os.path.join(tmp, "r.safetensors"), *extra)

    def spec(s, k, d):
        return CHAIN.replace("num-steps 3", f"num-steps {s}").replace("eagle-topk 1", f"eagle-topk {k}").replace(
            "num-draft-tokens 4", f"num-draft-tokens {d}")

    c = []
    big = 10 ** 6
    for cmd, fn in (("accept", accept("--new-tokens", big)), ("dump-reference", dump("--new-tokens", big, "--threads", 1)),
                    ("online", online("http://127.0.0.1:9", "--new-tokens", big, "--server-args", CHAIN))):
        c.append(Case(4, f"{cmd} --new-tokens 1e6", fn, {CLEAN}, ("max_position_embeddings",)))
    c.append(Case(4, "accept --new-tokens to the last position that fits", accept("--new-tokens", 256 - 32 - 3), {OK}))
    c.append(Case(4, "accept --new-tokens one past it", accept("--new-tokens", 256 - 32 - 2), {CLEAN}, ("221",)))
    c.append(Case(4, "accept --steps 1e6", accept("--steps", big), {CLEAN}, ("at most 64",)))
    c.append(Case(4, "accept --steps 65", accept("--steps", 65), {CLEAN}, ("at most 64",)))
    c.append(Case(4, "accept --speculative-num-steps 1e6", accept("--server-args", spec(big, 1, big + 1)), {CLEAN},
                  ("at most 64",)))
    c.append(Case(4, "online --speculative-num-steps 1e6", online("http://127.0.0.1:9", "--new-tokens", 8,
                                                                  "--server-args", spec(big, 1, big + 1)), {CLEAN},
                  ("at most 64",)))
    for cmd, fn in (("accept", accept("--threads", 100000)), ("dump-reference", dump("--threads", 100000)),
                    ("online", online("http://127.0.0.1:9", "--new-tokens", 8, "--threads", 100000)),
                    ("demo", lambda: cli("doctor", "demo", "--fast", "--threads", 100000))):
        c.append(Case(4, f"{cmd} --threads 100000", fn, {CLEAN}, ("CPUs",)))
    c.append(Case(4, "accept --batch-size 10**9 (bounded by the prompts)", accept("--new-tokens", 3, "--batch-size",
                                                                                 10 ** 9), {OK}))
    c.append(Case(4, "online --concurrency 10**9 (bounded by the prompts)", online(
        "http://127.0.0.1:9", "--new-tokens", 8, "--concurrency", 10 ** 9, "--server-args", CHAIN), {CLEAN},
        ("cannot reach",)))
    for t in ("1e10", "1e300"):
        c.append(Case(4, f"online --timeout {t}", online("http://127.0.0.1:9", "--new-tokens", 8, "--timeout", t),
                      {CLEAN}, ("86400",)))
    c.append(Case(4, "accept eagle-topk 200 x 3 steps (tree of 80200 candidates)", accept("--server-args",
                                                                                        spec(3, 200, 8)), {CLEAN},
                  ("16384",)))
    c.append(Case(4, "accept eagle-topk 1e6", accept("--server-args", spec(3, big, 8)), {CLEAN}, ("vocabulary",)))
    for url, needle in (("http://127.0.0.1:abc", "not a URL"), ("http://[::1", "IPv6"), ("http://127.0.0.1 :80",
                                                                                       "whitespace"),
                        ("http://a b", "whitespace"), ("http://", "no host"), ("http://:80", "no host"),
                        ("http://127.0.0.1:99999", "not a URL"), ("http://127.0.0.1:0", "port 0"),
                        ("http://h:1/?x=1", "query"), ("http://h:1/\n", "control"), ("ftp://h", "neither"),
                        ("https://[::1]:abc", "not a URL")):
        c.append(Case(5, f"online --server {url!r}", online(url, "--new-tokens", 8), {CLEAN}, (needle,)))
    for what, flags, needle in (("eagle-topk 0", spec(3, 0, 4), "eagle-topk 0"),
                                ("eagle-topk > vocabulary", spec(3, 300, 4), "vocabulary"),
                                ("tree flags, num-steps 0", spec(0, 2, 4), "num-steps 0"),
                                ("chain flags, num-steps 0", spec(0, 1, 1), "num-steps 0"),
                                ("a tree with too many draft tokens", spec(2, 2, 9), "num-draft-tokens")):
        c.append(Case(5, f"accept {what}", accept("--new-tokens", 4, "--server-args", flags), {CLEAN}, (needle,)))
        lines = served_lines(demo, prompts, 8)
        rec = write_jsonl(os.path.join(tmp, f"rec_flags_{len(c)}.jsonl"), lines)
        c.append(Case(5, f"online {what}", online(rec, "--server-args", flags), {CLEAN}, (needle,)))
    for flag in ("--tensors", "--json"):
        for path, needle in (("/proc/e3_sweep.safetensors", "not writable"), ("/sys/e3_sweep.safetensors",
                                                                             "not writable"),
                             (fifo, "not a regular file"), (tmp, "is a directory"),
                             (os.path.join(pp, "under_a_file"), "is a file")):
            c.append(Case(5, f"accept {flag} {path}", accept("--new-tokens", 3, flag, path), {CLEAN}, (needle,)))
    return c


def api_cases(tmp):
    """Kind 6: the Python API."""
    import torch
    from safetensors.torch import save_file

    from eagle3_capture import ops
    from eagle3_capture.spec import DRAFT_IDS, HF_HIDDEN_STATES, LAYER_INPUTS, TapSpec
    from eagle3_capture.weights import load_draft_fc

    c = []

    def meta_args(meta):
        t = {"packed": torch.zeros(4, 16), "hidden": torch.randn(4, 8), "residual": torch.randn(4, 8),
             "weight": torch.ones(8), "x0": torch.randn(3, 8), "x1": torch.randn(3, 8), "w": torch.randn(5, 16),
             "norm": torch.ones(2, 8), "bias": torch.randn(5), "out": torch.empty(3, 5)}
        t[meta] = torch.empty_like(t[meta], device="meta")
        return t

    for meta in ("packed", "hidden", "residual"):
        c.append(Case(6, f"capture_ with meta {meta}", api(lambda m=meta: (lambda a: ops.capture_(
            a["packed"], 1, a["hidden"], a["residual"]))(meta_args(m))), {CLEAN}, ("meta device",)))
        c.append(Case(6, f"torch.ops capture_ with meta {meta}", api(lambda m=meta: (
            lambda a: torch.ops.eagle3_capture.capture_(a["packed"], 1, a["hidden"], a["residual"]))(meta_args(m))),
            {CLEAN}, ("meta device",)))
    for meta in ("packed", "hidden", "residual", "weight"):
        c.append(Case(6, f"fused_add_rmsnorm_capture_ with meta {meta}", api(lambda m=meta: (
            lambda a: ops.fused_add_rmsnorm_capture_(a["hidden"], a["residual"], a["weight"], 1e-6, a["packed"], 1))(
            meta_args(m))), {CLEAN}, ("meta device",)))
    for meta in ("x0", "x1", "w", "norm", "bias"):
        c.append(Case(6, f"draft_fc with meta {meta}", api(lambda m=meta: (lambda a: ops.draft_fc(
            [a["x0"], a["x1"]], a["w"], a["norm"], bias=a["bias"]))(meta_args(m))), {CLEAN}, ("meta device",)))
    for meta in ("x0", "w", "out"):
        c.append(Case(6, f"torch.ops draft_fc_out with meta {meta}", api(lambda m=meta: (
            lambda a: torch.ops.eagle3_capture.draft_fc_out([a["x0"], a["x1"]], a["w"], a["norm"], 1e-6, a["bias"],
                                                            a["out"]))(meta_args(m))), {CLEAN}, ("meta device",)))
    c.append(Case(6, "draft_fc with every tensor meta (a shape check)", api(lambda: ops.draft_fc(
        [torch.empty(3, 8, device="meta")] * 2, torch.empty(5, 16, device="meta"))), {OK}))
    for i, name in enumerate(["fc_norm.0.bias", "fc_norms.0.weight", "fc_norm.weight", "aux_norm_top.weight",
                              "model.fc_norm.1.scale", "aux_norm_low.bias", "fc.norm.0.weight", "fc.weight_scale2"]):
        d = os.path.join(tmp, f"fc_{i}")
        os.makedirs(d)
        save_file({"fc.weight": torch.randn(6, 24), name: torch.ones(8)}, os.path.join(d, "model.safetensors"))
        c.append(Case(6, f"load_draft_fc with {name}", api(lambda d=d: load_draft_fc(d)), {CLEAN}, (name,)))
    d = os.path.join(tmp, "fc_plain")
    os.makedirs(d)
    save_file({"fc.weight": torch.randn(6, 24)}, os.path.join(d, "model.safetensors"))
    for dt in (torch.int32, torch.int8, torch.bool, torch.float8_e4m3fn, 5, "float16", float, torch.complex64):
        c.append(Case(6, f"load_draft_fc dtype={dt!r}", api(lambda dt=dt: load_draft_fc(d, dtype=dt)), {CLEAN},
                      ("dtype",)))
    c.append(Case(6, "load_draft_fc dtype=torch.bfloat16", api(lambda: load_draft_fc(d, dtype=torch.bfloat16)), {OK}))
    for key in (DRAFT_IDS, LAYER_INPUTS, HF_HIDDEN_STATES):
        for ids in ({1: "a", 2: "b", 3: "c"}, {1, 2, 3}, (i for i in (1, 2, 3)), iter([1, 2, 3]), "1,2,3",
                    torch.tensor([[1, 2, 3]]), None, 3):
            c.append(Case(6, f"TapSpec.from_convention({key!r}, {type(ids).__name__})", api(
                lambda key=key, ids=ids: TapSpec.from_convention(key, ids, 8, 16)), {CLEAN}, ("sequence",)))
    return c


def issue32_plugin_cases(tmp):
    """Issue 32's plugin-side kinds, 32.1 (servers sharing one dump directory) and 32.6 (misspelt settings):
    tests/sweep_issue32_plugin.py."""
    from sweep_issue32_plugin import plugin_cases

    return plugin_cases(tmp)


def message_cases(demo, tmp):
    """Kind 8: messages that must name the right thing."""
    import torch

    from doctor_helpers import CONFIGS, DSV3_61
    from eagle3_capture.doctor.fingerprint.files import save_captured
    from eagle3_capture.doctor.fingerprint.reference_dump import write_reference

    c = []
    draft_cfg = os.path.join(CONFIGS, "draft_eagle_config_ids.json")
    d = os.path.join(tmp, "latin1")
    os.makedirs(d)
    bad = os.path.join(d, "config.json")
    with open(bad, "wb") as f:
        f.write(b'{"num_hidden_layers": 4, "x": "\xff"}')
    c.append(Case(8, "check: target config not UTF-8", lambda: cli("doctor", "check", "--target-config", bad,
                                                                   "--draft-config", draft_cfg), {CLEAN}, (bad,)))
    c.append(Case(8, "check: draft config not UTF-8", lambda: cli("doctor", "check", "--target-config", DSV3_61,
                                                                  "--draft-config", bad), {CLEAN}, (bad,)))
    pp = os.path.join(tmp, "p3.json")
    with open(pp, "w") as f:
        json.dump([[1, 2, 3]], f)
    c.append(Case(8, "dump-reference: target config not UTF-8", lambda: cli(
        "doctor", "dump-reference", "--model", d, "--prompts", pp, "--out", os.path.join(tmp, "r8.safetensors")),
        {CLEAN}, (bad,)))
    c.append(Case(8, "accept: target config not UTF-8", lambda: cli(
        "doctor", "accept", "--target", d, "--draft", os.path.join(demo, "draft"), "--prompts", pp, "--no-progress"),
        {CLEAN}, (bad,)))
    L, H, T = 5, 16, 30
    g = torch.Generator().manual_seed(0)
    stack = torch.cumsum(torch.randn(L + 1, T, H, generator=g), 0)
    ids = torch.arange(100, 100 + T)

    def ref(path, hs, pre):
        write_reference(path, {"hidden_states": hs, "final_prenorm": pre, "input_ids": ids,
                               "positions": torch.arange(T)}, num_layers=L, hidden_size=H, source="sweep")
        return path

    cap = os.path.join(tmp, "cap.safetensors")
    save_captured(cap, torch.cat([stack[0], stack[2], stack[5]], -1), ids, num_layers=L, hidden_size=H,
                  draft_ids=[-1, 1, 4])
    nan = torch.full_like(stack, float("nan"))
    r_all = ref(os.path.join(tmp, "ref_nan.safetensors"), nan, nan[-1].clone())
    c.append(Case(8, "fingerprint: an all-NaN reference", lambda: cli("doctor", "fingerprint", "--reference", r_all,
                                                                      "--captured", cap), {CLEAN}, ("reference",)))
    part = stack.clone()
    part[:, :10] = float("nan")
    cap10 = os.path.join(tmp, "cap10.safetensors")
    save_captured(cap10, torch.cat([stack[0, :10], stack[2, :10], stack[5, :10]], -1), ids[:10], num_layers=L,
                  hidden_size=H, draft_ids=[-1, 1, 4])
    r_part = ref(os.path.join(tmp, "ref_part.safetensors"), part, part[-1].clone())

    def first_error_blames_reference():
        code, out, err = cli("doctor", "fingerprint", "--reference", r_part, "--captured", cap10)
        firsts = [ln for ln in out.splitlines() if "[error]" in ln]
        if code == 1 and firsts and "fingerprint-reference-nonfinite" in firsts[0] and \
                "the reference is broken, not the capture" in out:
            return 1, out, err
        return 0, out, err  # not the finding it must be: reported as a result

    c.append(Case(8, "fingerprint: reference NaN at every captured token (the reference first)",
                  first_error_blames_reference, {FINDING}))
    nextn = CHAIN.replace("EAGLE3", "NEXTN")
    c.append(Case(8, "check: NEXTN with chain flags (an error finding)", lambda: cli(
        "doctor", "check", "--target-config", DSV3_61, "--draft-config", draft_cfg, "--server-args", nextn), {FINDING}))
    with open(os.path.join(demo, "prompts.json")) as f:
        p2 = json.load(f)[:1]
    pp2 = os.path.join(tmp, "p4.json")
    with open(pp2, "w") as f:
        json.dump(p2, f)
    c.append(Case(8, "accept: NEXTN with chain flags (refused as check calls it)", lambda: cli(
        "doctor", "accept", "--target", "demo", "--draft", os.path.join(demo, "draft"), "--prompts", pp2,
        "--no-progress", "--threads", 1, "--new-tokens", 4, "--server-args", nextn), {CLEAN}, ("NEXTN",)))
    c.append(Case(8, "online: NEXTN with chain flags", lambda: cli(
        "doctor", "online", "--server", "http://127.0.0.1:9", "--target", "demo", "--draft",
        os.path.join(demo, "draft"), "--prompts", pp2, "--no-progress", "--threads", 1, "--new-tokens", 4,
        "--server-args", nextn), {CLEAN}, ("NEXTN",)))
    return c


def issue42_cases(demo, tmp, only):
    from sweep_issue42 import cases

    return cases(demo, tmp, None if not only else set(only))


def issue32_doctor_cases(demo, tmp):
    from sweep_issue32_doctor import doctor_cases

    return doctor_cases(demo, tmp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="run only this kind (repeatable; e.g. 2, or 32.2)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds before a case counts as a hang")
    ap.add_argument("--demo", default="/tmp/eagle3_sweep_demo", help="the demo pair's directory (trained if absent)")
    ap.add_argument("--json", help="write every case's outcome here")
    ap.add_argument("--seed", type=int, default=25)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the children are forked: no OpenMP team in the parent
    demo = demo_dir(args.demo)
    tmp = tempfile.mkdtemp(prefix="e3sweep_")
    rng = random.Random(args.seed)
    builders = {1: lambda: online_cases(demo, tmp, rng), 2: lambda: target_cases(demo, tmp),
                4: lambda: [c for c in flag_cases(demo, tmp) if c.kind == 4],
                5: lambda: [c for c in flag_cases(demo, os.path.join(tmp, "k5")) if c.kind == 5],
                6: lambda: api_cases(tmp), 8: lambda: message_cases(demo, tmp),
                32: lambda: issue32_doctor_cases(demo, os.path.join(tmp, "i32"))}
    builders["32"] = lambda: issue32_plugin_cases(os.path.join(tmp, "i32p"))  # issue 32's plugin kinds: 32.1, 32.6
    builders[42] = lambda: issue42_cases(demo, os.path.join(tmp, "i42"), args.only)  # issue 42: 42.1 ... 42.6
    os.makedirs(os.path.join(tmp, "k5"))
    results, t0 = [], time.time()
    try:
        only = None if not args.only else set(args.only)
        for kind, build in builders.items():
            if only and str(kind) not in only and not any(o.startswith(f"{kind}.") for o in only):
                continue
            for case in build():
                if only and str(case.kind) not in only and str(kind) not in only:
                    continue
                outcome, msg = run_forked(case.fn, args.timeout)
                good = outcome in case.want and all(n in msg for n in case.needles)
                results.append({"kind": case.kind, "case": case.name, "outcome": outcome, "want": sorted(case.want),
                                "good": good, "message": msg})
                print(f"[{'ok ' if good else 'BAD'}] kind {case.kind} {case.name}: {outcome}"
                      + ("" if good else f" -- {msg[:300]}"), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(results)} cases in {time.time() - t0:.0f} s")
    kinds = sorted({r["kind"] for r in results}, key=lambda k: [int(x) for x in str(k).split(".")])
    outcomes = [CLEAN, FINDING, OK, UNJUDGED, TRACEBACK, HANG, CRASH, MULTILINE]
    print(f"{'kind':>4}  {'cases':>5}  " + "  ".join(f"{o:>13}" for o in outcomes) + "  not as they must")
    for k in kinds:
        rs = [r for r in results if r["kind"] == k]
        print(f"{str(k):>4}  {len(rs):>5}  " + "  ".join(f"{sum(r['outcome'] == o for r in rs):>13}" for o in outcomes)
              + f"  {sum(not r['good'] for r in rs):>16}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["good"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
