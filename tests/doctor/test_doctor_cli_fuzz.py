"""Fuzz of the doctor CLI's inputs: hypothesis over flag values and over the files the doctor reads (configs,
reference and captured safetensors / .pt dumps, prompts, recorded server responses) with wrong types, shapes and
metadata. Whatever the input: the exit code is 0, 1 or 2, nothing raises out of the CLI, no traceback is printed,
and an exit 2 is one line naming the problem.

Two levels: the flag fuzz runs argparse and the value checks for every subcommand with the commands themselves
replaced by a recorder (a valid parse then exits 0 without loading models: their behaviour on valid values is the
other tests' business); the file and run fuzzes run the real commands, on the demo pair where they need models."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from conftest import fuzz_examples
from doctor_helpers import CONFIGS, DSV3_61, cli, demo_fast, replay_demo

DRAFT_OK = os.path.join(CONFIGS, "draft_eagle_config_ids.json")
def fuzz(n: int) -> settings:
    return settings(max_examples=fuzz_examples(n), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def run_cli(*argv):
    """(code, stdout, stderr), failing the test on an exception out of the CLI or a traceback in its output."""
    try:
        code, out, err = cli(*argv)
    except BaseException as e:  # anything but SystemExit escaping main() is the bug the fuzz looks for
        pytest.fail(f"eagle3-capture {' '.join(map(str, argv))[:300]} raised {type(e).__name__}: {e}")
    assert code in (0, 1, 2), (code, argv, err[-500:])
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines and "error:" in lines[-1], err
        assert len(lines) == 1, f"exit 2 with {len(lines)} lines on stderr:\n{err}"
    return code, out, err


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="e3fuzz_") as d:
        os.makedirs(os.path.join(d, "adir"))
        with open(os.path.join(d, "afile.json"), "w") as f:
            json.dump([[1, 2, 3, 4]], f)
        yield d


# ----------------------------------------------------------------------------------------------------------------
# flag values (commands replaced by a recorder)
# ----------------------------------------------------------------------------------------------------------------

INT_TEXT = st.one_of(st.integers(-3, 5).map(str), st.integers(-2 ** 70, 2 ** 70).map(str),
                     st.sampled_from(["", "x", "1.5", "1e3", "nan", " 3", "0x10", "--1", "٣", "+2"]))
FLOAT_TEXT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.sampled_from(["nan", "inf", "-inf", "1e309", "", "abc", "0", "1", "-1", "0.5", "1e-300"]))
TEXT = st.text(min_size=0, max_size=12)


def path_text(scratch):
    return st.sampled_from([os.path.join(scratch, "adir"), os.path.join(scratch, "afile.json"),
                            os.path.join(scratch, "afile.json", "under.json"), os.path.join(scratch, "new", "o.json"),
                            os.path.join(scratch, "o.json"), "", "/proc/nope/x.json"])


FLAGS = {  # subcommand -> {flag: kind}; kinds: int, float, text, out (a file), outdir, bool, device, dtype
    "check": {"--server-args": "text", "--json": "out", "--with-plugin": "bool"},
    "fingerprint": {"--taps": "text", "--min-cos": "float", "--json": "out"},
    "dump-reference": {"--new-tokens": "int", "--dtype": "dtype", "--device": "device", "--threads": "int",
                       "--seed": "int", "--out": "out"},
    "accept": {"--server-args": "text", "--taps": "text", "--new-tokens": "int", "--steps": "int",
               "--batch-size": "int", "--device": "device", "--threads": "int", "--json": "out", "--tensors": "out",
               "--no-progress": "bool", "--seed": "int", "--profile-out": "out"},
    "online": {"--server-args": "text", "--new-tokens": "int", "--taps": "text", "--tolerance": "float",
               "--timeout": "float", "--concurrency": "int", "--batch-size": "int", "--device": "device",
               "--threads": "int", "--json": "out", "--no-progress": "bool", "--seed": "int", "--profile-out": "out"},
    "demo": {"--out": "outdir", "--fast": "bool", "--device": "device", "--threads": "int", "--seed": "int",
             "--no-plot": "bool", "--no-progress": "bool"},
}
REQUIRED = {
    "check": lambda d: ["--target-config", DSV3_61, "--draft-config", DRAFT_OK],
    "fingerprint": lambda d: ["--reference", os.path.join(d, "afile.json"), "--captured", os.path.join(d, "adir")],
    "dump-reference": lambda d: ["--model", "demo", "--prompts", os.path.join(d, "afile.json")],
    "accept": lambda d: ["--target", "demo", "--draft", os.path.join(d, "adir"), "--prompts",
                         os.path.join(d, "afile.json")],
    "online": lambda d: ["--server", "http://127.0.0.1:9", "--target", "demo", "--draft", os.path.join(d, "adir"),
                         "--prompts", os.path.join(d, "afile.json")],
    "demo": lambda d: [],
}


@st.composite
def doctor_argv(draw, scratch):
    sub = draw(st.sampled_from(sorted(FLAGS)))
    argv = ["doctor", sub] + REQUIRED[sub](scratch)
    if sub == "dump-reference" and draw(st.booleans()):
        argv += ["--out", os.path.join(scratch, "ref.safetensors")]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS[sub])), max_size=4, unique=True)):
        kind = FLAGS[sub][flag]
        if kind == "bool":
            argv.append(flag)
            continue
        value = draw({"int": INT_TEXT, "float": FLOAT_TEXT, "text": TEXT, "out": path_text(scratch),
                      "outdir": path_text(scratch), "device": st.sampled_from(["auto", "cpu", "cuda", "tpu", "", "CPU"]),
                      "dtype": st.sampled_from(["float32", "bfloat16", "int8", ""])}[kind])
        argv.append(f"{flag}={value}")  # '=' so that values starting with '-' stay values
    return sub, argv


@contextlib.contextmanager
def recorded_commands():
    """The doctor's commands replaced, for the block only, by a recorder that prints which one it was given (every
    subcommand goes through cli.run_command once its flags are parsed)."""
    from eagle3_capture.doctor import cli as dcli

    def recorder(args):
        print("parsed", args.doctor_command)
        return 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcli, "run_command", recorder)
        yield


@fuzz(300)
@given(data=st.data())
def test_fuzz_flag_values(scratch, data):
    sub, argv = data.draw(doctor_argv(scratch))
    with recorded_commands():
        code, out, err = run_cli(*argv)
    if code == 0:
        assert out.startswith("parsed "), out  # the recorder ran: every flag's value passed its check


def test_valid_flag_values_reach_the_command(scratch):
    """The recorder is reached for valid values (so the fuzz's exit-2 cases are the checks, not a broken parse),
    and only inside its block: the other fuzzes below run the real commands."""
    with recorded_commands():
        code, out, err = run_cli("doctor", "accept", *REQUIRED["accept"](scratch), "--new-tokens=3", "--steps=4",
                                 "--batch-size=2", "--threads=1", "--seed=0", f"--json={scratch}/o.json")
    assert code == 0 and out.startswith("parsed accept"), err
    code, out, err = run_cli("doctor", "check", *REQUIRED["check"](scratch))
    assert not out.startswith("parsed") and "trained taps" in out, out


# ----------------------------------------------------------------------------------------------------------------
# config files (real `check`)
# ----------------------------------------------------------------------------------------------------------------

JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) |
                          st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
DRAFT_KEYS = ["architectures", "model_type", "hidden_size", "target_hidden_size", "num_hidden_layers", "fc_norm",
              "use_aux_norm", "norm_before_fc", "num_aux_hidden_states", "eagle_aux_hidden_state_layer_ids",
              "eagle_config", "ec.eagle_aux_hidden_state_layer_ids", "ec.eagle_aux_hidden_state_convention",
              "ec.use_aux_hidden_state", "ec.norm_before_fc"]
TARGET_KEYS = ["num_hidden_layers", "hidden_size", "model_type", "architectures", "first_k_dense_replace",
               "text_config", "text_config.num_hidden_layers", "text_config.model_type", "llm_config"]
SERVER_ARGS = st.one_of(TEXT, st.lists(st.sampled_from(
    ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "--speculative-eagle-topk",
     "--speculative-num-draft-tokens", "--tp", "--pp-size", "--page-size", "--enable-two-batch-overlap",
     "--enable-dp-attention", "--dp-size", "--attn-dp-size", "--attention-backend", "fa3", "0", "-1", "3", "1",
     "x", "--speculative-adaptive=maybe", "'", "--tp=2"]), max_size=10).map(" ".join))


def _mutate(base: dict, keys, data) -> dict:
    d = json.loads(json.dumps(base))
    for key in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
        parent, _, leaf = key.rpartition(".")
        holder = d
        if parent:
            parent = {"ec": "eagle_config"}.get(parent, parent)
            if not isinstance(d.get(parent), dict):
                d[parent] = {}
            holder = d[parent]
        if data.draw(st.booleans()):
            holder[leaf] = data.draw(JSON_VALUE)
        else:
            holder.pop(leaf, None)
    return d


@fuzz(150)
@given(data=st.data())
def test_fuzz_config_files(scratch, data):
    draft = json.load(open(DRAFT_OK))
    target = json.load(open(DSV3_61))
    which = data.draw(st.sampled_from(["draft", "target", "both"]))
    if which in ("draft", "both"):
        draft = _mutate(draft, DRAFT_KEYS, data)
    if which in ("target", "both"):
        target = _mutate(target, TARGET_KEYS, data)
    dp, tp = os.path.join(scratch, "fz_draft.json"), os.path.join(scratch, "fz_target.json")
    for p, obj in ((dp, draft), (tp, target)):
        with open(p, "w") as f:
            json.dump(obj, f)
    extra = [f"--server-args={data.draw(SERVER_ARGS)}"] if data.draw(st.booleans()) else []
    run_cli("doctor", "check", "--target-config", tp, "--draft-config", dp, *extra)


# ----------------------------------------------------------------------------------------------------------------
# reference and captured files (real `fingerprint`)
# ----------------------------------------------------------------------------------------------------------------

L, H, T = 4, 8, 12
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool]


def _good_stack():
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(T, H, generator=g)]
    for _ in range(L):
        x.append(x[-1] + torch.randn(T, H, generator=g))
    return torch.stack(x)


def _tensor(data, shape_hint):
    """A tensor of a drawn dtype and a shape near `shape_hint` (the right one, one more or one less dimension, or
    sizes off by one), sometimes with NaN/Inf or zero rows."""
    shape = list(shape_hint)
    choice = data.draw(st.sampled_from(["same", "drop", "add", "off", "empty"]))
    if choice == "drop" and shape:
        shape = shape[1:]
    elif choice == "add":
        shape = shape + [2]
    elif choice == "off" and shape:
        i = data.draw(st.integers(0, len(shape) - 1))
        shape[i] = max(0, shape[i] + data.draw(st.sampled_from([-1, 1])))
    elif choice == "empty" and shape:
        shape[0] = 0
    dtype = data.draw(st.sampled_from(DTYPES))
    t = (torch.randn(shape) * 3).to(dtype) if dtype.is_floating_point else torch.randint(0, 50, shape).to(dtype)
    if dtype.is_floating_point and t.numel() and data.draw(st.booleans()):
        t.view(-1)[data.draw(st.integers(0, t.numel() - 1))] = data.draw(
            st.sampled_from([float("nan"), float("inf"), 0.0]))
    return t


META_VALUE = st.one_of(st.text(max_size=10), JSON_VALUE.map(json.dumps), st.sampled_from(['"abc"', "3.5", "-1",
                                                                                         "[1, 2]", "{}", "true"]))


def _reference(path, data, mutate: bool):
    from eagle3_capture.doctor.fingerprint.files import REFERENCE_FORMAT

    stack = _good_stack()
    t = {"hidden_states": torch.cat([stack[:L], (stack[L] * 1.7)[None]]), "final_prenorm": stack[L].clone(),
         "input_ids": torch.arange(100, 100 + T), "positions": torch.arange(T)}
    meta = {"format": REFERENCE_FORMAT, "num_layers": str(L), "hidden_size": str(H)}
    if mutate:
        for key in data.draw(st.lists(st.sampled_from(sorted(t) + ["meta." + k for k in meta] + ["meta.extra"]),
                                      min_size=1, max_size=3, unique=True)):
            if key.startswith("meta."):
                k = key[5:]
                if data.draw(st.booleans()):
                    meta[k] = data.draw(META_VALUE)
                else:
                    meta.pop(k, None)
            elif data.draw(st.booleans()):
                t[key] = _tensor(data, t[key].shape)
            else:
                t.pop(key)
    save_file({k: v.contiguous() for k, v in t.items()}, path, metadata=meta)


def _captured_dict(data, mutate: bool) -> dict:
    stack = _good_stack()
    d = {"aux": torch.cat([stack[0], stack[2], stack[L]], -1), "input_ids": torch.arange(100, 100 + T),
         "positions": torch.arange(T), "draft_ids": [-1, 1, L - 1], "layers_to_capture": [0, 2, L],
         "num_layers": L, "hidden_size": H}
    if mutate:
        for key in data.draw(st.lists(st.sampled_from(sorted(d)), min_size=1, max_size=3, unique=True)):
            how = data.draw(st.sampled_from(["tensor", "json", "drop"]))
            if how == "tensor":
                d[key] = _tensor(data, d[key].shape if isinstance(d[key], torch.Tensor) else (3,))
            elif how == "json":
                d[key] = data.draw(JSON_VALUE)
            else:
                d.pop(key)
    return d


@fuzz(150)
@given(data=st.data())
def test_fuzz_reference_and_captured_files(scratch, data):
    ref = os.path.join(scratch, "fz_ref.safetensors")
    which = data.draw(st.sampled_from(["reference", "captured", "both"]))
    _reference(ref, data, mutate=which in ("reference", "both"))
    d = _captured_dict(data, mutate=which in ("captured", "both"))
    form = data.draw(st.sampled_from(["pt", "safetensors"]))
    if form == "pt":
        cap = os.path.join(scratch, "fz_cap.pt")
        torch.save(d, cap)
    else:
        cap = os.path.join(scratch, "fz_cap.safetensors")
        tensors = {k: v.contiguous() for k, v in d.items() if isinstance(v, torch.Tensor)}
        meta = {k: json.dumps(v) if data.draw(st.booleans()) else data.draw(META_VALUE)
                for k, v in d.items() if not isinstance(v, torch.Tensor)}
        save_file(tensors, cap, metadata=meta)
    extra = []
    if data.draw(st.booleans()):
        extra = [f"--taps={data.draw(st.sampled_from(['draft_ids:-1,1,3', 'layer_inputs:0,2,4', 'hf:0,1', '-1,9', 'x:1', 'draft_ids:3,1']))}"]
    run_cli("doctor", "fingerprint", "--reference", ref, "--captured", cap, *extra)


# ----------------------------------------------------------------------------------------------------------------
# prompts (real `dump-reference` on the demo target) and recorded responses (real `online` on the demo pair)
# ----------------------------------------------------------------------------------------------------------------

PROMPT_ENTRY = st.one_of(st.lists(st.integers(-3, 300), max_size=5), st.text(max_size=6), st.booleans(),
                         st.none(), st.lists(st.booleans(), max_size=2), st.dictionaries(
                             st.sampled_from(["input_ids", "prompt", "text", "x"]), JSON_VALUE, max_size=2))


@fuzz(25)
@given(data=st.data())
def test_fuzz_prompts_files(scratch, data):
    ext = data.draw(st.sampled_from([".json", ".jsonl", ".txt"]))
    p = os.path.join(scratch, "fz_prompts" + ext)
    entries = data.draw(st.lists(PROMPT_ENTRY, max_size=3))
    with open(p, "w") as f:
        if ext == ".json":
            json.dump(data.draw(st.sampled_from([entries, {"prompts": entries}, {"x": 1}, 3])), f)
        elif ext == ".jsonl":
            f.write("\n".join(json.dumps(e) for e in entries) + data.draw(st.sampled_from(["", "\n{bad"])))
        else:
            f.write("\n".join(str(e) for e in entries))
    run_cli("doctor", "dump-reference", "--model", "demo", "--prompts", p, "--out",
            os.path.join(scratch, "fz_ref_out.safetensors"), "--threads=1")


@pytest.fixture(scope="module")
def demo_pair():
    res, out = demo_fast()
    return os.path.join(out, "draft")


META = {"completion_tokens": 4, "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 1, 1]}


@fuzz(20)
@given(data=st.data())
def test_fuzz_recorded_responses(scratch, demo_pair, data):
    prompt = [5, 6, 7, 8]
    pp = os.path.join(scratch, "fz_online_prompts.json")
    with open(pp, "w") as f:
        json.dump([prompt], f)
    line = {"input_ids": prompt, "output_ids": [1, 2, 3, 4], "meta_info": dict(META)}
    for key in data.draw(st.lists(st.sampled_from(["input_ids", "output_ids", "meta_info", "meta.completion_tokens",
                                                   "meta.spec_verify_ct", "meta.spec_correct_drafts_histogram",
                                                   "meta.spec_num_proposed_drafts", "error"]),
                                  min_size=1, max_size=3, unique=True)):
        holder, k = (line.get("meta_info"), key[5:]) if key.startswith("meta.") else (line, key)
        if not isinstance(holder, dict):
            continue
        if data.draw(st.booleans()):
            holder[k] = data.draw(JSON_VALUE)
        else:
            holder.pop(k, None)
    rp = os.path.join(scratch, "fz_recorded.jsonl")
    with open(rp, "w") as f:
        f.write(json.dumps(line) + "\n" + data.draw(st.sampled_from(["", "[]", "{", "null"])) + "\n")
    run_cli("doctor", "online", "--server", rp, "--prompts", pp, "--target", "demo", "--draft", demo_pair,
            "--server-args", "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "--no-progress", "--threads=1")


@fuzz(12)
@given(steps=st.one_of(st.none(), st.integers(1, 5)), batch=st.integers(1, 3), new=st.integers(2, 4),
       taps=st.one_of(st.none(), st.sampled_from(["draft_ids:-1,0,3", "layer_inputs:0,1,4", "draft_ids:-1,0",
                                                  "hf:0,1,4", "draft_ids:3,1,0", "junk"])),
       server=st.one_of(st.none(), SERVER_ARGS))
def test_fuzz_accept_runs(scratch, demo_pair, steps, batch, new, taps, server):
    pp = os.path.join(scratch, "fz_accept_prompts.json")
    with open(pp, "w") as f:
        json.dump([[5, 6, 7, 8], [9, 10, 11]], f)
    argv = ["doctor", "accept", "--target", "demo", "--draft", demo_pair, "--prompts", pp, "--no-progress",
            "--threads=1", f"--new-tokens={new}", f"--batch-size={batch}"]
    argv += [] if steps is None else [f"--steps={steps}"]
    argv += [] if taps is None else [f"--taps={taps}"]
    argv += [] if server is None else [f"--server-args={server}"]
    run_cli(*argv)


# ----------------------------------------------------------------------------------------------------------------
# recorded responses' counts (real `online` on the demo pair): every meta_info field, old names and new
# ----------------------------------------------------------------------------------------------------------------

ONLINE_N = 8
ONLINE_FLAGS = (3, 1, 4)  # num-steps, eagle-topk, num-draft-tokens
COUNT_FIELDS = ["completion_tokens", "spec_verify_ct", "spec_correct_drafts_histogram", "spec_num_correct_drafts",
                "spec_num_proposed_drafts", "spec_accept_length", "spec_accept_rate", "num_retractions",
                "prompt_tokens", "output_ids"]


@pytest.fixture(scope="module")
def served_prompt(demo_pair):
    """One prompt, its greedy continuation and SGLang's walk for it (what a correct server answers)."""
    res, out = demo_fast()
    prompt = json.load(open(os.path.join(out, "prompts.json")))[0]
    [(prompt, cont, walk)] = replay_demo(out, [prompt], ONLINE_N, ONLINE_FLAGS)
    return prompt, cont, walk


def sglang_could_report(meta: dict, out_len: int, prompt_len: int, flags=ONLINE_FLAGS) -> bool:
    """The oracle, written apart from doctor/sglang_model/responses.py: simulate SGLang 0.5.23's counters for every verify
    order the counts allow and see whether one gives these figures (and a response the replay can use: ignore_eos
    run to max_new_tokens, no retraction)."""
    S, k, D = flags
    most = S if k == 1 else min(S, D - 1)

    def count(key):
        v = meta.get(key)
        return v if type(v) is int and v >= 0 else None

    c = count("completion_tokens")
    if c is None or c != ONLINE_N or out_len != c:
        return False
    if "num_retractions" in meta and count("num_retractions") != 0:
        return False
    if "prompt_tokens" in meta and count("prompt_tokens") != prompt_len:
        return False
    hist = meta.get("spec_correct_drafts_histogram")
    if hist is not None and not (isinstance(hist, list) and all(type(x) is int and x >= 0 for x in hist)):
        return False
    for key in ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
        if key in meta and count(key) is None:
            return False
    v = count("spec_verify_ct")
    if v is None:
        p = count("spec_num_proposed_drafts")
        if p is None or p % (D - 1):
            return False
        v = p // (D - 1)
    verifies = [n for n, x in enumerate(hist) for _ in range(x)] if hist is not None else None
    if verifies is not None and len(verifies) != v:
        return False
    a = sum(verifies) if verifies is not None else count("spec_num_correct_drafts")
    if "spec_num_correct_drafts" in meta and count("spec_num_correct_drafts") != a:
        return False
    if "spec_num_proposed_drafts" in meta and count("spec_num_proposed_drafts") != v * (D - 1):
        return False
    if v == 0 or (verifies is not None and any(n > most for n in verifies)):
        return False
    if a is None:  # only the verify count: some accepted counts 0..most per verify must give c
        if not 1 + v <= c <= 1 + v * (1 + most):
            return False
    else:
        if a > v * most:
            return False
        lasts = set(verifies) if verifies is not None else set(range(0, min(a, most) + 1))
        ok = False
        for n_last in lasts:  # the walk: the prefill's token, then each verify's run; only the last one is cut
            before = 1 + (v - 1) + (a - n_last)
            if before < c <= before + n_last + 1:
                ok = True
        if not ok:
            return False
    for key, want in (("spec_accept_length", c / v), ("spec_accept_rate", None if a is None else a / (v * (D - 1)))):
        x = meta.get(key)
        if key in meta and (type(x) not in (int, float) or x != x or abs(x) == float("inf") or x < 0 or
                            (want is not None and abs(x - want) > 1e-6 * max(1.0, want))):
            return False
    return True


@fuzz(60)
@given(data=st.data())
def test_fuzz_recorded_counts(scratch, demo_pair, served_prompt, data):
    """Recorded responses with every meta_info field fuzzed around what a correct server reports (old names, new,
    both): exit 2 (one line) exactly when no SGLang walk gives the figures, else the comparison's verdict (0 or 1)."""
    prompt, cont, walk = served_prompt
    S, k, D = ONLINE_FLAGS
    a = sum(n * x for n, x in enumerate(walk.histogram))
    names = data.draw(st.sampled_from(["old", "new", "both"]))
    meta = {"completion_tokens": walk.completion_tokens, "prompt_tokens": len(prompt), "num_retractions": 0,
            "spec_accept_length": walk.completion_tokens / walk.verify_ct, "spec_accept_rate": a / (walk.verify_ct * 3)}
    if names in ("old", "both"):
        meta.update(spec_verify_ct=walk.verify_ct, spec_correct_drafts_histogram=list(walk.histogram))
    if names in ("new", "both"):
        meta.update(spec_num_correct_drafts=a, spec_num_proposed_drafts=walk.verify_ct * (D - 1))
    out = list(cont)
    for key in data.draw(st.lists(st.sampled_from(COUNT_FIELDS), max_size=3, unique=True)):
        how = data.draw(st.sampled_from(["nudge", "nudge", "drop", "json", "zero", "huge"]))
        if key == "output_ids":
            out = out[:-1] if how == "drop" else out + [1] if how == "nudge" else out
            continue
        if how == "drop":
            meta.pop(key, None)
        elif how == "json":
            meta[key] = data.draw(JSON_VALUE)
        elif how == "zero":
            meta[key] = [] if key == "spec_correct_drafts_histogram" else 0
        elif how == "huge":
            meta[key] = [0, 0, 0, 10 ** 6] if key == "spec_correct_drafts_histogram" else 10 ** 6
        elif key == "spec_correct_drafts_histogram" and isinstance(meta.get(key), list) and meta[key]:
            h = list(meta[key])
            i = data.draw(st.integers(0, len(h) + 1))
            h += [0] * (i + 1 - len(h))
            h[i] = max(0, h[i] + data.draw(st.sampled_from([-1, 1])))
            j = data.draw(st.integers(0, len(h) - 1))
            h[j] = max(0, h[j] + data.draw(st.sampled_from([-1, 0, 1])))
            meta[key] = h
        elif isinstance(meta.get(key), (int, float)) and not isinstance(meta.get(key), bool):
            meta[key] = meta[key] + data.draw(st.sampled_from([-2, -1, 1, 2, 0.5]))
    line = {"input_ids": prompt, "output_ids": out, "meta_info": meta}
    pp, rp = os.path.join(scratch, "fz_counts_prompts.json"), os.path.join(scratch, "fz_counts.jsonl")
    with open(pp, "w") as f:
        json.dump([prompt], f)
    with open(rp, "w") as f:
        f.write(json.dumps(line) + "\n")
    code, text, err = run_cli("doctor", "online", "--server", rp, "--prompts", pp, "--target", "demo", "--draft",
                              demo_pair, "--server-args", "--speculative-algorithm EAGLE3 --speculative-num-steps 3 "
                              "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4", "--no-progress",
                              "--threads=1")
    possible = sglang_could_report(meta, len(out), len(prompt))
    event(f"exit {code}, {'a server could report it' if possible else 'impossible or unusable'}")
    if possible:
        assert code in (0, 1), (meta, len(out), err)
        assert "verdict:" in text
    else:
        assert code == 2, (meta, len(out), code, text[-800:])
