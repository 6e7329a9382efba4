"""Issue 32's doctor kinds for tests/sweep_bad_inputs.py, the inputs part (tests/sweep_issue32_doctor.py gathers
them): 32.3 draft weights that are not what they seem, 32.4 paths that leave their directory, 32.7 MLA draft configs
and training slots, 32.5 requests that could harm the server (a test-only stand-in that aborts the case when
harmed)."""
from __future__ import annotations

import json
import os
import shutil

from sweep_issue32_doctor import CHAIN, DECLARED, L, N, with_server


def _draft_variant(demo, tmp, name, edit_tensors=None, edit_config=None, index=None):
    """A copy of the demo draft with its tensors / config edited, or sharded through an index (name -> file)."""
    import torch  # noqa: F401  (safetensors needs it)
    from safetensors.torch import load_file, save_file

    src = os.path.join(demo, "draft")
    d = os.path.join(tmp, f"i32_draft_{name}")
    shutil.copytree(src, d)
    t = load_file(os.path.join(d, "model.safetensors"))
    if edit_tensors:
        edit_tensors(t)
        save_file(t, os.path.join(d, "model.safetensors"))
    if edit_config:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        edit_config(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
    if index is not None:
        out = index(d, t)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: out for k in t}}, f)
    return d


def _load_only(d):
    """What the CLI does with a draft it cannot use: one 'error:' line (exit 2); a traceback otherwise."""
    def run():
        from eagle3_capture.doctor.common import DoctorError
        from eagle3_capture.doctor.draft.checkpoint import load_draft

        try:
            load_draft(d)
        except DoctorError as e:
            return 2, "", f"eagle3-capture doctor: error: {e}\n"
        return 0, "loaded\n", ""
    return run


