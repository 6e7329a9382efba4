"""Fuzz of the doctor's runs on the demo pair: hypothesis over the prompts files (real ``dump-reference``), recorded
server responses and their counts (real ``online``) and ``accept``'s flags. Whatever the input: the exit code is 0,
1 or 2, nothing raises out of the CLI, no traceback is printed, and an exit 2 is one line naming the problem (the
flags, configs and tensor files: test_doctor_cli_fuzz.py)."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from doctor_helpers import demo_fast, replay_demo
from fuzz_helpers import JSON_VALUE, SERVER_ARGS, fuzz, run_cli, scratch_dir


@pytest.fixture(scope="module")
def scratch():
    with scratch_dir() as d:
        yield d


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
