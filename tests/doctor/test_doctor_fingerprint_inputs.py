"""doctor fingerprint on captures and references that are broken in the ways a server or a dump can break them:
non-finite and all-zero rows are findings (exit 1) naming the slot and the row count, the table says how many rows
it used; every wrong type, shape or metadata field of either file is exit 2 with one line naming it; the reference
is streamed (peak memory far below the file's size)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from doctor_helpers import REPO, assert_clean_error, cli
from eagle3_capture.doctor.fingerprint.files import save_captured
from eagle3_capture.doctor.fingerprint.reference import fingerprint
from eagle3_capture.doctor.fingerprint.reference_dump import write_reference

L, H, T = 5, 16, 30
DRAFT_IDS = [-1, 1, 4]
COLS = [0, 2, 5]  # stack indices of the draft ids' taps


def _stack(seed=0, T=T, L=L, H=H):
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(T, H, generator=g)]
    for _ in range(L):
        x.append(x[-1] + 0.9 * torch.randn(T, H, generator=g))
    return torch.stack(x)


def _post(stack):
    """HF's last entry: the final norm (with a weight that is not 1, so it is not a rescaled copy of the input)."""
    w = 1 + 0.5 * torch.randn(stack.shape[2], generator=torch.Generator().manual_seed(9))
    return stack[-1] * torch.rsqrt(stack[-1].pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _write_ref(path, stack, **overrides):
    post = _post(stack)
    n = stack.shape[1]
    t = {"hidden_states": torch.cat([stack[:-1], post[None]]), "final_prenorm": stack[-1].clone(),
         "input_ids": torch.arange(100, 100 + n), "positions": torch.arange(n)}
    t.update(overrides)
    write_reference(str(path), t, num_layers=stack.shape[0] - 1, hidden_size=stack.shape[2], source="synthetic")
    return str(path)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = tmp_path_factory.mktemp("fpin")
    stack = _stack()
    return {"path": _write_ref(d / "ref.safetensors", stack), "stack": stack, "dir": d}


def _cap(ref, name, aux=None, ids=None, **meta):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1).clone() if aux is None else aux
    path = str(ref["dir"] / name)
    meta.setdefault("draft_ids", DRAFT_IDS)
    save_captured(path, aux, torch.arange(100, 100 + T) if ids is None else ids, num_layers=L, hidden_size=H, **meta)
    return path


def _codes(res):
    return {f.code for f in res.findings if f.severity == "error"}


# ----------------------------------------------------------------------------------------------------------------
# rows that cannot be compared are findings
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rows_are_an_error_with_slot_and_count(ref, value):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1).clone()
    aux[3:7, H + 2] = value          # slot 1: rows 3..6 hold one bad value each
    res = fingerprint(ref["path"], _cap(ref, f"nf{value}.safetensors", aux))
    assert "fingerprint-nonfinite-rows" in _codes(res)
    msg = next(f.message for f in res.findings if f.code == "fingerprint-nonfinite-rows")
    assert "slot 1" in msg and f"4 of {T} rows" in msg and "row 3" in msg, msg
    assert res.rows_used == [T, T - 4, T]
    # the rows that are finite still say which tap the slot holds, with a finite cosine
    assert res.matches[1].best == 2 and res.matches[1].best_cos > 0.999
    assert all(torch.isfinite(res.cos[k, m.best]) for k, m in enumerate(res.matches))


def test_one_inf_on_the_cli_is_exit_1_and_the_table_counts_rows(ref, tmp_path):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1).clone()
    aux[0, 0] = float("inf")
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                         _cap(ref, "inf1.safetensors", aux), "--json", tmp_path / "fp.json")
    assert code == 1, out + err
    assert "fingerprint-nonfinite-rows" in out and "captured slot 0: 1 of 30 rows" in out
    table = out.split("cosine similarity")[1].split("\n\n")[0].splitlines()
    assert table[1].split()[:2] == ["slot", "rows"], table
    cells = [ln.split() for ln in table[3:]]
    assert [c[1] for c in cells] == [str(T - 1), str(T), str(T)], table
    assert not any("nan" in c.lower() for row in cells for c in row), table
    j = json.load(open(tmp_path / "fp.json"))  # strict JSON: no NaN anywhere
    json.loads(json.dumps(j), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert j["rows_used"] == [T - 1, T, T]


def test_mostly_zero_slot_is_an_error(ref):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1).clone()
    aux[:25, 2 * H:] = 0             # slot 2: 25 of 30 rows never written
    res = fingerprint(ref["path"], _cap(ref, "zero.safetensors", aux))
    msg = next(f.message for f in res.findings if f.code == "fingerprint-zero-rows")
    assert "slot 2" in msg and f"25 of {T} rows are all zero" in msg and "row 0" in msg, msg
    assert res.rows_used[2] == 5


