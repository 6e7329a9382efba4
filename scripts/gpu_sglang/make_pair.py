"""Write the demo pair for the GPU serving comparison (scripts/gpu_sglang), with the package's own code:
``eagle3-capture doctor demo --fast``'s :func:`run_demo` trains the draft on the tiny DeepseekV3 target and saves
both. Then, beside them:

* ``prompts.json``: the first ``--prompts`` held-out prompts;
* ``draft_stock_ids/``: the same draft with its ids written in stock SGLang 0.5.23's convention (layer-input
  indices, which stock uses unchanged when they do not start with 1), for stock SGLang to serve;
* ``reference_greedy.json``: the target's greedy continuation of each prompt (transformers, float32), what a
  lossless speculative server must return;
* ``profile.json``: the pair's expected-acceptance profile for the served chain (``doctor accept`` with the
  servers' flags, its predicted histogram of correct drafts through ``eagle3_capture.acceptance.profile``), which
  compare.py's plugin_metrics server reads (EAGLE3_CAPTURE_PROFILE); when ``doctor accept`` fails there is no
  profile, ``profile_error`` says why, and the rest of the pair stands;
* ``pair.json``: the paths, the device the demo ran on and the seconds it took.

    python scripts/gpu_sglang/make_pair.py --out DIR [--device auto|cuda|cpu] [--prompts 64] [--new-tokens 16]
        [--profile on|off]

``auto`` runs the demo on CUDA when there is a GPU and falls back to the CPU (all cores) if that fails; the
fallback and its reason are recorded. Exit status 0 with pair.json written, 1 when no pair could be made.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHAIN = (3, 1, 4)  # num-steps, eagle-topk, num-draft-tokens: SGLang's auto values for DeepSeek targets (compare.py)


def stock_ids(draft_ids, rule: str = "shift_if_first_is_1"):
    """Draft ids (LayerOutput indices, -1 = the embedding) in stock SGLang's own convention for the same layer
    inputs. From 0.5.13 (``rule`` "shift_if_first_is_1", server_flags.id_rule) ids that do not start with 1 are
    layer-input indices, unchanged: [-1, 0, 3] -> [0, 1, 4]. Up to 0.5.12 ("shift_all") every id gets +1, so the
    LayerOutput ids are already stock's: [1, 29, 57] stays; the embedding (-1 -> layer input 0) is written as -1,
    which such a stock server cannot capture (DeepseekV2Model computes hidden_states + residual with residual None
    there): where the plugin captures the embedding, that stock server raises."""
    if not draft_ids or any(not isinstance(i, int) or i < -1 for i in draft_ids):
        raise ValueError(f"draft ids must be integers >= -1, got {draft_ids!r}")
    if rule == "shift_all":
        return list(draft_ids)
    if rule != "shift_if_first_is_1":
        raise ValueError(f"unknown id rule {rule!r}")
    out = [i + 1 for i in draft_ids]
    if out[0] == 1:
        raise ValueError(f"draft ids {draft_ids!r} -> layer inputs {out} start with 1, which stock SGLang would shift "
                         "again: no stock-convention form exists")
    return out


def write_without_embedding(draft_dir: str, out_dir: str) -> list:
    """A copy of the draft whose taps are LayerOutputs only, for a release that cannot capture the embedding
    (0.5.12): the embedding tap replaced by the lowest LayerOutput not yet declared ([-1, 0, 3] -> [0, 1, 3]).
    Its ids mean the same layer inputs to the plugin and to such a release's stock SGLang (+1 on every id), so one
    copy serves both: plugin = stock request for request, whatever the draft accepts with taps it was not trained
    on."""
    def no_embedding(ids):
        if -1 in ids:
            free = next(i for i in range(len(ids) + 1) if i not in ids)
            ids = sorted(free if i == -1 else i for i in ids)
        return ids
    return _copy_with_ids(draft_dir, out_dir, no_embedding)


def write_stock_draft(draft_dir: str, out_dir: str, rule: str = "shift_if_first_is_1") -> list:
    """A copy of the draft whose eagle_config carries the ids in stock's convention (weights untouched)."""
    return _copy_with_ids(draft_dir, out_dir, lambda ids: stock_ids(ids, rule))


