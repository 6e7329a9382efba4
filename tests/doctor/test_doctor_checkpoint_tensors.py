"""Single tensors read alone from a target checkpoint through its shard index: the names of DeepSeek-V3, Kimi-K2.5
(language_model.) and transformers' multimodal layout, never an MTP layer's copy; only the named shard is opened;
every problem one DoctorError naming the checkpoint."""
import json
import os

import pytest
import torch

from dump_helpers import write_checkpoint
from eagle3_capture.doctor.target_side.checkpoint import CheckpointSide, open_checkpoint, read_embedding, read_lm_head
from eagle3_capture.doctor.common import DoctorError

V, H = 50, 8


@pytest.mark.parametrize("prefix,head", [("model.", "lm_head.weight"),
                                         ("language_model.model.", "language_model.lm_head.weight"),
                                         ("model.language_model.", "lm_head.weight")])
def test_names_of_each_layout(tmp_path, prefix, head):
    g = torch.Generator().manual_seed(0)
    emb, lm = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    tensors = {f"{prefix}embed_tokens.weight": emb, head: lm,
               f"{prefix}layers.61.embed_tokens.weight": torch.zeros(V, H),  # DeepSeek-V3's MTP layer keeps a copy
               f"{prefix}layers.0.mlp.gate.weight": torch.randn(3, H)}
    ck = open_checkpoint(write_checkpoint(str(tmp_path), tensors, {"hidden_size": H, "vocab_size": V,
                                                                    "num_hidden_layers": 2}, shards=3))
    assert torch.equal(read_embedding(ck, V, H), emb) and torch.equal(read_lm_head(ck, V, H), lm)
    rows = [7, 3, 7]
    assert torch.equal(read_embedding(ck, V, H, rows=rows), emb[rows])


def test_only_the_embeddings_shard_is_opened(tmp_path):
    """The index names shards that are not there (the rest of a 600 GB checkpoint): reading the embedding works."""
    d = write_checkpoint(str(tmp_path), {"model.embed_tokens.weight": torch.ones(V, H)}, {"hidden_size": H}, 1)
    idx = os.path.join(d, "model.safetensors.index.json")
    data = json.load(open(idx))
    data["weight_map"].update({f"model.layers.{i}.mlp.experts.weight": f"model-000{i + 2:02d}-of-00099.safetensors"
                               for i in range(50)})
    json.dump(data, open(idx, "w"))
    assert read_embedding(open_checkpoint(d), V, H).sum() == V * H


def test_problems_are_one_error_each(tmp_path):
    d = write_checkpoint(str(tmp_path / "a"), {"model.embed_tokens.weight": torch.ones(V, H)}, {"hidden_size": H}, 1)
    ck = open_checkpoint(d)
    with pytest.raises(DoctorError, match=r"is \[50, 8\], expected \[60, 8\]"):
        read_embedding(ck, 60, H)
    with pytest.raises(DoctorError, match="no lm_head"):
        read_lm_head(ck, V, H)
    os.remove(os.path.join(d, "model-00001-of-00001.safetensors"))
    with pytest.raises(DoctorError, match="which is missing"):
        read_embedding(ck, V, H)
    with pytest.raises(DoctorError, match="no model.safetensors.index.json and no"):
        open_checkpoint(str(tmp_path))
    with pytest.raises(DoctorError, match="no such file"):
        CheckpointSide(str(tmp_path / "nowhere"))
    e = tmp_path / "b"
    e.mkdir()
    (e / "model.safetensors.index.json").write_text('{"weight_map": 3}')
    with pytest.raises(DoctorError, match="weight_map"):
        open_checkpoint(str(e))
