"""The capture dump and the self-test around SGLang's real ModelRunner.forward (served.py, dump.py, stream.py), on
SGLang's real DeepseekV3 on the CPU (tests/plugin/harness.py: ServedRunner runs ModelRunner.forward -> _forward_raw
-> EagerRunner for real): served forwards dumped as eagle3_capture/dump_format/contract.py says, nothing on SGLang's warm-up
and capture passes (its own capture-mode flag set), the doctor's residual stream without a change to what the draft
is fed, the graph-or-eager decision for doctor forwards, the bounds, a failing disk. SGLang's real serving loop:
tests/engine."""
import errno
import glob
import logging
import os
import shutil

import pytest
import torch

from sglang_fixtures import harness, plugin_env, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

DECLARED = [-1, 1, 3, 5]  # the 6-layer tiny model's embedding, two middle layers and its final boundary
ATOL = 2e-5               # fp32: SGLang's kernels vs HF's eager modules (test_sglang_wiring.py)


def _records(d):
    from eagle3_capture.dump_format import FILE_RE, validate_record
    from eagle3_capture.sglang.dump import forwards as dump

    assert dump.flush(60)
    assert not glob.glob(os.path.join(str(d), "*.tmp")), "a partial file was left"
    files = sorted(glob.glob(os.path.join(str(d), "*.pt")))
    recs = []
    for f in files:
        assert FILE_RE.match(os.path.basename(f)), f
        rec = torch.load(f, weights_only=True)  # what the doctor's reader does
        validate_record(rec, f)
        recs.append(rec)
    return sorted(recs, key=lambda r: r["seq"])


@pytest.fixture
def target(tiny):
    model = tiny["model"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    yield tiny
    model.set_eagle3_layers_to_capture(list(DECLARED))


@pytest.fixture
def fresh_selftest():
    from eagle3_capture.sglang.monitor import selftest

    selftest.reset()
    yield selftest
    selftest.reset()


def test_served_prefill_and_decode_are_dumped_as_the_contract_says(harness, target, plugin_env, tmp_path):
    from eagle3_capture.dump_format import FORMAT
    from eagle3_capture.sglang.taps.target import SPEC_ATTR

    model, cfg = target["model"], target["cfg"]
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path)
    r = harness.ServedRunner(model, cfg, rid="req-a")
    pre, _ = r.forward(harness.PROMPT)
    dec, _ = r.forward([harness.DECODE_TOKEN])
    recs = _records(tmp_path)
    assert [x["forward_mode"] for x in recs] == ["EXTEND", "DECODE"] and [x["seq"] for x in recs] == [0, 1]
    n = len(harness.PROMPT)
    a, b = recs
    assert a["format"] == FORMAT and a["graph"] is False
    assert a["input_ids"].tolist() == harness.PROMPT and a["positions"].tolist() == list(range(n))
    assert a["requests"] == [{"rid": "req-a", "row_start": 0, "row_end": n, "prefix_len": 0}]
    assert b["input_ids"].tolist() == [harness.DECODE_TOKEN] and b["positions"].tolist() == [n]
    assert b["requests"] == [{"rid": "req-a", "row_start": 0, "row_end": 1, "prefix_len": None}]
    # exactly what the runner handed on to the draft
    assert torch.equal(a["aux"], pre.logits_output.hidden_states)
    assert torch.equal(b["aux"], dec.logits_output.hidden_states)
    spec = getattr(model.model, SPEC_ATTR)
    assert a["layers_to_capture"] == [0, 2, 4, 6] and a["draft_ids"] == DECLARED
    assert a["declared"] == ["Embedding", "LayerOutput(1)", "LayerOutput(3)", "LayerOutput(5)"]
    assert a["declared_convention"] == "draft_ids" and a["describe"] == spec.describe()
    assert a["stream"] is None and a["stream_layer_inputs"] is None  # not a doctor request
    assert (a["num_layers"], a["hidden_size"], a["model_class"], a["dtype"]) == (6, 64, "DeepseekV3ForCausalLM",
                                                                               "torch.float32")
    assert (a["tp_rank"], a["tp_size"], a["attn_tp_rank"], a["attn_tp_size"]) == (0, 1, 0, 1)
    assert "writes, being attn-TP rank 0" in a["writer"]


