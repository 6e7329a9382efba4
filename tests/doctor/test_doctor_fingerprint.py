"""doctor fingerprint: the cosine table names the tap each captured slot holds, on synthetic residual streams
(exact answers known) and through the CLI; every bad input ends in a clear message and exit 2."""
import os

import pytest
import torch

from doctor_helpers import assert_clean_error, cli
from eagle3_capture.doctor.fingerprint.files import load_captured, save_captured
from eagle3_capture.doctor.fingerprint.reference import fingerprint
from eagle3_capture.doctor.fingerprint.reference_dump import write_reference
from eagle3_capture.spec import EMBEDDING, LayerOutput, TapSpec

L, H, T = 6, 32, 40


def residual_stream(seed=0):
    """[L+1, T, H]: Embedding then LayerOutput(0..L-1), each layer adding a fresh update (adjacent cosines ~0.7),
    and the post-norm last HF entry."""
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(T, H, generator=g)]
    for _ in range(L):
        x.append(x[-1] + 0.9 * x[-1].norm(dim=-1, keepdim=True) / H ** 0.5 * torch.randn(T, H, generator=g))
    stack = torch.stack(x)                     # index i: Emb (0) or LayerOutput(i-1)
    w = 1 + 0.5 * torch.randn(H, generator=g)
    post = stack[L] * torch.rsqrt(stack[L].pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return stack, post


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp")
    stack, post = residual_stream()
    ids = torch.arange(100, 100 + T)
    t = {"hidden_states": torch.cat([stack[:L], post[None]]), "final_prenorm": stack[L], "input_ids": ids,
         "positions": torch.arange(T), "prompt_offsets": torch.tensor([0, T])}
    path = str(d / "ref.safetensors")
    write_reference(path, t, num_layers=L, hidden_size=H, source="synthetic")
    return {"path": path, "stack": stack, "post": post, "ids": ids, "dir": d}


def capture(ref, name, cols, rows=slice(None), noise=0.01, seed=1, **meta):
    """A capture of stack columns `cols` (ints index the stack; 'post' the post-norm entry), bf16-like noise."""
    g = torch.Generator().manual_seed(seed)
    parts = [(ref["post"] if c == "post" else ref["stack"][c])[rows] for c in cols]
    aux = torch.cat([p + noise * p.abs().mean() * torch.randn(p.shape, generator=g) for p in parts], -1)
    path = str(ref["dir"] / name)
    save_captured(path, aux, ref["ids"][rows], num_layers=L, hidden_size=H, **meta)
    return path


def test_correct_capture_matches_declared(ref):
    cap = capture(ref, "ok.safetensors", [0, 3, 6], layers_to_capture=[0, 3, 6], draft_ids=[-1, 2, 5])
    res = fingerprint(ref["path"], cap)  # declared from the draft ids recorded in the dump
    assert [repr(t) for t in res.declared.taps] == ["Embedding", "LayerOutput(2)", "LayerOutput(5)"]
    assert res.matched == [EMBEDDING, LayerOutput(2), LayerOutput(5)]
    assert all(m.best_cos > 0.99 for m in res.matches)
    assert not [f for f in res.findings if f.severity == "error"]
    # LayerOutput(L-1) is the pre-norm final boundary, not HF's post-norm last entry
    assert res.matched[2] == LayerOutput(L - 1)


def test_real_case_miswire_is_named(ref):
    declared = TapSpec.from_draft_ids([-1, 1, 3], L, H)
    cap = capture(ref, "mis.safetensors", [2, 4, 5], layers_to_capture=[2, 4, 5])
    res = fingerprint(ref["path"], cap, declared=declared)
    assert res.matched == [LayerOutput(1), LayerOutput(3), LayerOutput(4)]
    codes = [f.code for f in res.findings if f.severity == "error"]
    assert "fingerprint-missing-embedding" in codes and codes.count("fingerprint-shifted-tap") == 2
    # the margin over the neighbouring layer is large: the match is not a close call
    assert all(m.best_cos - m.second_cos > 0.1 for m in res.matches)


def test_one_layer_shift_is_visible(ref):
    """The shift acceptance alone hides (~0.1 accept length): one layer off is a different column."""
    declared = TapSpec.from_draft_ids([-1, 1, 3], L, H)
    cap = capture(ref, "shift1.safetensors", [0, 3, 5])
    res = fingerprint(ref["path"], cap, declared=declared)
    msgs = [f.message for f in res.findings if f.code == "fingerprint-shifted-tap"]
    assert len(msgs) == 2 and all("+1 layer" in m for m in msgs)


def test_post_norm_slot_and_unmatched_slot(ref):
    g = torch.Generator().manual_seed(5)
    declared = TapSpec.from_draft_ids([-1, 1, 5], L, H)
    path = capture(ref, "post.safetensors", [0, 2, "post"])
    res = fingerprint(ref["path"], path, declared=declared)
    assert "fingerprint-post-norm" in {f.code for f in res.findings}
    junk = torch.randn(T, 3 * H, generator=g)
    save_captured(str(ref["dir"] / "junk.safetensors"), junk, ref["ids"])
    res = fingerprint(ref["path"], str(ref["dir"] / "junk.safetensors"), declared=declared)
    assert {f.code for f in res.findings if f.severity == "error"} >= {"fingerprint-no-match"}


def test_partial_capture_aligns_by_token_ids(ref):
    """A server dump of a prefill that skipped a cached prefix: its tokens are a run inside the reference."""
    cap = capture(ref, "part.safetensors", [0, 3, 6], rows=slice(7, 30), draft_ids=[-1, 2, 5])
    res = fingerprint(ref["path"], cap)
    assert res.rows == 23 and any("rows 7..29" in n for n in res.notes)
    assert res.matched == [EMBEDDING, LayerOutput(2), LayerOutput(5)]


def test_reads_the_plugins_dump_format(ref):
    """The SGLang plugin's EAGLE3_CAPTURE_DUMP record (sglang/dump/), one file and a directory of them."""
    d = ref["dir"] / "dumps"
    os.makedirs(d, exist_ok=True)
    for n, rows in enumerate((slice(0, 20), slice(20, 40))):
        aux = torch.cat([ref["stack"][c][rows] for c in (0, 3, 6)], -1).to(torch.bfloat16)
        torch.save({"input_ids": ref["ids"][rows], "positions": torch.arange(rows.start, rows.stop), "aux": aux,
                    "forward_mode": "EXTEND", "draft_ids": [-1, 2, 5], "layers_to_capture": [0, 3, 6],
                    "num_layers": L, "hidden_size": H, "describe": "x", "model_class": "DeepseekV2Model"},
                   d / f"eagle3_capture_pid1_{n:04d}.pt")
    recs = load_captured(str(d))
    assert len(recs) == 2 and recs[0].layers_to_capture == [0, 3, 6]
    res = fingerprint(ref["path"], str(d))
    assert res.rows == 40 and len(res.records) == 2
    assert res.matched == [EMBEDDING, LayerOutput(2), LayerOutput(5)]
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                         d / "eagle3_capture_pid1_0001.pt")
    assert code == 0, err
    assert "verdict" in out and "MISMATCH" not in out


