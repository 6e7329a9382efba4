"""Shared pieces of the doctor tests (a helper module, not a conftest.py: a second conftest.py would shadow
tests/conftest.py for `from conftest import ...`).

- `cli(*argv)`: run `eagle3-capture ...` in-process, returning (exit code, stdout, stderr).
- `cli_subprocess(*argv)`: the same through `python -m eagle3_capture` in a fresh process (for the "never a
  traceback" checks, where the whole interpreter's output matters).
- `demo_fast()`: the fast demo, trained once per run and shared, pytest-xdist workers included (its draft, target,
  prompts, reference and captures feed the accept / dump-reference / fingerprint / check tests).
- `write_json`, config builders for small synthetic targets and drafts.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIGS = os.path.join(REPO, "tests", "data", "configs")
KIMI = os.path.join(CONFIGS, "target_kimi_k25")
DSV3_61 = os.path.join(CONFIGS, "target_deepseek_v3_61.json")


def cli(*argv):
    """(exit code, stdout, stderr) of `eagle3-capture argv...` run in this process."""
    from eagle3_capture.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse usage errors and --help
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return code, out.getvalue(), err.getvalue()


def cli_subprocess(*argv, timeout=240, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "eagle3_capture", *[str(a) for a in argv]], capture_output=True,
                       text=True, timeout=timeout, env=e, cwd=REPO)
    return p.returncode, p.stdout, p.stderr


def assert_clean_error(code, out, err, *needles):
    """A bad input: exit 2, a one-line 'error:' message naming the problem, no traceback."""
    assert code == 2, f"expected exit 2, got {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err and "Traceback" not in out, err
    assert "error:" in err, err
    for n in needles:
        assert n in err, f"{n!r} not in the message:\n{err}"


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def draft_config(ids=None, hidden=7168, **extra):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
           "target_hidden_size": hidden, "num_hidden_layers": 1}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    cfg.update(extra)
    return cfg


_DEMO = {}


def demo_fast():
    """The fast demo (`doctor demo --fast`, with the plot): (DemoResult, out dir), read-only for the tests. Trained
    once per run: in the run's shared folder (tests/conftest.py: E3_TEST_SHARED_DIR), under a file lock, so that
    pytest-xdist workers train it once between them; else once per process, in a folder of its own."""
    if "res" not in _DEMO:
        shared = os.environ.get("E3_TEST_SHARED_DIR")
        _DEMO["res"], _DEMO["out"] = _shared_demo(shared) if shared else _own_demo()
    return _DEMO["res"], _DEMO["out"]


def _run_demo(out: str):
    from eagle3_capture.doctor.demo.run import run_demo

    return run_demo(out_dir=out, fast=True, device="cpu", threads=1, seed=0, plot=True, progress=False)


def _own_demo():
    out = tempfile.mkdtemp(prefix="e3demo_")
    atexit.register(shutil.rmtree, out, True)  # the test process's own copy: gone when it exits
    return _run_demo(out), out


def _shared_demo(shared: str):
    import pickle

    from filelock import FileLock

    out = os.path.join(shared, "demo_fast")
    done = os.path.join(shared, "demo_fast.pickle")
    with FileLock(os.path.join(shared, "demo_fast.lock")):
        if not os.path.exists(done):
            shutil.rmtree(out, ignore_errors=True)  # a half-made one (a worker killed while training)
            res = _run_demo(out)
            with open(done + ".tmp", "wb") as f:
                pickle.dump(res, f)
            os.replace(done + ".tmp", done)
        with open(done, "rb") as f:
            return pickle.load(f), out


def replay_demo(demo_out: str, prompts, new_tokens: int, flags=(3, 1, 4)):
    """The doctor's offline replay of the demo pair in `demo_out` (its transformers target, its draft) served with
    SGLang flags (num-steps, eagle-topk, num-draft-tokens): per prompt (prompt, greedy continuation of new_tokens,
    SGLang's walk), what a correct server answers."""
    import torch

    from eagle3_capture.doctor.draft.side import load_draft_side
    from eagle3_capture.doctor.replay.evaluate import evaluate, served_walks
    from eagle3_capture.doctor.sglang_model.flag_rules import SpecResolution
    from eagle3_capture.doctor.target_side.model_side import TransformersTarget

    side = TransformersTarget.load(os.path.join(demo_out, "target"), device="cpu", seed=0, quiet=True)
    m = side.target.model
    ds = load_draft_side(os.path.join(demo_out, "draft"), side.info, None, "cpu", torch.float32,
                         m.get_input_embeddings().weight.detach(), m.get_output_embeddings().weight.detach())
    S, k, D = flags
    runs = evaluate(side, ds.draft, prompts, ds.taps, S, new_tokens, SpecResolution(S, k, D), 8, False)
    return [(r.prompt, r.seq[len(r.prompt): len(r.prompt) + new_tokens].tolist(), w)
            for r, w in zip(runs, served_walks(runs, new_tokens))]


def target_variant(demo_out: str, dest: str, state=None, config=None) -> str:
    """A copy of the demo's target directory at `dest` with its weights (`state`: a function of the state dict)
    and/or its config (`config`: a function changing the dict in place) changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(os.path.join(demo_out, "target"), dest)
    if state is not None:
        for f in [f for f in os.listdir(dest) if f.endswith(".safetensors")]:
            p = os.path.join(dest, f)
            save_file(state(load_file(p)), p, metadata={"format": "pt"})
    if config is not None:
        p = os.path.join(dest, "config.json")
        with open(p) as f:
            c = json.load(f)
        config(c)
        with open(p, "w") as f:
            json.dump(c, f)
    return dest
