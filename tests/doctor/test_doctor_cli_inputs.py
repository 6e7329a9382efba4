"""Every doctor flag's bad values end in exit 2 and one line naming the flag, before any work: integers out of
range, non-finite floats, output paths that are directories (or files where a directory is wanted), seeds torch
cannot take, flag combinations that would be ignored; server flags out of SGLang's range; config fields of the
wrong type. (The fuzz over the same inputs is test_doctor_cli_fuzz.py.)"""
import json
import os

import pytest

from doctor_helpers import CONFIGS, DSV3_61, assert_clean_error, cli, cli_subprocess, demo_fast, write_json

DRAFT_OK = os.path.join(CONFIGS, "draft_eagle_config_ids.json")


def one_line(code, out, err, *needles):
    assert_clean_error(code, out, err, *needles)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    prompts = write_json(str(d / "prompts.json"), [[1, 2, 3, 4]])
    return {"dir": str(d), "prompts": prompts, "file": prompts}


def _argv(sub, files):
    d, p = files["dir"], files["prompts"]
    return {
        "check": ["doctor", "check", "--target-config", DSV3_61, "--draft-config", DRAFT_OK],
        "fingerprint": ["doctor", "fingerprint", "--reference", p, "--captured", p],
        "dump-reference": ["doctor", "dump-reference", "--model", "demo", "--prompts", p, "--out",
                           os.path.join(d, "r.safetensors")],
        "accept": ["doctor", "accept", "--target", "demo", "--draft", d, "--prompts", p],
        "online": ["doctor", "online", "--server", "http://127.0.0.1:9", "--target", "demo", "--draft", d,
                   "--prompts", p, "--new-tokens", "4"],
        "demo": ["doctor", "demo", "--fast", "--no-plot"],
    }[sub]


BAD_FLAGS = [
    # (subcommand, flag, value, needle)
    ("accept", "--batch-size", "0", "expected an integer >= 1, got 0"),
    ("accept", "--batch-size", "x", "expected an integer >= 1, got 'x'"),
    ("accept", "--steps", "0", "expected an integer >= 1, got 0"),
    ("accept", "--steps", "-3", "got -3"),
    ("accept", "--new-tokens", "-5", "expected an integer >= 2, got -5"),
    ("accept", "--new-tokens", "1.5", "got '1.5'"),
    ("accept", "--threads", "-1", "got -1"),
    ("accept", "--threads", "100000", "(this machine's CPUs), got 100000"),
    ("accept", "--threads", "0", "got 0"),
    ("accept", "--seed", "-1", "seed in 0..2**63-1"),
    ("accept", "--seed", str(2 ** 64), "seed in 0..2**63-1"),
    ("dump-reference", "--new-tokens", "-1", "expected an integer >= 0, got -1"),
    ("dump-reference", "--threads", "-1", "got -1"),
    ("dump-reference", "--seed", "1e3", "got '1e3'"),
    ("online", "--concurrency", "0", "got 0"),
    ("online", "--batch-size", "0", "got 0"),
    ("online", "--timeout", "nan", "expected a number in (0, 86400], got 'nan'"),
    ("online", "--timeout", "0", "expected a number in (0, 86400]"),
    ("online", "--timeout", "inf", "got 'inf'"),
    ("online", "--tolerance", "nan", "expected a number in [0, 1)"),
    ("online", "--tolerance", "1", "expected a number in [0, 1), got 1"),
    ("online", "--tolerance", "-0.1", "got -0.1"),
    ("online", "--new-tokens", "1", "expected an integer >= 2, got 1"),
    ("fingerprint", "--min-cos", "nan", "expected a number in [-1, 1]"),
    ("fingerprint", "--min-cos", "1.5", "got 1.5"),
    ("demo", "--threads", "-1", "got -1"),
    ("demo", "--threads", "0", "got 0"),
    ("demo", "--seed", "-7", "seed in 0..2**63-1"),
]


@pytest.mark.parametrize("sub, flag, value, needle", BAD_FLAGS, ids=[f"{s}{f}={v}" for s, f, v, _ in BAD_FLAGS])
def test_bad_flag_values(files, sub, flag, value, needle):
    one_line(*cli(*_argv(sub, files), flag, value), f"argument {flag}", needle)


@pytest.mark.parametrize("sub, flag", [("check", "--json"), ("fingerprint", "--json"), ("dump-reference", "--out"),
                                       ("accept", "--json"), ("accept", "--tensors"), ("online", "--json")])
def test_output_files_that_cannot_be_written(files, sub, flag):
    argv = _argv(sub, files)
    if flag in argv:
        i = argv.index(flag)
        argv = argv[:i] + argv[i + 2:]
    one_line(*cli(*argv, flag, files["dir"]), f"argument {flag}", "is a directory")
    one_line(*cli(*argv, flag, os.path.join(files["file"], "under_a_file.json")), f"argument {flag}", "is a file")


def test_demo_out_that_is_a_file(files):
    one_line(*cli("doctor", "demo", "--fast", "--out", files["file"]), "argument --out", "is a file")


def test_argparse_errors_are_one_line(files):
    one_line(*cli("doctor", "check", "--target-config", DSV3_61), "--draft-config")
    one_line(*cli("doctor", "nosuch"), "invalid choice")
    one_line(*cli("doctor", "fingerprint", "--reference", "a", "--captured", "b", "--bogus"), "--bogus")