def test_nothing_is_dumped_or_self_tested_in_sglangs_capture_mode(harness, target, plugin_env, tmp_path,
                                                                  fresh_selftest, caplog):
    """SGLang's warm-up and capture passes set its capture-mode flag (model_capture_mode()) on a stream that is not
    capturing: the model's forward runs there directly (the graph runners' run_once), and a model runner forward
    under the flag is no served forward either. Neither is dumped nor self-tested, doctor request ids included."""
    get_is_capture_mode, model_capture_mode = harness.sglang_capture_mode()

    model, cfg = target["model"], target["cfg"]
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path, EAGLE3_CAPTURE_DUMP_STREAM="all")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"), model_capture_mode():
        assert get_is_capture_mode() and not torch.cuda.is_available()
        warm = harness.ServedRunner(model, cfg, rid="eagle3-doctor-warmup")
        fb = warm.batch(harness.PROMPT)
        out = warm.seq.run(lambda b: model.forward(b.input_ids, b.positions, b), fb)  # as run_once does
        assert out.hidden_states.shape == (len(harness.PROMPT), 4 * cfg.hidden_size)
        r = harness.ServedRunner(model, cfg, rid="eagle3-doctor-x")
        r.forward(harness.PROMPT)
        r.forward([harness.DECODE_TOKEN])
    assert fresh_selftest.pending() and not [m for m in caplog.messages if "self-test" in m]
    assert _records(tmp_path) == []
    # the same forwards served: dumped (with the stream) and self-tested
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        harness.ServedRunner(model, cfg, rid="eagle3-doctor-y").forward(harness.PROMPT)
    assert not fresh_selftest.pending() and any("self-test passed" in m for m in caplog.messages)
    recs = _records(tmp_path)
    assert len(recs) == 1 and recs[0]["stream"] is not None


def _run(harness, model, cfg, ids, rid):
    out, _ = harness.ServedRunner(model, cfg, rid=rid).forward(ids)
    return out.logits_output


def test_doctor_stream_all_is_every_layer_input_and_the_draft_is_fed_as_without_it(harness, target, plugin_env,
                                                                                   tmp_path):
    model, cfg, taps = target["model"], target["cfg"], target["taps"]
    ids = harness.PROMPT + [harness.DECODE_TOKEN]  # the doctor's teacher-forced pass: one prefill
    plugin_env(EAGLE3_CAPTURE_DUMP=None)
    plain = _run(harness, model, cfg, ids, "req-plain")
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path, EAGLE3_CAPTURE_DUMP_STREAM="all")
    doc = _run(harness, model, cfg, ids, "eagle3-doctor-run-0")
    # the served slots are bit for bit those of the forward without the dump (the draft sees no difference)
    assert torch.equal(doc.hidden_states, plain.hidden_states)
    assert torch.equal(doc.next_token_logits, plain.next_token_logits)
    (rec,) = _records(tmp_path)
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    assert rec["stream_layer_inputs"] == list(range(L + 1)) and rec["stream"].shape == (L + 1, len(ids), H)
    assert rec["requests"] == [{"rid": "eagle3-doctor-run-0", "row_start": 0, "row_end": len(ids), "prefix_len": 0}]
    assert torch.equal(rec["aux"], doc.hidden_states)
    # layer input 0 is the embedding itself; the others the HF model's taps; L the final boundary before the norm
    assert torch.equal(rec["stream"][0], model.model.embed_tokens(torch.tensor(ids)))
    for i in range(L + 1):
        err = (rec["stream"][i] - taps[i]).abs().max().item()
        assert err <= ATOL, f"stream layer input {i} differs from its HF tap by {err}"
    # and the served slots are the stream's own values at the served layer inputs
    for s, i in enumerate(rec["layers_to_capture"]):
        assert torch.equal(rec["aux"][:, s * H:(s + 1) * H], rec["stream"][i])


def test_doctor_stream_declared_adds_the_declared_taps_to_a_miswired_capture(harness, target, plugin_env, tmp_path):
    """With the capture wired other than declared (layers_to_capture changed after model load), the declared
    stream holds the declared taps and the served slots, so a fingerprint can say which layer each slot holds."""
    model, cfg = target["model"], target["cfg"]
    model.set_eagle3_layers_to_capture([-1, 1, 3])  # declared: layer inputs [0, 2, 4]
    model.model.layers_to_capture = [1, 2, 4]       # served: one tap later in the first slot
    ids = harness.PROMPT
    plugin_env(EAGLE3_CAPTURE_DUMP=None)
    plain = _run(harness, model, cfg, ids, "req-plain")
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path)
    doc = _run(harness, model, cfg, ids, "eagle3-doctor-miswired")
    assert torch.equal(doc.hidden_states, plain.hidden_states)
    (rec,) = _records(tmp_path)
    H = cfg.hidden_size
    assert rec["stream_layer_inputs"] == [0, 1, 2, 4] and rec["layers_to_capture"] == [1, 2, 4]
    assert rec["declared"] == ["Embedding", "LayerOutput(1)", "LayerOutput(3)"]
    assert torch.equal(rec["stream"][0], model.model.embed_tokens(torch.tensor(ids)))
    for s, i in enumerate([1, 2, 4]):
        assert torch.equal(rec["aux"][:, s * H:(s + 1) * H], rec["stream"][rec["stream_layer_inputs"].index(i)])