def _copy_with_ids(draft_dir: str, out_dir: str, new_ids) -> list:
    """A copy of the draft (weights untouched) whose eagle_config carries new_ids(its ids), undeclared (stock's own
    convention); returns the ids written."""
    with open(os.path.join(draft_dir, "config.json")) as f:
        cfg = json.load(f)
    ids = new_ids(list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]))
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(draft_dir, out_dir)
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    cfg["eagle_config"].pop("eagle_aux_hidden_state_convention", None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return ids


def chain_flags(chain=CHAIN) -> str:
    """The servers' speculative flags as SGLang's command line spells them (what doctor accept predicts for)."""
    s, k, d = chain
    return (f"--speculative-algorithm EAGLE3 --speculative-num-steps {s} --speculative-eagle-topk {k} "
            f"--speculative-num-draft-tokens {d}")


def profile_from_accept(report: dict, target: str, draft: str, chain=CHAIN):
    """The expected-acceptance profile from ``doctor accept --json``'s report: its predicted total histogram of
    correct drafts per verify for the chain. ValueError when the report has no served prediction."""
    from eagle3_capture.acceptance import profile

    served = report.get("served") if isinstance(report, dict) else None
    if not isinstance(served, dict) or not isinstance(served.get("correct_drafts_histogram"), list):
        notes = report.get("notes") if isinstance(report, dict) else None
        raise ValueError(f"doctor accept predicted no served histogram (served: {served!r:.80}; notes {notes})")
    server = report.get("server") or {}
    got = (server.get("num_steps"), server.get("eagle_topk"), server.get("num_draft_tokens"))
    if got != tuple(chain):
        raise ValueError(f"doctor accept predicted for the chain {got}, not the servers' {tuple(chain)}")
    return profile.make(source="doctor accept", speculative=profile.Speculative(*chain),
                        histogram=served["correct_drafts_histogram"], prompts=int(report.get("prompts") or 0),
                        draft=draft, target=target)


def write_profile(out: str, target: str, draft: str, prompts: str, new_tokens: int, device: str,
                  timeout_s: float) -> dict:
    """Run ``doctor accept`` for the chain (its own process, time-boxed) and write profile.json from its report.
    Returns what goes into pair.json: {"profile": path} or {"profile_error": why}, with the seconds it took."""
    from eagle3_capture.acceptance import profile

    t0 = time.time()
    jpath, ppath = os.path.join(out, "accept.json"), os.path.join(out, "profile.json")
    for stale in (jpath, ppath):
        if os.path.exists(stale):
            os.unlink(stale)
    cmd = [sys.executable, "-m", "eagle3_capture", "doctor", "accept", "--target", target, "--draft", draft,
           "--prompts", prompts, "--server-args", chain_flags(), "--new-tokens", str(new_tokens), "--json", jpath,
           "--device", device, "--no-progress"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH", "")) if p)
    info = {"profile_command": shlex.join(["python"] + cmd[1:])}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=REPO)
        with open(os.path.join(out, "accept.log"), "w") as f:
            f.write(p.stdout + p.stderr)
        # exit status 1: prompts left out for bad rows, the figures rest on the others (doctor accept's contract)
        if p.returncode not in (0, 1) or not os.path.exists(jpath):
            tail = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"doctor accept exited {p.returncode}: {tail[-300:]}")
        with open(jpath) as f:
            report = json.load(f)
        info["profile"] = profile.write(profile_from_accept(report, target, draft), ppath)
    except (subprocess.TimeoutExpired, OSError, RuntimeError, ValueError) as e:
        info["profile_error"] = f"{type(e).__name__}: {e}"
        print(f"make_pair: no expected-acceptance profile: {info['profile_error']}", file=sys.stderr)
    info["profile_seconds"] = round(time.time() - t0, 1)
    return info