@pytest.mark.parametrize("extra, needle", [
    (["--taps", ""], "--taps ''"),
    (["--taps", "draft_ids:-1,1", "--draft-config", DRAFT_OK, "--target-config", DSV3_61], "give one of them"),
    (["--target-config", DSV3_61], "--target-config needs --draft-config"),
    (["--draft-config", DRAFT_OK], "--draft-config needs --target-config"),
])
def test_fingerprint_flag_combinations_that_would_be_ignored(files, extra, needle):
    one_line(*cli(*_argv("fingerprint", files), *extra), needle)


@pytest.mark.parametrize("flags, needle", [
    ("--tp 0", "--tp must be >= 1, got 0"),
    ("--tp-size -2", "--tp-size must be >= 1, got -2"),
    ("--pp 0", "--pp must be >= 1"),
    ("--dp-size 0 --enable-dp-attention", "--dp-size must be >= 1"),
    ("--attn-dp-size -1", "--attn-dp-size must be >= 1"),
    ("--page-size 0", "--page-size must be >= 1"),
    ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
     "--speculative-num-draft-tokens -4", "--speculative-num-draft-tokens must be >= 1, got -4"),
    ("--speculative-num-steps -1 --speculative-eagle-topk 1", "--speculative-num-steps must be >= 0, got -1"),
    ("--speculative-num-steps 3 --speculative-eagle-topk -2", "--speculative-eagle-topk must be >= 0, got -2"),
])
def test_server_flags_out_of_range(flags, needle):
    one_line(*cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", DRAFT_OK,
                  f"--server-args={flags}"), needle)


def _draft(tmp_path, **fields):
    d = json.load(open(DRAFT_OK))
    for k, v in fields.items():
        if k.startswith("ec_"):
            d["eagle_config"][k[3:]] = v
        else:
            d[k] = v
    return write_json(str(tmp_path / "draft.json"), d)


@pytest.mark.parametrize("fields, needle", [
    ({"ec_eagle_aux_hidden_state_convention": ["draft_ids"]}, "eagle_aux_hidden_state_convention"),
    ({"ec_use_aux_hidden_state": "false"}, "'eagle_config.use_aux_hidden_state' must be true or false"),
    ({"fc_norm": "no"}, "'fc_norm' must be true or false"),
    ({"architectures": {"a": 1}}, "'architectures' must be a list of strings"),
    ({"model_type": 3}, "'model_type' must be a string"),
])
def test_draft_config_fields_of_the_wrong_type(tmp_path, fields, needle):
    p = _draft(tmp_path, **fields)
    one_line(*cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", p), p, needle)


def test_target_config_fields_of_the_wrong_type(tmp_path):
    t = json.load(open(DSV3_61))
    p = write_json(str(tmp_path / "t.json"), {**t, "first_k_dense_replace": "3"})
    one_line(*cli("doctor", "check", "--target-config", p, "--draft-config", DRAFT_OK,
                  "--server-args=--enable-two-batch-overlap"), "'first_k_dense_replace' must be a non-negative integer")
    p = write_json(str(tmp_path / "t2.json"), {**t, "model_type": ["deepseek_v3"]})
    one_line(*cli("doctor", "check", "--target-config", p, "--draft-config", DRAFT_OK), "'model_type' must be a string")


def test_bad_inputs_in_a_fresh_process(tmp_path, files):
    """A bad value for each kind of input (a config field, an integer flag, an output path...), through
    `python -m eagle3_capture`: the whole interpreter's output is one line naming the input."""
    p = _draft(tmp_path, ec_eagle_aux_hidden_state_convention=["draft_ids"])
    for argv, needle in (
            (["doctor", "check", "--target-config", DSV3_61, "--draft-config", p], "convention"),
            (_argv("accept", files) + ["--batch-size", "0"], "--batch-size"),
            (_argv("dump-reference", files) + ["--threads", "-1"], "--threads"),
            (_argv("dump-reference", files)[:-2] + ["--out", files["dir"]], "--out"),
            (_argv("accept", files) + ["--steps", "0"], "--steps"),
            (_argv("dump-reference", files) + ["--new-tokens", "-2"], "--new-tokens"),
            (["doctor", "check", "--target-config", DSV3_61, "--draft-config", DRAFT_OK, "--server-args=--tp 0"],
             "--tp")):
        one_line(*cli_subprocess(*argv), needle)


def test_accept_steps_fewer_than_the_chain(tmp_path):
    res, out = demo_fast()
    prompts = write_json(str(tmp_path / "p.json"), [[3, 4, 5, 6, 7, 8]])
    one_line(*cli("doctor", "accept", "--target", "demo", "--draft", os.path.join(out, "draft"), "--prompts", prompts,
                  "--new-tokens", "4", "--no-progress", "--steps", "2", "--server-args",
                  "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"),
             "--steps 2: fewer than the 4 draft steps", "--speculative-num-steps 4")


def test_a_config_that_is_not_utf8_is_named(tmp_path):
    """check reads both configs through configs.py; accept/online/dump-reference read a target's through the
    doctor's reader: every one names the file."""
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"num_hidden_layers": 4, "x": "\xff"}')
    one_line(*cli("doctor", "check", "--target-config", bad, "--draft-config", DRAFT_OK),
             f"target config {bad}", "not UTF-8")
    one_line(*cli("doctor", "check", "--target-config", DSV3_61, "--draft-config", bad),
             f"draft config {bad}", "not UTF-8")
    one_line(*cli("doctor", "dump-reference", "--model", tmp_path, "--prompts", write_json(str(tmp_path / "p.json"),
                                                                                          [[1, 2]]),
                  "--out", tmp_path / "r.safetensors"), str(bad), "not UTF-8")
