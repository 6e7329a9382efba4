"""weights.load_draft_fc: plain checkpoints whole and as ColumnParallelLinear shards (fc names, legacy norm keys);
fp8 fc weights dequantized by their per-tensor, per-channel or block scale (against a float64 reference, whole and
as TP shards); every shape, dtype, scale or index problem a ValueError / FileNotFoundError naming the tensor or
file, never a silent slice or a dropped tensor."""
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from eagle3_capture.weights import load_draft_fc

N, K, H = 300, 3, 96   # N and K*H not multiples of 128: the last scale blocks are partial
FP8 = torch.float8_e4m3fn


def _fp8_weight(seed=0, n=N, kh=K * H):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, kh, generator=g) * 100).clamp(-440, 440).to(FP8)


def _block_scale(n=N, kh=K * H, block=(128, 128), seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(-(-n // block[0]), -(-kh // block[1]), generator=g) * 1e-3 + 1e-4


def _expand(scale, block, n, kh):
    return scale.double().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :kh]


def _save(d, tensors, config=None, name="model.safetensors"):
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, name))
    if config is not None:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
    return str(d)


# ----------------------------------------------------------------------------------------------------------------
# plain checkpoints: names, legacy norm keys, ColumnParallelLinear shards
# ----------------------------------------------------------------------------------------------------------------