def _demo(out_dir: str, device: str, threads: int):
    from eagle3_capture.doctor.demo.run import run_demo

    return run_demo(out_dir=out_dir, fast=True, device=device, threads=threads if device == "cpu" else None, seed=0,
                    plot=False, progress=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--id-rule", default="shift_if_first_is_1", choices=("shift_if_first_is_1", "shift_all"),
                   help="how the served SGLang reads draft ids (server_flags.id_rule; shift_all up to 0.5.12, whose "
                        "stock servers then cannot capture the draft's embedding tap)")
    p.add_argument("--reuse", default=None, help="a `doctor demo` output directory to take the pair from (no training)")
    p.add_argument("--profile", choices=("on", "off"), default="on",
                   help="on: also write the expected-acceptance profile (doctor accept for the servers' chain)")
    p.add_argument("--profile-timeout-s", type=float, default=90, help="longest doctor accept run")
    a = p.parse_args(argv)
    if a.prompts < 1 or a.new_tokens < 1:
        p.error("--prompts and --new-tokens must be >= 1")
    import torch

    os.makedirs(a.out, exist_ok=True)
    demo_dir = os.path.join(a.out, "demo")
    info = {"device_asked": a.device}
    threads = max(1, (os.cpu_count() or 2) // 2)
    tries = ["cuda", "cpu"] if a.device == "auto" and torch.cuda.is_available() else (
        ["cpu"] if a.device == "auto" else [a.device])
    res = None
    t0 = time.time()
    if a.reuse:
        if not os.path.isfile(os.path.join(a.reuse, "draft", "config.json")):
            p.error(f"--reuse {a.reuse}: no draft/config.json there (expected a doctor demo output directory)")
        demo_dir, tries = a.reuse, []
        info["device"] = "cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) else "cpu"
        info["reused"] = a.reuse
    for dev in tries:
        try:
            res = _demo(demo_dir, dev, threads)
            info["device"] = dev
            break
        except Exception as e:
            info.setdefault("failed", []).append({"device": dev, "error": f"{type(e).__name__}: {e}",
                                                  "traceback": traceback.format_exc()[-3000:]})
            print(f"make_pair: the demo on {dev} failed: {type(e).__name__}: {e}", file=sys.stderr)
    info["demo_seconds"] = round(time.time() - t0, 1)
    if res is None and not a.reuse:
        with open(os.path.join(a.out, "pair.json"), "w") as f:
            json.dump(info, f, indent=1)
        return 1
    if res is not None:
        info["demo_ok"] = bool(res.ok)
        info["demo_timings_s"] = res.timings
    target, draft = os.path.join(demo_dir, "target"), os.path.join(demo_dir, "draft")
    with open(os.path.join(demo_dir, "prompts.json")) as f:
        prompts = json.load(f)[: a.prompts]
    ppath = os.path.join(a.out, "prompts.json")
    with open(ppath, "w") as f:
        json.dump(prompts, f)
    draft_stock = os.path.join(a.out, "draft_stock_ids")
    info["stock_ids"] = write_stock_draft(draft, draft_stock, a.id_rule)
    info["id_rule"] = a.id_rule
    if a.id_rule == "shift_all" and -1 in info["stock_ids"]:  # stock raises on the embedding: a pair without it
        info["draft_noemb"] = os.path.join(a.out, "draft_without_embedding")
        info["noemb_ids"] = write_without_embedding(draft, info["draft_noemb"])

    # the target's own greedy continuation (transformers), on the device the demo used
    from eagle3_capture.doctor.target_side.model import greedy_continue, load_target

    t1 = time.time()
    dev = info["device"]
    tgt = load_target(target, device=dev, quiet=True)
    ids = torch.tensor(prompts, device=dev)
    cont = greedy_continue(tgt.model, ids, a.new_tokens)[:, ids.shape[1]:].cpu().tolist()
    with open(os.path.join(a.out, "reference_greedy.json"), "w") as f:
        json.dump({"new_tokens": a.new_tokens, "device": dev, "dtype": "float32", "outputs": cont}, f)
    info["reference_seconds"] = round(time.time() - t1, 1)
    info.update(target=target, draft=draft, draft_stock=draft_stock, prompts=ppath,
                reference=os.path.join(a.out, "reference_greedy.json"), new_tokens=a.new_tokens)
    if a.profile == "on":
        info.update(write_profile(a.out, target, draft, ppath, a.new_tokens, dev, a.profile_timeout_s))
    else:
        info["profile_error"] = "not asked for (make_pair.py --profile off)"
    with open(os.path.join(a.out, "pair.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"make_pair: demo on {dev} in {info['demo_seconds']} s (ok={info.get('demo_ok')}), {len(prompts)} prompts, "
          f"stock ids {info['stock_ids']}, "
          + (f"profile in {info['profile_seconds']} s" if info.get("profile") else
             f"no profile ({info.get('profile_error')})"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(REPO, "python"))
    sys.exit(main())