def test_cli_table_and_exit_codes(ref, tmp_path):
    cap = capture(ref, "cli_mis.safetensors", [2, 4, 5])
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", cap,
                         "--taps", "draft_ids:-1,1,3", "--json", tmp_path / "fp.json")
    assert code == 1, out + err
    assert "cosine similarity" in out and "MISMATCH" in out and "fingerprint-missing-embedding" in out
    import json

    j = json.load(open(tmp_path / "fp.json"))
    assert [s["ok"] for s in j["slots"]] == [False, False, False] and len(j["cos"]) == 3
    cap_ok = capture(ref, "cli_ok.safetensors", [0, 2, 4])
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", cap_ok,
                         "--taps", "layer_inputs:0,2,4")
    assert code == 0, out + err


# ----------------------------------------------------------------------------------------------------------------
# bad inputs: exit 2, a message naming the problem, never a traceback
# ----------------------------------------------------------------------------------------------------------------

def test_missing_files(ref, tmp_path):
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", tmp_path / "nope.safetensors", "--captured",
                            tmp_path / "x"), "no such file")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "absent.pt"), "no such file")
    os.makedirs(tmp_path / "empty")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", tmp_path / "empty"),
                       "no *.pt or *.safetensors")


def test_not_safetensors_and_wrong_contents(ref, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", bad, "--captured", bad), "not a readable")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "noref.safetensors"))
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", tmp_path / "noref.safetensors", "--captured",
                            tmp_path / "noref.safetensors"), "no 'hidden_states'")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "noref.safetensors"), "no 'aux'")
    (tmp_path / "garbage.pt").write_bytes(b"\x00\x01garbage")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "garbage.pt"), "not a readable dump record")