def test_zero_rows_that_the_reference_shares_are_not_a_fault(tmp_path):
    """A padding token's embedding is zero in the reference too: consistent, left out, noted, exit 0."""
    stack = _stack(1)
    stack[0, 4] = 0                  # token 4's embedding is all zero
    rp = _write_ref(tmp_path / "ref.safetensors", stack)
    aux = torch.cat([stack[c] for c in COLS], -1)
    cp = str(tmp_path / "cap.safetensors")
    save_captured(cp, aux, torch.arange(100, 100 + T), draft_ids=DRAFT_IDS, num_layers=L, hidden_size=H)
    res = fingerprint(rp, cp)
    assert not _codes(res), res.findings
    assert res.rows_used[0] == T - 1 and any("all-zero row" in n and "slot 0" in n for n in res.notes)


def test_a_slot_with_no_usable_row(ref, tmp_path):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1).clone()
    aux[:, :H] = float("nan")
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                         _cap(ref, "allnan.safetensors", aux), "--json", tmp_path / "fp.json")
    assert code == 1 and "fingerprint-no-rows" in out and "NO ROWS" in out, out + err
    j = json.load(open(tmp_path / "fp.json"))
    assert j["slots"][0]["cos"] is None and j["rows_used"][0] == 0


def test_non_finite_reference_rows_are_an_error(tmp_path):
    stack = _stack(2)
    stack[2, 7, 3] = float("nan")    # hs[2] = LayerOutput(1), the declared slot 1
    rp = _write_ref(tmp_path / "ref.safetensors", stack)
    cp = str(tmp_path / "cap.safetensors")
    save_captured(cp, torch.cat([_stack(2)[c] for c in COLS], -1), torch.arange(100, 100 + T), draft_ids=DRAFT_IDS,
                  num_layers=L, hidden_size=H)
    res = fingerprint(rp, cp)
    msg = next(f.message for f in res.findings if f.code == "fingerprint-reference-nonfinite")
    assert "LayerOutput(1)" in msg and f"1 of {T} rows" in msg
    assert res.rows_used[1] == T - 1 and res.matches[1].best_cos > 0.999


def test_an_all_nan_reference_blames_the_reference(tmp_path):
    """Every reference row NaN: bad input naming the reference (exit 2, one line), never the captured slots."""
    stack = _stack(3)
    rp = _write_ref(tmp_path / "ref.safetensors", torch.full_like(stack, float("nan")),
                    hidden_states=torch.full((L + 1, T, H), float("nan")))
    cp = str(tmp_path / "cap.safetensors")
    save_captured(cp, torch.cat([stack[c] for c in COLS], -1), torch.arange(100, 100 + T), draft_ids=DRAFT_IDS,
                  num_layers=L, hidden_size=H)
    code, out, err = cli("doctor", "fingerprint", "--reference", rp, "--captured", cp)
    assert_clean_error(code, out, err, f"reference {rp}", "NaN or Inf")
    assert "captured slot" not in err and len(err.strip().splitlines()) == 1, err


def test_a_reference_nan_at_every_captured_token_blames_the_reference(tmp_path):
    """The reference is NaN in every index at the tokens the capture holds (finite elsewhere): no slot can be
    compared; the reference's findings come first and each slot's 'no rows' finding says the reference is broken,
    not the capture (whose rows are finite)."""
    stack = _stack(4)
    bad = stack.clone()
    bad[:, :10] = float("nan")
    rp = _write_ref(tmp_path / "ref.safetensors", bad)
    cp = str(tmp_path / "cap.safetensors")
    save_captured(cp, torch.cat([stack[c][:10] for c in COLS], -1), torch.arange(100, 110), draft_ids=DRAFT_IDS,
                  num_layers=L, hidden_size=H)
    res = fingerprint(rp, cp)
    codes = [f.code for f in res.findings if f.severity == "error"]
    assert codes[0] == "fingerprint-reference-nonfinite" and "fingerprint-no-rows" in codes, codes
    for f in res.findings:
        if f.code == "fingerprint-no-rows":
            assert "the reference is broken, not the capture" in f.message, f.message