def test_graph_gate_keeps_target_doctor_forwards_eager(harness, target, plugin_env, tmp_path):
    """AROUND the graph runners' can_run_graph: False for a target batch holding a doctor request while the dump
    reads streams; SGLang's own answer otherwise (draft runners, other requests, DP attention, dump off)."""
    from eagle3_capture.sglang import served

    DecodeCudaGraphRunner = harness.decode_graph_runner_class()

    model, cfg = target["model"], target["cfg"]
    gr = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    r = harness.ServedRunner(model, cfg, graph_runner=gr)
    asked = []

    def sglangs(self, fb):
        asked.append(fb)
        return True

    doctor = r.batch(harness.PROMPT, rid="eagle3-doctor-g")
    other = r.batch(harness.PROMPT, rid="req-g")
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path)
    assert served.graph_gate_hook(sglangs, gr, doctor) is False and not asked
    assert served.graph_gate_hook(sglangs, gr, other) is True and asked == [other]
    dp = r.batch(harness.PROMPT, rid="eagle3-doctor-dp")
    dp.global_num_tokens_cpu = [len(harness.PROMPT)]
    assert served.graph_gate_hook(sglangs, gr, dp) is True
    draft_gr = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    harness.ServedRunner(model, cfg, graph_runner=draft_gr, is_draft_worker=True)
    assert served.graph_gate_hook(sglangs, draft_gr, doctor) is True
    plugin_env(EAGLE3_CAPTURE_DUMP_STREAM_TOKENS=0)
    assert served.graph_gate_hook(sglangs, gr, doctor) is True
    plugin_env(EAGLE3_CAPTURE_DUMP=None)
    assert served.graph_gate_hook(sglangs, gr, doctor) is True


def test_bounds_forwards_requests_tokens_bytes_and_stream(harness, target, plugin_env, tmp_path, caplog):
    model, cfg = target["model"], target["cfg"]
    P, D = harness.PROMPT, [harness.DECODE_TOKEN]

    def serve(rid, steps=1):
        r = harness.ServedRunner(model, cfg, rid=rid)
        r.forward(P)
        for _ in range(steps):
            r.forward(D)

    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "max", EAGLE3_CAPTURE_DUMP_MAX=2)
        serve("a", steps=2)
        assert [x["forward_mode"] for x in _records(tmp_path / "max")] == ["EXTEND", "DECODE"]
        assert any("reached EAGLE3_CAPTURE_DUMP_MAX=2 forwards" in m for m in caplog.messages)

        plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "req", EAGLE3_CAPTURE_DUMP_REQUESTS=1,
                   EAGLE3_CAPTURE_DUMP_MAX=None)
        serve("HEALTH_CHECK_0")  # SGLang's /health generates are never followed
        serve("a")
        serve("b")
        serve("eagle3-doctor-c")  # the doctor's requests have their own budget
        rids = [x["requests"][0]["rid"] for x in _records(tmp_path / "req")]
        assert rids == ["a", "a", "eagle3-doctor-c", "eagle3-doctor-c"], rids

        plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "tok", EAGLE3_CAPTURE_DUMP_REQUESTS=None,
                   EAGLE3_CAPTURE_DUMP_TOKENS=len(P) + 1)
        serve("a", steps=3)
        assert sum(x["input_ids"].numel() for x in _records(tmp_path / "tok")) == len(P) + 1

        plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "bytes", EAGLE3_CAPTURE_DUMP_TOKENS=None,
                   EAGLE3_CAPTURE_DUMP_BYTES="8K")
        serve("a", steps=2)  # the prefill's 7 rows of 4 x 64 floats (+ ids, positions) are 7280 bytes
        assert [x["forward_mode"] for x in _records(tmp_path / "bytes")] == ["EXTEND"]  # 1040 more do not fit
        assert any("reached EAGLE3_CAPTURE_DUMP_BYTES=8192 bytes" in m for m in caplog.messages)

        plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "stream", EAGLE3_CAPTURE_DUMP_BYTES=None,
                   EAGLE3_CAPTURE_DUMP_STREAM_TOKENS=len(P))
        serve("eagle3-doctor-s")
        recs = _records(tmp_path / "stream")
        assert [x["stream"] is not None for x in recs] == [True, False]  # the decode step is past the budget
        assert any("gets no residual stream" in m for m in caplog.messages)