def test_weights_shards_like_column_parallel_linear(tmp_path):
    gen = torch.Generator().manual_seed(7)
    n, k, h = 24, 3, 16
    w, b = torch.randn(n, k * h, generator=gen), torch.randn(n, generator=gen)
    norms = [torch.randn(h, generator=gen) for _ in range(k)]
    tensors = {"model.fc.weight": w, "fc.bias": b, "aux_norm_low.weight": norms[0],
               "aux_norm_mid.weight": norms[1], "model.fc_norm.2.weight": norms[2], "lm_head.weight": torch.ones(2)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    full = load_draft_fc(str(tmp_path))
    assert torch.equal(full.weight, w) and torch.equal(full.bias, b) and torch.equal(full.norm_weight, torch.stack(norms))
    for tp in (2, 4):
        for r in range(tp):
            s = load_draft_fc(str(tmp_path / "model.safetensors"), tp_rank=r, tp_size=tp, dtype=torch.bfloat16)
            rows = slice(r * n // tp, (r + 1) * n // tp)
            assert torch.equal(s.weight, w[rows].bfloat16()) and torch.equal(s.bias, b[rows].bfloat16())
            assert s.out_features_total == n and s.weight.is_contiguous()
    with pytest.raises(ValueError, match="not divisible by tp_size 5"):
        load_draft_fc(str(tmp_path), tp_rank=0, tp_size=5)
    with pytest.raises(ValueError, match="tp_rank"):
        load_draft_fc(str(tmp_path), tp_rank=2, tp_size=2)
    save_file({"x.weight": torch.ones(2, 2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="no fc weight"):
        load_draft_fc(str(tmp_path / "other.safetensors"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_draft_fc(str(tmp_path / "missing.safetensors"))


# ----------------------------------------------------------------------------------------------------------------
# fp8: dequantized as the checkpoint says
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [(128, 128), (64, 32)])
def test_fp8_block_scale_inv_is_dequantized(tmp_path, block):
    w8, s = _fp8_weight(), _block_scale(block=block)
    cfg = {"quantization_config": {"quant_method": "fp8", "weight_block_size": list(block)}}
    d = _save(tmp_path, {"model.fc.weight": w8, "model.fc.weight_scale_inv": s}, cfg)
    want = w8.double() * _expand(s, block, N, K * H)
    fc = load_draft_fc(d, dtype=torch.float32)
    assert fc.weight.dtype == torch.float32 and "weight_scale_inv" in fc.quantization
    torch.testing.assert_close(fc.weight.double(), want, rtol=2 ** -23, atol=0)
    # a ColumnParallelLinear shard whose rows start inside a scale block
    for tp in (2, 3):
        for r in range(tp):
            sh = load_draft_fc(d, tp_rank=r, tp_size=tp, dtype=torch.float32)
            rows = slice(r * N // tp, (r + 1) * N // tp)
            torch.testing.assert_close(sh.weight.double(), want[rows], rtol=2 ** -23, atol=0)


def test_fp8_block_size_defaults_to_128_only_when_the_scale_shape_says_so(tmp_path):
    w8, s = _fp8_weight(), _block_scale()
    d = _save(tmp_path / "a", {"fc.weight": w8, "fc.weight_scale_inv": s})  # no config.json
    torch.testing.assert_close(load_draft_fc(d).weight.double(), w8.double() * _expand(s, (128, 128), N, K * H),
                               rtol=2 ** -23, atol=0)
    d = _save(tmp_path / "b", {"fc.weight": w8, "fc.weight_scale_inv": _block_scale(block=(64, 64))})
    with pytest.raises(ValueError, match=r"fc.weight_scale_inv.*shape \[5, 5\].*weight_block_size"):
        load_draft_fc(d)


@pytest.mark.parametrize("shape", [(), (1,), (N,), (N, 1)])
def test_fp8_per_tensor_and_per_channel_weight_scale(tmp_path, shape):
    w8 = _fp8_weight()
    s = (torch.rand(shape, generator=torch.Generator().manual_seed(3)) + 0.5) * 1e-2
    d = _save(tmp_path, {"fc.weight": w8, "fc.weight_scale": s})
    sd = s.double().reshape(-1, 1) if s.numel() > 1 else s.double().reshape(())
    want = w8.double() * sd
    fc = load_draft_fc(d, dtype=torch.float32)
    torch.testing.assert_close(fc.weight.double(), want, rtol=2 ** -23, atol=0)
    # without dequantization the values would be ~1/scale off: the test can tell
    assert (fc.weight.double() - w8.double()).abs().max() > 1
    sh = load_draft_fc(d, tp_rank=1, tp_size=3, dtype=torch.float32)
    torch.testing.assert_close(sh.weight.double(), want[100:200], rtol=2 ** -23, atol=0)


def test_fp8_bf16_request_rounds_the_dequantized_value_once(tmp_path):
    w8, s = _fp8_weight(), _block_scale()
    d = _save(tmp_path, {"fc.weight": w8, "fc.weight_scale_inv": s})
    fc = load_draft_fc(d, dtype=torch.bfloat16)
    want = (w8.double() * _expand(s, (128, 128), N, K * H)).bfloat16()
    assert torch.equal(fc.weight, want)


@pytest.mark.parametrize("tensors, needles", [
    ({"fc.weight": _fp8_weight()}, ["fc.weight", "float8_e4m3fn", "no fc.weight_scale"]),
    ({"fc.weight": _fp8_weight(), "fc.weight_scale": torch.ones(2, 2)}, ["fc.weight_scale", "[2, 2]"]),
    ({"fc.weight": _fp8_weight(), "fc.weight_scale_inv": torch.ones(3)}, ["fc.weight_scale_inv", "2-D"]),
    ({"fc.weight": _fp8_weight(), "fc.weight_scale": torch.ones(()), "fc.weight_scale_inv": _block_scale()},
     ["both"]),
    ({"fc.weight": torch.randn(N, K * H), "fc.weight_scale": torch.ones(())}, ["fc.weight_scale", "float32"]),
    ({"fc.weight": _fp8_weight(), "fc.weight_scale": torch.ones((), dtype=torch.int32)},
     ["fc.weight_scale", "int32"]),
    ({"fc.weight": torch.ones(N, K * H, dtype=torch.int8)}, ["fc.weight", "int8"]),
    ({"fc.weight": torch.randn(N)}, ["fc.weight", "2-D"]),
])
def test_fp8_and_dtype_problems_are_refused(tmp_path, tensors, needles):
    d = _save(tmp_path, tensors)
    with pytest.raises(ValueError) as e:
        load_draft_fc(d)
    for n in needles:
        assert n in str(e.value), str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# shapes
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias, needle", [
    (torch.randn(N + 4), f"fc.bias has shape [{N + 4}]"),
    (torch.randn(N - 1), f"fc.bias has shape [{N - 1}]"),
    (torch.randn(N, 1), f"fc.bias has shape [{N}, 1]"),
    (torch.ones(N, dtype=torch.int64), "int64"),
])
def test_bias_must_match_out_features(tmp_path, bias, needle):
    d = _save(tmp_path, {"fc.weight": torch.randn(N, K * H), "fc.bias": bias})
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_draft_fc(d)
    with pytest.raises(ValueError):
        load_draft_fc(d, tp_rank=1, tp_size=2)


@pytest.mark.parametrize("norms, needle", [
    ([torch.ones(H), torch.ones(H), torch.ones(H + 1)], "fc_norm.2.weight has shape"),
    ([torch.ones(H, 1)] * 3, "fc_norm.0.weight has shape"),
    ([torch.ones(2 * H)] * 3, "do not match fc in_features"),
])
def test_norm_weights_must_be_k_vectors_of_h(tmp_path, norms, needle):
    t = {"fc.weight": torch.randn(N, K * H)}
    t.update({f"fc_norm.{k}.weight": v.clone() for k, v in enumerate(norms)})
    d = _save(tmp_path, t)
    with pytest.raises(ValueError, match=needle):
        load_draft_fc(d)


def test_bad_tp_arguments(tmp_path):
    d = _save(tmp_path, {"fc.weight": torch.randn(N, K * H)})
    for kw in ({"tp_rank": 0.0, "tp_size": 1}, {"tp_rank": 0, "tp_size": True}, {"tp_rank": -1, "tp_size": 2},
               {"tp_rank": 0, "tp_size": 0}):
        with pytest.raises(ValueError, match="tp_"):
            load_draft_fc(d, **kw)


def test_unreadable_file_is_a_value_error_naming_it(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="model.safetensors.*not a readable safetensors"):
        load_draft_fc(str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------
# the shard index
# ----------------------------------------------------------------------------------------------------------------

def _index(d, weight_map):
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_index_names_the_file_of_every_tensor(tmp_path):
    w, b = torch.randn(N, K * H), torch.randn(N)
    _save(tmp_path, {"fc.weight": w}, name="model-00001-of-00002.safetensors")
    _save(tmp_path, {"fc.bias": b}, name="model-00002-of-00002.safetensors")
    _save(tmp_path, {"fc.bias": torch.zeros(N)}, name="stale.safetensors")  # not in the index: not read
    _index(tmp_path, {"fc.weight": "model-00001-of-00002.safetensors", "fc.bias": "model-00002-of-00002.safetensors"})
    fc = load_draft_fc(str(tmp_path))
    assert torch.equal(fc.weight, w) and torch.equal(fc.bias, b)


def test_index_naming_a_missing_shard_is_an_error(tmp_path):
    _save(tmp_path, {"fc.weight": torch.randn(N, K * H)}, name="model-00001-of-00002.safetensors")
    _index(tmp_path, {"fc.weight": "model-00001-of-00002.safetensors", "fc.bias": "model-00002-of-00002.safetensors"})
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors.*fc.bias"):
        load_draft_fc(str(tmp_path))


def test_index_naming_a_tensor_its_file_lacks_is_an_error(tmp_path):
    _save(tmp_path, {"fc.weight": torch.randn(N, K * H)}, name="a.safetensors")
    _index(tmp_path, {"fc.weight": "a.safetensors", "fc.bias": "a.safetensors"})
    with pytest.raises(ValueError, match="fc.bias.*not in.*a.safetensors"):
        load_draft_fc(str(tmp_path))


@pytest.mark.parametrize("content", ["{", "[]", '{"weight_map": [1]}', '{"weight_map": {"fc.weight": 3}}'])
def test_malformed_index(tmp_path, content):
    _save(tmp_path, {"fc.weight": torch.randn(N, K * H)})
    (tmp_path / "model.safetensors.index.json").write_text(content)
    with pytest.raises(ValueError, match="model.safetensors.index.json"):
        load_draft_fc(str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------
# fuzz: whatever the checkpoint holds, a DraftFc that is right or a ValueError / FileNotFoundError
# ----------------------------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import fuzz_examples  # noqa: E402

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, FP8, torch.float8_e5m2, torch.int8, torch.int64]


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g) * 4
    return t.to(dtype) if dtype.is_floating_point else t.round().to(dtype)


@settings(max_examples=fuzz_examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_checkpoint_contents(tmp_path, data):
    n, k, h = data.draw(st.sampled_from([(8, 2, 8), (12, 3, 4), (130, 1, 136)]))
    names = data.draw(st.lists(st.sampled_from(["fc.bias", "fc.weight_scale", "fc.weight_scale_inv", "fc_norm",
                                                "model.prefix"]), unique=True, max_size=4))
    wdtype = data.draw(st.sampled_from(_DTYPES))
    wshape = data.draw(st.sampled_from([(n, k * h), (n, k * h), (n,), (n, k * h, 1), (n + 1, k * h)]))
    t = {"fc.weight": _rand(wshape, wdtype, 0)}
    if "fc.bias" in names:
        t["fc.bias"] = _rand(data.draw(st.sampled_from([(n,), (n + 1,), (n, 1)])), data.draw(st.sampled_from(_DTYPES)), 1)
    if "fc.weight_scale" in names:
        t["fc.weight_scale"] = _rand(data.draw(st.sampled_from([(), (1,), (n,), (n, 1), (2, 2)])),
                                     data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int32])), 2).abs()
    if "fc.weight_scale_inv" in names:
        t["fc.weight_scale_inv"] = _rand(data.draw(st.sampled_from([(-(-n // 128), -(-(k * h) // 128)), (1,), (3, 3)])),
                                         torch.float32, 3).abs()
    if "fc_norm" in names:
        for i in range(data.draw(st.integers(1, k + 1))):
            t[f"fc_norm.{i}.weight"] = _rand(data.draw(st.sampled_from([(h,), (h,), (h + 1,)])), torch.float32, 4 + i)
    if "model.prefix" in names:
        t = {"model." + key: v for key, v in t.items()}
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    for f in d.iterdir():
        f.unlink()
    save_file({key: v.contiguous() for key, v in t.items()}, str(d / "model.safetensors"))
    tp = data.draw(st.sampled_from([1, 2]))
    try:
        fc = load_draft_fc(str(d), tp_rank=tp - 1, tp_size=tp, dtype=torch.float32)
    except (ValueError, FileNotFoundError) as e:
        assert str(e) and "\n" not in str(e)
        return
    # it loaded: then everything it read must be what the checkpoint says, nothing sliced or ignored
    t = {key[len("model."):] if key.startswith("model.") else key: v for key, v in t.items()}
    w = t["fc.weight"]
    assert w.dim() == 2 and w.shape[0] % tp == 0
    rows = slice((tp - 1) * w.shape[0] // tp, tp * w.shape[0] // tp)
    want = w.double()
    if w.dtype in (FP8, torch.float8_e5m2):
        if "fc.weight_scale" in t:
            s = t["fc.weight_scale"].double()
            want = want * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))
        else:
            want = want * _expand(t["fc.weight_scale_inv"], (128, 128), *w.shape)
    else:
        assert "fc.weight_scale" not in t and "fc.weight_scale_inv" not in t
    torch.testing.assert_close(fc.weight.double(), want[rows].float().double(), rtol=2 ** -23, atol=0)
    if "fc.bias" in t:
        assert t["fc.bias"].shape == (w.shape[0],)
        torch.testing.assert_close(fc.bias, t["fc.bias"][rows].float())
    else:
        assert fc.bias is None
    norms = sorted(key for key in t if key.startswith("fc_norm."))
    assert (fc.norm_weight is None) == (not norms)
    if norms:
        assert fc.norm_weight.shape[0] * fc.norm_weight.shape[1] == w.shape[1]


# ----------------------------------------------------------------------------------------------------------------
# names the loader does not know, and the dtype argument
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["fc_norm.0.bias", "fc_norms.0.weight", "fc_norm.weight", "aux_norm_top.weight",
                                  "model.fc_norm.1.scale", "aux_norm_low.bias", "fc.norm.0.weight", "fc.weight_scale2"])
def test_an_fc_or_norm_tensor_of_an_unknown_name_is_refused(tmp_path, name):
    """It used to be skipped: the fc loaded without its norms. Now a ValueError names it (directory, file and shard
    index alike)."""
    t = {"fc.weight": torch.randn(N, K * H), name: torch.ones(H)}
    d = _save(tmp_path, t)
    for path in (d, os.path.join(d, "model.safetensors")):
        with pytest.raises(ValueError, match=name.replace(".", r"\.") + " looks like part of the draft fc"):
            load_draft_fc(path)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {k: "model.safetensors" for k in t}}, f)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_draft_fc(d)


def test_known_names_beside_the_fc_still_load(tmp_path):
    """Tensors that are not the fc's (the draft's layers, its lm_head, norms of other modules) are not refused."""
    t = {"fc.weight": torch.randn(N, K * H), "midlayer.hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H),
         "lm_head.weight": torch.ones(2, H), "input_norm.weight": torch.ones(K * H)}
    assert load_draft_fc(_save(tmp_path, t)).norm_weight is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, FP8, 5, "float16", float, torch.complex64])
def test_dtype_must_be_a_floating_torch_dtype(tmp_path, dtype):
    """An integer dtype truncated the weights; anything but a floating torch.dtype is a TypeError naming it."""
    d = _save(tmp_path, {"fc.weight": torch.randn(N, K * H)})
    with pytest.raises(TypeError, match="dtype must be None or a floating-point torch.dtype"):
        load_draft_fc(d, dtype=dtype)
    assert load_draft_fc(d, dtype=torch.float16).weight.dtype == torch.float16