# ----------------------------------------------------------------------------------------------------------------
# bad fields: exit 2, one line naming the file and the field
# ----------------------------------------------------------------------------------------------------------------

def _ref_variant(ref, name, tensors=None, meta=None, drop=()):
    from eagle3_capture.doctor.fingerprint.files import REFERENCE_FORMAT

    stack = ref["stack"]
    post = _post(stack)
    t = {"hidden_states": torch.cat([stack[:-1], post[None]]), "final_prenorm": stack[-1].clone(),
         "input_ids": torch.arange(100, 100 + T), "positions": torch.arange(T)}
    t.update(tensors or {})
    for k in drop:
        t.pop(k)
    m = {"format": REFERENCE_FORMAT, "num_layers": str(L), "hidden_size": str(H)}
    m.update(meta or {})
    path = str(ref["dir"] / name)
    save_file({k: v.contiguous() for k, v in t.items()}, path, metadata=m)
    return path


@pytest.mark.parametrize("tensors, meta, needles", [
    ({"input_ids": torch.arange(T).float()}, None, ["input_ids must hold integers", "float32"]),
    ({"hidden_states": torch.ones(L + 1, T, H, dtype=torch.int32)}, None, ["hidden_states must be floating point"]),
    ({"positions": torch.arange(T - 2)}, None, ["positions has 28 entries, expected 30"]),
    ({"positions": torch.arange(T).double()}, None, ["'positions' must hold integers"]),
    ({"final_prenorm": torch.ones(T, H, dtype=torch.int64)}, None, ["final_prenorm must be floating point"]),
    ({"input_ids": torch.arange(T).view(5, 6)}, None, ["'input_ids' must be 1-D"]),
    (None, {"num_layers": '"abc"'}, ["'metadata num_layers' must be an integer", "'abc'"]),
    (None, {"num_layers": "3.5"}, ["'metadata num_layers' must be an integer"]),
    (None, {"num_layers": "not json"}, ["metadata 'num_layers' is not JSON"]),
    (None, {"hidden_size": "17"}, ["metadata hidden_size=17", "H=16"]),
    (None, {"format": "something-else/2"}, ["metadata format is 'something-else/2'"]),
])
def test_bad_reference_fields(ref, tensors, meta, needles):
    p = _ref_variant(ref, "badref.safetensors", tensors, meta)
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", p, "--captured", _cap(ref, "okcap.safetensors")),
                       p, *needles)


def _pt(ref, name, **fields):
    d = {"aux": torch.cat([ref["stack"][c] for c in COLS], -1).to(torch.bfloat16),
         "input_ids": torch.arange(100, 100 + T), "positions": torch.arange(T), "draft_ids": DRAFT_IDS,
         "layers_to_capture": [0, 2, 5], "num_layers": L, "hidden_size": H}
    for k, v in fields.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    path = ref["dir"] / name
    torch.save(d, path)
    return str(path)


_DROP = object()


@pytest.mark.parametrize("fields, needles", [
    ({"num_layers": "x"}, ["'num_layers' must be an integer", "'x'"]),
    ({"num_layers": 5.0}, ["'num_layers' must be an integer"]),
    ({"hidden_size": True}, ["'hidden_size' must be an integer"]),
    ({"hidden_size": -16}, ["'hidden_size' must be >= 1"]),
    ({"aux": torch.ones(T, 3 * H, dtype=torch.int32)}, ["aux must be floating point", "int32"]),
    ({"aux": torch.ones(T, 0)}, ["aux has no columns"]),
    ({"aux": torch.ones(T, 3, H)}, ["aux must be [T, K*H]"]),
    ({"aux": [1.0, 2.0]}, ["no 'aux' tensor", "list"]),
    ({"input_ids": torch.arange(T).float()}, ["'input_ids' must hold integers"]),
    ({"input_ids": "abc"}, ["'input_ids' must be an integer tensor or list", "str"]),
    ({"positions": torch.arange(T + 1)}, ["positions has 31 entries, expected 30"]),
    ({"draft_ids": [True, 1, 4]}, ["'draft_ids' must be a list of integers"]),
    ({"draft_ids": torch.tensor([-1.0, 1.0, 4.0])}, ["'draft_ids' must be a list of integers", "float32"]),
    ({"layers_to_capture": "0,2,5"}, ["'layers_to_capture' must be a list of integers"]),
])
def test_bad_capture_fields(ref, fields, needles):
    p = _pt(ref, "bad.pt", **fields)
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", p), p, *needles)