def test_a_failing_disk_gives_one_error_line_and_serving_goes_on(harness, target, plugin_env, tmp_path, caplog,
                                                                monkeypatch):
    from eagle3_capture.sglang.dump import writer as dump_writer

    model, cfg = target["model"], target["cfg"]
    d = tmp_path / "dump"
    plugin_env(EAGLE3_CAPTURE_DUMP=d)
    r = harness.ServedRunner(model, cfg, rid="a")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)
        assert len(_records(d)) == 1
        shutil.rmtree(d)
        d.write_text("not a directory any more")
        outs = [r.forward([harness.DECODE_TOKEN])[0] for _ in range(3)]  # served as ever
        assert all(o.logits_output.next_token_logits.isfinite().all() for o in outs)
        from eagle3_capture.sglang.dump import forwards as dump
        assert dump.flush(30)
    errors = [m for m in caplog.messages if "capture dump stopped" in m]
    assert len(errors) == 1 and "serving goes on" in errors[0] and str(d) in errors[0], errors

    # a full disk: the same, and no partial file is left behind
    caplog.clear()
    d2 = tmp_path / "full"
    plugin_env(EAGLE3_CAPTURE_DUMP=d2)

    def full(path, data):
        with open(path, "wb") as f:
            f.write(bytes(data[:7]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(dump_writer, "write_bytes", full)
    r = harness.ServedRunner(model, cfg, rid="b")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        for ids in (harness.PROMPT, [harness.DECODE_TOKEN], [harness.DECODE_TOKEN]):
            r.forward(ids)
        from eagle3_capture.sglang.dump import forwards as dump
        assert dump.flush(30)
    errors = [m for m in caplog.messages if "capture dump stopped" in m]
    assert len(errors) == 1 and "No space left on device" in errors[0], errors
    assert os.listdir(d2) == []


def test_two_servers_with_one_pid_sharing_a_directory_lose_no_record(harness, target, plugin_env, tmp_path,
                                                                     monkeypatch, caplog):
    """Issue 32, kind 1: two replicas in separate PID namespaces were both pid 6, their records were named by the
    pid, and the second replaced the first's without a word. Now each record and its name carry the process's
    random id (and host), and a name is never replaced: a file already there is left alone and the record takes
    another name, said in one WARNING line."""
    from eagle3_capture.dump_format import file_name, inventory, load_record
    from eagle3_capture.sglang.dump import forwards as dump
    from eagle3_capture.sglang.dump.record import this_process

    model, cfg = target["model"], target["cfg"]
    monkeypatch.setattr(os, "getpid", lambda: 6)
    d = tmp_path / "shared"
    servers = []
    for rid in ("replica-a", "replica-b"):
        plugin_env(EAGLE3_CAPTURE_DUMP=d)  # a fresh dump state and identity: another server, its seq from 0 again
        r = harness.ServedRunner(model, cfg, rid=rid)
        r.forward(harness.PROMPT)
        r.forward([harness.DECODE_TOKEN])
        assert dump.flush(60)
        servers.append(this_process())
    recs = _records(d)
    assert len(recs) == 4 and sorted(x["seq"] for x in recs) == [0, 0, 1, 1], [x["seq"] for x in recs]
    assert {x["requests"][0]["rid"] for x in recs} == {"replica-a", "replica-b"}
    assert {x["pid"] for x in recs} == {6} and {x["server"] for x in recs} == {p.server for p in servers}
    assert len({p.server for p in servers}) == 2
    inv = inventory(load_record(f) for f in sorted(glob.glob(os.path.join(str(d), "*.pt"))))
    assert len(inv.writers) == 2 and not inv.several_declarations and "2 writing processes" in inv.note()

    # a file already under the name the next record takes (a stale file, or a writer that drew the same id)
    plugin_env(EAGLE3_CAPTURE_DUMP=d)
    proc = this_process()
    taken = d / file_name(proc.host, proc.server, 0, 0)
    taken.write_bytes(b"someone else's")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        harness.ServedRunner(model, cfg, rid="replica-c").forward(harness.PROMPT)
        assert dump.flush(60)
    assert taken.read_bytes() == b"someone else's"
    taken.unlink()
    recs = _records(d)
    assert len(recs) == 5 and [x for x in recs if x["requests"][0]["rid"] == "replica-c"][0]["server"] == proc.server
    warned = [m for m in caplog.messages if "already in" in m]
    assert len(warned) == 1 and taken.name in warned[0] and "not replaced" in warned[0], caplog.messages
    assert not [m for m in caplog.messages if "capture dump stopped" in m]


def test_with_the_selftest_done_and_the_dump_off_the_hook_touches_nothing(plugin_env, fresh_selftest):
    """Nothing extra on the hot path: with the self-test done and no dump, the model runner hook reads nothing of the
    batch and only the runner's draft flag (the self-test's period counts target forwards) (here: objects on which
    any other attribute read would fail) before calling SGLang."""
    from eagle3_capture.sglang import served

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the hook read .{name}")

    class Runner(Untouchable):
        is_draft_worker = False

    plugin_env(EAGLE3_CAPTURE_DUMP=None)
    fresh_selftest._claim()
    runner, fb = Runner(), Untouchable()
    assert served.runner_forward_hook(lambda self, b: "served", runner, fb) == "served"


def test_doctor_forwards_run_eagerly_through_sglangs_model_runner(harness, tmp_path):
    """A fresh process with the dump on at load_plugins(): the graph runners' can_run_graph is hooked, and SGLang's
    real ModelRunner.forward runs a doctor decode eagerly beside a decode graph runner; another request's decode asks
    SGLang's own can_run_graph (which, on this bare runner, fails: SGLang asked it)."""
    import json

    from scenarios import run_script

    out = tmp_path / "gate.json"
    run_script("graph_gate", out, {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "dump")})
    rep = json.loads(out.read_text())
    assert all(rep["gates"].values()), rep["gates"]
    assert rep["doctor_decode_graph"] is False
    assert rep["other_decode"].startswith("AttributeError") and rep["graph_runner"] in rep["other_decode"], rep
    assert rep["records"][:2] == [["EXTEND", "eagle3-doctor-gate", False, True],
                                  ["DECODE", "eagle3-doctor-gate", False, True]], rep["records"]


def test_a_graph_replays_padded_rows_are_not_dumped(harness, target, plugin_env, tmp_path):
    """A CUDA-graph replay runs a batch padded to the graph's size; the record holds the batch's real rows only (from
    its host metadata), and says it was a graph replay. The replay is played here by SGLang's own output objects: the
    served forward's ModelRunnerOutput with rows of garbage appended, as a padded graph buffer holds them."""
    import dataclasses

    from sglang.srt.model_executor.model_runner import ModelRunnerOutput

    from eagle3_capture.sglang import served

    model, cfg = target["model"], target["cfg"]
    r = harness.ServedRunner(model, cfg, rid="pad")
    plugin_env(EAGLE3_CAPTURE_DUMP=None)
    out, fb = r.forward(harness.PROMPT)
    aux = out.logits_output.hidden_states
    padded = torch.cat([aux, torch.full((5, aux.shape[1]), float("nan"))])
    replay = ModelRunnerOutput(logits_output=dataclasses.replace(out.logits_output, hidden_states=padded),
                               can_run_graph=True)
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path)
    assert served.runner_forward_hook(lambda self, b: replay, r.mr, fb) is replay
    (rec,) = _records(tmp_path)
    assert rec["graph"] is True and torch.equal(rec["aux"], aux) and rec["input_ids"].tolist() == harness.PROMPT


