"""Every path read from a file stays inside its directory (issue 32, kind 4): a shard index's weight_map entry of
'../../x.safetensors' or an absolute path is refused, for the draft (the doctor's loader and the fc loader the plugin
shares) and for --target-checkpoint. Before, it was followed without a word. The directories themselves are the
user's (given on the command line) and may be anywhere."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from dump_helpers import write_checkpoint
from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.draft.checkpoint import load_draft, save_draft
from eagle3_capture.doctor.target_side.checkpoint import open_checkpoint
from eagle3_capture.weights import load_draft_fc
from test_doctor_draft_mla import mla_arch, seeded


@pytest.fixture
def mla_dir(tmp_path):
    d = str(tmp_path / "mla")
    save_draft(seeded(mla_arch(), dtype=torch.float32), d)
    return d


def _outside(d):
    """A real safetensors file outside d, reachable by '../'."""
    p = os.path.join(os.path.dirname(d), "outside.safetensors")
    return p


@pytest.mark.parametrize("how", ["parent", "absolute"])
def test_a_draft_shard_index_naming_a_file_outside_is_refused(mla_dir, how):
    t = load_file(os.path.join(mla_dir, "model.safetensors"))
    out = _outside(mla_dir)
    save_file(t, out)
    os.remove(os.path.join(mla_dir, "model.safetensors"))
    name = "../outside.safetensors" if how == "parent" else out
    json.dump({"weight_map": {k: name for k in t}}, open(os.path.join(mla_dir, "model.safetensors.index.json"), "w"))
    with pytest.raises(DoctorError, match="which is not a file inside"):
        load_draft(mla_dir)
    with pytest.raises(ValueError, match="which is not a file inside"):  # the plugin's fc loader too
        load_draft_fc(mla_dir)


@pytest.mark.parametrize("name", ["../../x.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_a_target_shard_index_naming_a_file_outside_is_refused(tmp_path, name):
    d = write_checkpoint(str(tmp_path / "t"), {"model.embed_tokens.weight": torch.ones(5, 4)}, {"hidden_size": 4}, 1)
    idx = os.path.join(d, "model.safetensors.index.json")
    json.dump({"weight_map": {"model.embed_tokens.weight": name}}, open(idx, "w"))
    with pytest.raises(DoctorError, match="which is not a file inside"):
        open_checkpoint(d)


def test_a_shard_in_a_subdirectory_is_inside(tmp_path):
    d = str(tmp_path / "t")
    os.makedirs(os.path.join(d, "shards"))
    save_file({"model.embed_tokens.weight": torch.ones(5, 4)}, os.path.join(d, "shards", "a.safetensors"))
    json.dump({"weight_map": {"model.embed_tokens.weight": "shards/a.safetensors"}},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))
    assert open_checkpoint(d).where["model.embed_tokens.weight"].endswith(os.path.join("shards", "a.safetensors"))
