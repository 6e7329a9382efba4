"""Every size the doctor takes is bounded (doctor/bounds.py): positions by the target's max_position_embeddings,
draft steps and the tree by stated limits, eagle-topk by the draft's vocabulary, threads by the CPU count, the
server timeout by a day; and the inputs that printed tracebacks -- malformed --server URLs, eagle-topk 0 or beyond
the vocabulary, a tree with num-steps 0, outputs that cannot be written -- are one line, exit 2. The sizes that
used to hang or crash run in a fresh process with a time limit, so a regression fails instead of hanging."""
import json
import os
import stat
import subprocess

import pytest

from doctor_helpers import assert_clean_error, cli, cli_subprocess, demo_fast, write_json

CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")


def one_line(code, out, err, *needles):
    assert_clean_error(code, out, err, *needles)
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    res, out = demo_fast()
    d = tmp_path_factory.mktemp("bounds")
    prompts = write_json(str(d / "p.json"), json.load(open(os.path.join(out, "prompts.json")))[:2])
    return {"draft": os.path.join(out, "draft"), "prompts": prompts, "dir": str(d)}


def _accept(pair, *extra):
    return ["doctor", "accept", "--target", "demo", "--draft", pair["draft"], "--prompts", pair["prompts"],
            "--no-progress", "--threads", "1", *extra]


def _online(pair, server, *extra):
    return ["doctor", "online", "--server", server, "--target", "demo", "--draft", pair["draft"], "--prompts",
            pair["prompts"], "--no-progress", "--threads", "1", *extra]


def _fresh(*argv):
    try:
        return cli_subprocess(*argv, timeout=150)
    except subprocess.TimeoutExpired:
        pytest.fail(f"eagle3-capture {' '.join(map(str, argv))} ran for 150 s (it must refuse at once)")


@pytest.mark.parametrize("case", ["accept_new_tokens", "accept_steps", "accept_num_steps", "dump_new_tokens",
                                  "online_new_tokens", "threads"])
def test_sizes_that_hung_or_crashed_are_refused_at_once(pair, case):
    big = "1000000"
    argv, needles = {
        "accept_new_tokens": (_accept(pair, "--new-tokens", big), ["--new-tokens", "max_position_embeddings 256"]),
        "accept_steps": (_accept(pair, "--steps", big), ["--steps 1000000", "at most 64"]),
        "accept_num_steps": (_accept(pair, "--server-args", CHAIN.replace("num-steps 3", "num-steps " + big)),
                             ["num-steps 1000000", "at most 64"]),
        "dump_new_tokens": (["doctor", "dump-reference", "--model", "demo", "--prompts", pair["prompts"], "--out",
                             os.path.join(pair["dir"], "r.safetensors"), "--new-tokens", big, "--threads", "1"],
                            ["--new-tokens", "max_position_embeddings 256", "at most 224 new tokens fit"]),
        # refused before the server is asked for a million tokens (nobody listens on port 9)
        "online_new_tokens": (_online(pair, "http://127.0.0.1:9", "--new-tokens", big, "--server-args", CHAIN),
                              ["--new-tokens", "max_position_embeddings 256"]),
        "threads": (_accept(pair, "--threads", "100000"), ["--threads", "this machine's CPUs"]),
    }[case]
    one_line(*_fresh(*argv), *needles)