def test_past_the_served_budget_only_doctor_forwards_read_the_batch(harness, target, plugin_env, tmp_path,
                                                                    monkeypatch):
    """Once the served budget is spent, a forward without a doctor request can get no record and no stream: the hook
    reads its request ids and calls SGLang, without reading the batch's rows (an O(batch) walk at every served
    forward otherwise); a doctor forward is still dumped whole, with its stream."""
    from eagle3_capture.sglang import served

    model, cfg = target["model"], target["cfg"]
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path, EAGLE3_CAPTURE_DUMP_MAX=1)
    r = harness.ServedRunner(model, cfg, rid="a")
    r.forward(harness.PROMPT)  # the one served record
    r.forward([harness.DECODE_TOKEN])  # finds the budget spent
    read = []
    real = served.batch_rows
    monkeypatch.setattr(served, "batch_rows", lambda fb: read.append(fb.rids) or real(fb))
    r.forward([harness.DECODE_TOKEN])
    assert read == []
    harness.ServedRunner(model, cfg, rid="eagle3-doctor-late").forward(harness.PROMPT)
    assert read == [["eagle3-doctor-late"]]
    recs = [(x["requests"][0]["rid"], x["forward_mode"], x["stream"] is not None) for x in _records(tmp_path)]
    assert recs == [("a", "EXTEND", False), ("eagle3-doctor-late", "EXTEND", True)], recs