def draft_cases(demo, tmp, t, pp, resp):
    """32.3 draft weights, 32.4 paths out of their directory, 32.7 MLA configs and training slots."""
    import torch

    from sweep_bad_inputs import CLEAN, OK, Case, cli
    from dump_helpers import write_training

    dump = os.path.join(tmp, "i32_3_dump")
    t.write_dump(dump, DECLARED, list(range(L + 1)), declared=["Embedding", "LayerOutput(0)", "LayerOutput(3)"])

    def accept(d):
        return lambda: cli("doctor", "accept", "--hidden-states", dump, "--prompts", pp, "--draft", d,
                           "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)

    def int8_scale(tt):
        w = tt["midlayer.self_attn.q_proj.weight"]
        sc = w.abs().amax(1, keepdim=True) / 127
        tt["midlayer.self_attn.q_proj.weight"] = (w / sc).round().to(torch.int8)
        tt["midlayer.self_attn.q_proj.weight_scale"] = sc

    def nan_at(name):
        def edit(tt):
            tt[name].view(-1)[5] = float("nan")
        return edit

    c = [Case("32.3", "accept: the demo draft (must pass)", accept(os.path.join(demo, "draft")), {OK})]
    for what, edit in (("an int8 q_proj with its weight_scale (W8A8)", int8_scale),
                       ("an int32 down_proj", lambda tt: tt.update({"midlayer.mlp.down_proj.weight":
                                                                     tt["midlayer.mlp.down_proj.weight"].to(torch.int32)})),
                       ("a packed qweight beside the weights", lambda tt: tt.update(
                           {"midlayer.self_attn.o_proj.qweight": torch.zeros(8, 8, dtype=torch.int32)})),
                       ("a NaN in q_proj", nan_at("midlayer.self_attn.q_proj.weight")),
                       ("a NaN in the fc", nan_at("fc.weight")),
                       ("an Inf in a norm", lambda tt: tt["midlayer.input_layernorm.weight"].__setitem__(0, float("inf")))):
        c.append(Case("32.3", f"accept: a draft with {what}",
                      accept(_draft_variant(demo, tmp, what.replace(" ", "_"), edit)), {CLEAN}))

    # 32.4: a shard index naming files outside the draft's directory
    def parent(d, tt):
        from safetensors.torch import save_file
        save_file(tt, os.path.join(os.path.dirname(d), "i32_outside.safetensors"))
        os.remove(os.path.join(d, "model.safetensors"))
        return "../i32_outside.safetensors"

    def absolute(d, tt):
        from safetensors.torch import save_file
        p = os.path.join(os.path.dirname(d), "i32_outside_abs.safetensors")
        save_file(tt, p)
        os.remove(os.path.join(d, "model.safetensors"))
        return p

    for what, how in (("'../x.safetensors'", parent), ("an absolute path", absolute)):
        c.append(Case("32.4", f"accept: the draft's shard index names {what}",
                      accept(_draft_variant(demo, tmp, f"idx_{how.__name__}", index=how)), {CLEAN}, ("inside",)))
    tgt = os.path.join(tmp, "i32_4_target")
    os.makedirs(tgt)
    shutil.copy(os.path.join(demo, "target", "config.json"), os.path.join(tgt, "config.json"))
    with open(os.path.join(tgt, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.embed_tokens.weight": "../../x.safetensors"}}, f)
    c.append(Case("32.4", "fingerprint --target-checkpoint whose index names '../../x.safetensors'",
                  lambda: cli("doctor", "fingerprint", "--captured", dump, "--target-checkpoint", tgt), {CLEAN},
                  ("inside",)))

    # 32.7: MLA draft configs (a small MLA draft, loaded as the CLI loads it) and training slots
    from test_doctor_draft_mla import mla_arch, seeded
    from eagle3_capture.doctor.draft.checkpoint import save_draft

    def mla(name, **cfg_edit):
        d = os.path.join(tmp, f"i32_7_{name}")
        save_draft(seeded(mla_arch(), dtype=torch.float32), d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        for k, v in cfg_edit.items():
            if k.startswith("rs_"):
                cfg["rope_scaling"][k[3:]] = v
            else:
                cfg[k] = v
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return d

    c.append(Case("32.7", "MLA draft: clean (must load)", _load_only(mla("ok")), {OK}))
    for what, edit in (("kv_lora_rank 16.7", {"kv_lora_rank": 16.7}), ("kv_lora_rank -16", {"kv_lora_rank": -16}),
                       ("an odd qk_rope_head_dim", {"qk_rope_head_dim": 7}),
                       ("an unknown rope_type", {"rs_type": "wobbly"}), ("a yarn factor 0", {"rs_factor": 0}),
                       ("a negative yarn factor", {"rs_factor": -4.0}), ("a NaN yarn factor", {"rs_factor": float("nan")}),
                       ("a yarn factor '64'", {"rs_factor": "64"}), ("an mscale '1.0'", {"rs_mscale": "1.0"})):
        c.append(Case("32.7", f"MLA draft config: {what}", _load_only(mla(what.replace(" ", "_"), **edit)), {CLEAN}))
    mla_nan = mla("nan_proj")

    def nan_kv(tt):
        tt["midlayer.self_attn.kv_a_proj_with_mqa.weight"].view(-1)[0] = float("nan")
    from safetensors.torch import load_file, save_file
    tt = load_file(os.path.join(mla_nan, "model.safetensors"))
    nan_kv(tt)
    save_file(tt, os.path.join(mla_nan, "model.safetensors"))
    c.append(Case("32.3", "MLA draft: a NaN in kv_a_proj_with_mqa", _load_only(mla_nan), {CLEAN}))
    tr4 = os.path.join(tmp, "i32_7_train4")
    write_training(tr4, t.sent, t.stack, [0, 1, 4, 6], dtype=torch.float32)
    dump4 = os.path.join(tmp, "i32_7_dump4")
    t.write_dump(dump4, [0, 1, 4, 6], list(range(L + 1)))
    c.append(Case("32.7", "training data with K=4 slots for a K=3 draft",
                  lambda: cli("doctor", "fingerprint", "--training-data", tr4, "--captured", dump4, "--draft-config",
                              os.path.join(demo, "draft", "config.json"), "--target-config",
                              os.path.join(demo, "target", "config.json")), {CLEAN}))
    return c


def request_cases(demo, tmp, t, pp, resp):
    """32.5: nothing the doctor sends may harm the server (a stand-in that aborts the case when harmed)."""
    import torch

    from sweep_bad_inputs import CLEAN, OK, Case, cli  # noqa: F401
    from dump_helpers import write_training

    configs = ("--draft-config", os.path.join(demo, "draft", "config.json"), "--target-config",
               os.path.join(demo, "target", "config.json"))
    c = []

    def training(name, edit=None):
        seqs = [s.clone() for s in t.sent]
        if edit:
            edit(seqs)
        d = os.path.join(tmp, f"i32_5_{name}")
        write_training(d, seqs, t.stack, DECLARED, dtype=torch.float32)
        return d

    def dump_dir(name):
        d = os.path.join(tmp, f"i32_5_dump_{name}")
        os.makedirs(d, exist_ok=True)
        return d

    def fp(data, name, *extra):
        return lambda url: ("doctor", "fingerprint", "--training-data", data, "--server", url, "--captured",
                            dump_dir(name), "--timeout", 20, *extra)

    oov = training("oov", lambda s: s[1].__setitem__(3, 100000))
    neg = training("neg", lambda s: s[0].__setitem__(0, -1))
    clean = training("clean")
    c.append(Case("32.5", "fingerprint --server: clean samples (must pass)",
                  with_server(t, fp(clean, "clean", *configs), dump_dir=dump_dir("clean"),
                              declared=["Embedding", "LayerOutput(0)", "LayerOutput(3)"]), {OK}))
    c.append(Case("32.5", "fingerprint --server: a sample id 100000 (vocabulary 256)",
                  with_server(t, fp(oov, "oov", *configs), dump_dir=dump_dir("oov")), {CLEAN}))
    c.append(Case("32.5", "fingerprint --server: a sample id -1", with_server(t, fp(neg, "neg", *configs),
                                                                              dump_dir=dump_dir("neg")), {CLEAN}))
    c.append(Case("32.5", "fingerprint --server: id 100000, no target config",
                  with_server(t, fp(oov, "oov2"), dump_dir=dump_dir("oov2")), {CLEAN}))
    c.append(Case("32.5", "fingerprint --server: samples longer than max_req_input_len",
                  with_server(t, fp(clean, "long", *configs), dump_dir=dump_dir("long"), max_req_input_len=20),
                  {CLEAN}))
    draft = os.path.join(demo, "draft")

    def online(name, *extra):
        return lambda url: ("doctor", "online", "--server", url, "--prompts", pp, "--draft", draft, "--dump",
                            dump_dir(name), "--new-tokens", N, "--server-args", CHAIN, "--no-progress", "--device",
                            "cpu", "--threads", 1, "--timeout", 20, *extra)

    n = max(len(p) for p in json.load(open(pp)))
    c.append(Case("32.5", "online --server: prompt + outputs past max_req_input_len",
                  with_server(t, online("ctx"), dump_dir=dump_dir("ctx"), max_req_input_len=n + 3), {CLEAN}))
    c.append(Case("32.5", "online --server: answers outside the vocabulary (not sent back)",
                  with_server(t, online("offset"), dump_dir=dump_dir("offset"), answer_offset=1000), {CLEAN}))
    return c


__all__ = ["draft_cases", "request_cases"]