def test_a_recorded_million_tokens_is_refused_by_the_positions(pair, tmp_path):
    """A consistent file (every count one a server could report) asking for a replay of 10**6 tokens."""
    prompts = json.load(open(pair["prompts"]))
    n = 10 ** 6
    p = tmp_path / "big.jsonl"
    with open(p, "w") as f:
        for ids in prompts:
            f.write(json.dumps({"input_ids": ids, "output_ids": [1] * n, "meta_info": {
                "completion_tokens": n, "spec_verify_ct": n // 4, "spec_correct_drafts_histogram": [0, 0, 0, n // 4]}})
                    + "\n")
    one_line(*_fresh(*_online(pair, str(p), "--server-args", CHAIN)), f"completion_tokens of --server {p}",
             "1000035 positions", "max_position_embeddings 256")


@pytest.mark.parametrize("flags, needle", [
    ("--speculative-num-steps 3 --speculative-eagle-topk 0 --speculative-num-draft-tokens 4", "eagle-topk 0"),
    ("--speculative-num-steps 3 --speculative-eagle-topk 100000 --speculative-num-draft-tokens 4",
     "eagle-topk 100000: more than the draft's vocabulary of 256"),
    ("--speculative-num-steps 0 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4", "num-steps 0"),
    ("--speculative-num-steps 0 --speculative-eagle-topk 1 --speculative-num-draft-tokens 1", "num-steps 0"),
    ("--speculative-num-steps 3 --speculative-eagle-topk 200 --speculative-num-draft-tokens 8",
     "more than the replay's limit of 16384"),
    ("--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 9",
     "2 <= num-draft-tokens <= 7"),
])
def test_accept_flags_no_draft_can_run_are_one_line(pair, flags, needle):
    one_line(*cli(*_accept(pair, "--new-tokens", "4", "--server-args", "--speculative-algorithm EAGLE3 " + flags)),
             "--server-args", needle)


def test_online_flags_no_draft_can_run_are_one_line(pair, tmp_path):
    from eagle3_capture.doctor.sglang_model.serving import walk

    prompts = json.load(open(pair["prompts"]))
    s = walk([1] * 8, 8)
    lines = [{"input_ids": ids, "output_ids": [1] * 8, "meta_info": {
        "completion_tokens": 8, "spec_verify_ct": s.verify_ct, "spec_correct_drafts_histogram": s.histogram}}
        for ids in prompts]
    p = write_json(str(tmp_path / "r.json"), None)
    with open(p, "w") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")
    for flags, needle in (("--speculative-num-steps 3 --speculative-eagle-topk 0 --speculative-num-draft-tokens 4",
                           "eagle-topk 0"),
                          ("--speculative-num-steps 0 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4",
                           "num-steps 0"),
                          ("--speculative-num-steps 3 --speculative-eagle-topk 300 --speculative-num-draft-tokens 4",
                           "vocabulary")):
        one_line(*cli(*_online(pair, p, "--server-args", "--speculative-algorithm EAGLE3 " + flags)), needle)


@pytest.mark.parametrize("url, needle", [
    ("http://127.0.0.1:abc", "not a URL"), ("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1 :80", "whitespace"),
    ("http://a b", "whitespace"), ("http://", "no host"), ("http://:80", "no host"),
    ("http://127.0.0.1:99999", "not a URL"), ("http://127.0.0.1:0", "port 0"), ("http://h:1/?x=1", "query"),
    ("http://h:1/\n", "control"), ("nope://x", "neither an http(s):// URL"),
])
def test_malformed_server_urls_are_one_line(pair, url, needle):
    one_line(*cli(*_online(pair, url, "--new-tokens", "4")), "argument --server", needle)


def test_timeouts_beyond_a_day_are_refused(pair):
    one_line(*cli(*_online(pair, "http://127.0.0.1:9", "--new-tokens", "4", "--timeout", "1e10")),
             "argument --timeout", "86400")


def test_outputs_that_cannot_be_written_are_refused_before_the_work(pair, tmp_path):
    """/proc and /sys take no new file even for root (os.access says they do); an existing special file (here a
    FIFO, standing in for a device node: never write a test at /dev) is not replaced by a new file."""
    fifo = str(tmp_path / "a_fifo")
    os.mkfifo(fifo)
    for path, needle in (("/proc/e3_x.safetensors", "not writable"), ("/sys/e3_x.safetensors", "not writable"),
                         (fifo, "not a regular file")):
        one_line(*cli(*_accept(pair, "--tensors", path)), "argument --tensors", needle)
    one_line(*cli(*_accept(pair, "--json", fifo)), "argument --json", "not a regular file")
    # the writer itself never replaces a special file (safetensors writes a new file and renames it over the path)
    from eagle3_capture.doctor.common import DoctorError, save_safetensors

    import torch

    with pytest.raises(DoctorError, match="not a regular file"):
        save_safetensors(fifo, {"x": torch.zeros(1)})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(DoctorError, match="cannot be written"):
        save_safetensors("/proc/e3_x.safetensors", {"x": torch.zeros(1)})


def test_nextn_with_chain_flags_accept_and_check_agree(pair):
    """doctor check calls an EAGLE-3 draft served as NEXTN an error (SGLang's NEXTN is EAGLE: no aux hidden
    states); accept and online refuse to predict or compare a served figure under it."""
    from doctor_helpers import CONFIGS, DSV3_61

    flags = CHAIN.replace("EAGLE3", "NEXTN")
    code, out, err = cli("doctor", "check", "--target-config", DSV3_61, "--draft-config",
                         os.path.join(CONFIGS, "draft_eagle_config_ids.json"), "--server-args", flags)
    assert code == 1 and "wrong-algorithm" in out, out + err
    one_line(*cli(*_accept(pair, "--new-tokens", "4", "--server-args", flags)), "NEXTN", "wrong-algorithm")
    one_line(*cli(*_online(pair, "http://127.0.0.1:9", "--new-tokens", "4", "--server-args", flags)), "NEXTN",
             "wrong-algorithm")


def test_check_positions_takes_a_model_a_limit_or_nothing():
    """The bound comes from the target's config, or is given (a server's context length), or is the stated limit
    when unknown."""
    from types import SimpleNamespace

    from eagle3_capture.doctor.bounds import POSITIONS_WITHOUT_CONFIG, check_positions
    from eagle3_capture.doctor.common import DoctorError

    prompts = [[1] * 10, [2] * 30]
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    check_positions(model, prompts, 31, 3, "--new-tokens")   # 30 + 31 + 3 = 64 fits
    with pytest.raises(DoctorError, match="65 positions, beyond the target's max_position_embeddings 64; at most "
                                          "31 new tokens fit"):
        check_positions(model, prompts, 32, 3, "--new-tokens")
    check_positions(100, prompts, 67, 3, "x")
    with pytest.raises(DoctorError, match="beyond the target's max_position_embeddings 100"):
        check_positions(100, prompts, 68, 3, "x")
    with pytest.raises(DoctorError, match="the doctor's limit"):
        check_positions(None, prompts, POSITIONS_WITHOUT_CONFIG, 0, "x")