def test_mismatched_token_counts_and_tokens(ref, tmp_path):
    g = torch.Generator().manual_seed(3)
    long = torch.randn(T + 5, 3 * H, generator=g)
    save_captured(str(tmp_path / "long.safetensors"), long, torch.arange(T + 5))
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "long.safetensors"), "mismatched token counts", f"{T + 5} captured tokens")
    other = torch.randn(T, 3 * H, generator=g)
    save_captured(str(tmp_path / "other.safetensors"), other, torch.arange(T))
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "other.safetensors"), "do not occur as a run")
    from safetensors.torch import save_file

    save_file({"aux": torch.randn(T - 3, 3 * H)}, str(tmp_path / "noids.safetensors"))
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "noids.safetensors"), "mismatched token counts", f"T={T - 3}")
    save_file({"aux": torch.randn(T, 3 * H), "input_ids": torch.arange(T - 1)}, str(tmp_path / "ids.safetensors"))
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "ids.safetensors"), "input_ids has")


def test_width_and_model_mismatches(ref, tmp_path):
    save_captured(str(tmp_path / "w.safetensors"), torch.randn(T, 3 * H + 5), ref["ids"])
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "w.safetensors"), "not a multiple of the reference's hidden size")
    save_captured(str(tmp_path / "n.safetensors"), torch.randn(T, 3 * H), ref["ids"], num_layers=61)
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            tmp_path / "n.safetensors"), "num_layers 61")
    cap = capture(ref, "t.safetensors", [0, 1, 2])
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", cap, "--taps",
                            "draft_ids:-1,1,99"), "out of range")
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", cap, "--taps",
                            "bogus:1,2"), "unknown convention")


def test_a_forward_of_requests_in_any_order_is_split_into_its_requests(tmp_path):
    """A server batches concurrent requests in any order: a record holding prompt 1's rows, then prompt 0's, is no
    run of the reference's tokens as a whole, only request by request (split where positions restart)."""
    g = torch.Generator().manual_seed(5)
    stacks = [residual_stream(seed=s)[0] for s in (1, 2)]
    ids = [torch.randint(0, 1000, (T,), generator=g) for _ in range(2)]
    ref = {"hidden_states": torch.cat([torch.cat([s[:L] for s in stacks], 1), torch.zeros(1, 2 * T, H)]),
           "final_prenorm": torch.cat([s[L] for s in stacks]), "input_ids": torch.cat(ids),
           "positions": torch.arange(T).repeat(2), "prompt_offsets": torch.tensor([0, T, 2 * T])}
    write_reference(str(tmp_path / "ref.safetensors"), ref, num_layers=L, hidden_size=H, source="synthetic")
    taps = [0, 2, 5]  # layer inputs: Embedding, LayerOutput(1), LayerOutput(4)
    order = [1, 0]
    torch.save({"aux": torch.cat([stacks[i][taps].permute(1, 0, 2).reshape(T, -1) for i in order]),
                "input_ids": torch.cat([ids[i] for i in order]), "positions": torch.arange(T).repeat(2),
                "forward_mode": "EXTEND", "layers_to_capture": taps, "draft_ids": [-1, 1, 4], "num_layers": L,
                "hidden_size": H}, tmp_path / "eagle3_capture_pid1_0000.pt")
    code, text, err = cli("doctor", "fingerprint", "--reference", tmp_path / "ref.safetensors", "--captured",
                          tmp_path / "eagle3_capture_pid1_0000.pt")
    assert code == 0, text + err
    assert "2 capture record(s), 80 token rows" in text and "MISMATCH" not in text