def test_capture_safetensors_metadata_types(ref):
    aux = torch.cat([ref["stack"][c] for c in COLS], -1)
    p = str(ref["dir"] / "meta.safetensors")
    save_file({"aux": aux, "input_ids": torch.arange(100, 100 + T)}, p, metadata={"num_layers": '"five"'})
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", p),
                       "'num_layers' must be an integer")
    save_file({"aux": aux, "input_ids": torch.arange(100, 100 + T)}, p, metadata={"draft_ids": '{"a": 1}'})
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", p),
                       "'draft_ids' must be a list of integers")


@pytest.mark.parametrize("value", ["nan", "2", "-1.5", "inf"])
def test_min_cos_out_of_range(ref, value):
    assert_clean_error(*cli("doctor", "fingerprint", "--reference", ref["path"], "--captured",
                            _cap(ref, "okcap.safetensors"), "--min-cos", value), "--min-cos")


def test_a_directory_with_a_subdirectory_named_like_a_dump(ref, tmp_path):
    d = tmp_path / "dumps"
    os.makedirs(d / "eagle3_capture_pid1_0000.pt")  # a directory, not a file
    torch.save({"aux": torch.cat([ref["stack"][c] for c in COLS], -1), "input_ids": torch.arange(100, 100 + T)},
               d / "eagle3_capture_pid1_0001.pt")
    code, out, err = cli("doctor", "fingerprint", "--reference", ref["path"], "--captured", d, "--taps",
                         "draft_ids:-1,1,4")
    assert code == 0, out + err


# ----------------------------------------------------------------------------------------------------------------
# the reference is streamed
# ----------------------------------------------------------------------------------------------------------------

def _fingerprint_peak_mb(reference: str, captured: str) -> float:
    """How far above its resident memory just before the call a fresh interpreter's peak goes while it
    fingerprints (the peak is reset first through /proc/self/clear_refs, so the imports' own peak does not count).

    The call measured is the second on the same files: the first one also pays a one-time ~16 MB that stays
    resident after it (modules imported lazily, allocator pools), the same for any reference and about half the
    smaller file's size, so measured alone it made the comparison with the file size a matter of noise."""
    code = f"""
import re
import torch, safetensors.torch
from eagle3_capture.doctor.fingerprint.reference import fingerprint
from eagle3_capture.doctor.fingerprint.files import load_captured
load_captured({captured!r})

def status(key):
    return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024

fingerprint({reference!r}, {captured!r})  # the one-time costs, not measured

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident size
before = status("VmRSS")
r = fingerprint({reference!r}, {captured!r})
assert [m.best for m in r.matches] == [0, 2, 9], r.matches
print(status("VmHWM") - before)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr
    return float(p.stdout.strip().splitlines()[-1])


def test_fingerprint_memory_does_not_grow_with_the_reference(tmp_path):
    """The same capture against a 30-column and a 150-column reference of the same tokens: streamed, the peak
    above the process's start is about the same (the capture, a column and small tables) and below the smaller
    file's size; the reference read whole (float32 stacks, float64 einsums) took about 6x each file's size."""
    Tb, Hb = 256, 1024
    cp = str(tmp_path / "cap.safetensors")
    sizes, extras = [], []
    for Lb in (29, 149):
        stack = _stack(3, T=Tb, L=Lb, H=Hb)
        rp = _write_ref(tmp_path / f"ref{Lb}.safetensors", stack)
        save_captured(cp, torch.cat([stack[0], stack[2], stack[9]], -1), torch.arange(100, 100 + Tb),
                      draft_ids=[-1, 1, 8], num_layers=Lb, hidden_size=Hb)
        del stack
        sizes.append(os.path.getsize(rp) / 2 ** 20)
        extras.append(_fingerprint_peak_mb(rp, cp))
        os.remove(rp)
    print(f"\nreferences {sizes[0]:.0f} / {sizes[1]:.0f} MB: the fingerprint peaks {extras[0]:.0f} / {extras[1]:.0f} MB "
          "above the process before it")
    assert extras[1] - extras[0] < 0.15 * (sizes[1] - sizes[0]), (sizes, extras)
    assert max(extras) < sizes[0], (sizes, extras)
