"""Fuzz of the doctor CLI's inputs: hypothesis over flag values and over the files the doctor reads (configs,
reference and captured safetensors / .pt dumps) with wrong types, shapes and metadata. Whatever the input: the exit code is 0, 1 or 2, nothing raises out of the CLI, no traceback is printed,
and an exit 2 is one line naming the problem.

Two levels: the flag fuzz runs argparse and the value checks for every subcommand with the commands themselves
replaced by a recorder (a valid parse then exits 0 without loading models: their behaviour on valid values is the
other tests' business); the file fuzzes (configs here, tensors and dumps here, prompts and recorded responses in
test_doctor_run_fuzz.py) run the real commands, on the demo pair where they need models."""
from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from doctor_helpers import CONFIGS, DSV3_61
from fuzz_helpers import JSON_VALUE, SERVER_ARGS, TEXT, fuzz, run_cli, scratch_dir

DRAFT_OK = os.path.join(CONFIGS, "draft_eagle_config_ids.json")


@pytest.fixture(scope="module")
def scratch():
    with scratch_dir() as d:
        yield d


# ----------------------------------------------------------------------------------------------------------------
# flag values (commands replaced by a recorder)
# ----------------------------------------------------------------------------------------------------------------

INT_TEXT = st.one_of(st.integers(-3, 5).map(str), st.integers(-2 ** 70, 2 ** 70).map(str),
                     st.sampled_from(["", "x", "1.5", "1e3", "nan", " 3", "0x10", "--1", "٣", "+2"]))
FLOAT_TEXT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.sampled_from(["nan", "inf", "-inf", "1e309", "", "abc", "0", "1", "-1", "0.5", "1e-300"]))


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

DRAFT_KEYS = ["architectures", "model_type", "hidden_size", "target_hidden_size", "num_hidden_layers", "fc_norm",
              "use_aux_norm", "norm_before_fc", "num_aux_hidden_states", "eagle_aux_hidden_state_layer_ids",
              "eagle_config", "ec.eagle_aux_hidden_state_layer_ids", "ec.eagle_aux_hidden_state_convention",
              "ec.use_aux_hidden_state", "ec.norm_before_fc"]
TARGET_KEYS = ["num_hidden_layers", "hidden_size", "model_type", "architectures", "first_k_dense_replace",
               "text_config", "text_config.num_hidden_layers", "text_config.model_type", "llm_config"]

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


