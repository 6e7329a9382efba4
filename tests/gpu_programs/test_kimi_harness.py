"""The real-width GPU harness's own logic, on the CPU (scripts/gpu_sglang/kimi_compare.py, kimi_accept.py): the drafts
it writes load in the doctor with the d2t map intact, the stock copy carries stock's ids, the taps at any depth, the
hot-token choice, the per-round-pair ratios, and the reshape setting's parsing (e3_sglang_cpu/reshape.py). The
serving itself: `kimi_compare.py --small --layers 8 --device cpu` and scripts/gpu_sglang_kimi.sh."""
import json
import os

import pytest
import torch

import kimi_accept
import kimi_compare
import kimi_shape
from e3_sglang_cpu import reshape


def small(layers=8):
    return kimi_shape.target_config(4, 2, **dict(kimi_shape.SMALL, num_hidden_layers=layers))


def test_the_taps_are_stocks_defaults_at_61_layers_and_spread_at_a_dry_runs_depth():
    assert kimi_compare.draft_ids(61) == [1, 29, 57]
    from make_pair import stock_ids

    assert stock_ids(kimi_compare.draft_ids(61)) == [2, 30, 58]  # SGLang's [2, L // 2, L - 3] at L = 61
    ids = kimi_compare.draft_ids(8)
    assert len(set(ids)) == 3 and all(0 <= i < 8 for i in ids)
    with pytest.raises(ValueError, match="at least 8 layers"):
        kimi_compare.draft_ids(7)


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_the_written_draft_loads_in_the_doctor_with_its_hot_token_map(tmp_path, kind):
    from eagle3_capture.doctor.draft.checkpoint import load_draft

    cfg = small()
    d = kimi_compare.write_draft(kind, cfg, str(tmp_path / kind))
    model = load_draft(d["path"])
    a = model.arch
    assert a.layer_ids == kimi_compare.draft_ids(8) and a.mla == (kind == "mla")
    assert a.target_hidden_size == cfg["hidden_size"] and a.vocab_size == cfg["vocab_size"]
    target_ids = torch.arange(a.draft_vocab_size) + model.d2t
    if kind == "llama":
        assert d["d2t"] and a.draft_vocab_size < a.vocab_size
        assert target_ids.unique().numel() == a.draft_vocab_size and 0 <= int(target_ids.min())
        assert int(target_ids.max()) < a.vocab_size and bool((model.d2t != 0).any())
    else:
        assert not d["d2t"] and a.draft_vocab_size == a.vocab_size
    # the norms are 1 and nothing else is: not SGLang's dummy range, not zeros
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert bool((p == 1).all()), name
        else:
            assert float(p.detach().abs().max()) > 1e-2, name
    stock = kimi_compare.write_stock_copy(d["path"], str(tmp_path / f"{kind}_stock"))
    ids = json.load(open(os.path.join(stock, "config.json")))["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [i + 1 for i in kimi_compare.draft_ids(8)]
    assert os.path.realpath(os.path.join(stock, "model.safetensors")) == os.path.realpath(
        os.path.join(d["path"], "model.safetensors"))


def test_ratios_pair_the_rounds_per_batch_size():
    def run(tps):
        return {"timed": [{"round": r, "per_batch": {b: {"tokens_per_s": v} for b, v in batch.items()}}
                          for r, batch in tps.items()]}

    plugin = run({1: {"1": 40.0, "16": 300.0}, 2: {"1": 42.0, "16": 310.0}, 3: {"1": 41.0}})
    stock = run({1: {"1": 40.0, "16": 320.0}, 2: {"1": 40.0, "16": 310.0}})
    r = kimi_compare.ratios(plugin, stock)
    assert r["1"]["per_round"] == {1: 1.0, 2: 1.05} and r["1"]["median"] == pytest.approx(1.025)
    assert r["16"]["per_round"] == {1: 0.9375, 2: 1.0} and (r["16"]["min"], r["16"]["max"]) == (0.9375, 1.0)
    assert r["16"]["plugin_tokens_per_s"] == [300.0, 310.0] and r["16"]["stock_tokens_per_s"] == [320.0, 310.0]
    assert kimi_compare.ratios({"timed": None}, stock) == {}


def test_hot_tokens_are_the_most_frequent_then_the_lowest_free_ids():
    hot = kimi_accept.hot_tokens([[7, 7, 7, 3, 3, 9], [3, 7, 11]], 5, 20)
    # 7, 3, 9 and 11 are served; the fifth is the lowest id not taken; sorted, as SpecForge writes d2t
    assert hot.tolist() == [0, 3, 7, 9, 11]
    assert kimi_accept.hot_tokens([[5] * 9], 2, 20).tolist() == [0, 5]


@pytest.mark.parametrize("value,want", [("0.5", (0.5, 0)), (" 2:7 ", (2.0, 7)), ("4", (4.0, 0))])
def test_the_reshape_setting_parses(value, want):
    assert reshape.parse(value) == want


@pytest.mark.parametrize("value", ["", "x", "0", "4.5", "-1", "0.5:x", "nan"])
def test_a_bad_reshape_setting_is_one_clear_error(value):
    with pytest.raises(ValueError, match="E3_SGLANG_RESHAPE_TARGET"):
        reshape.parse(value)


def test_timed_batches_time_each_batch_size_and_serve_every_prompt_in_each(tmp_path, monkeypatch):
    """serve_gpu.py --timed-batches 1,2 around the stand-in engine (fake_server.py): each timed round serves the
    prompts once per batch size, one generate() per group, and reports tokens/s per batch size."""
    import fake_server
    import serve_gpu

    monkeypatch.setenv("FAKE_ENGINE_ROUND_S", "0.01")
    (tmp_path / "p.json").write_text(json.dumps([[5, 6], [7, 8], [9, 10]]))
    out = tmp_path / "run"
    rc = serve_gpu.main(["--target", "t", "--draft", "d", "--prompts", str(tmp_path / "p.json"), "--out-dir", str(out),
                         "--new-tokens", "4", "--timed-repeats", "1", "--timed-rounds", "2", "--timed-batches", "1,2"],
                        make_engine=fake_server.FakeEngine)
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0, summary.get("error")
    for t in summary["timed"]:
        assert t["requests"] == 6 and set(t["per_batch"]) == {"1", "2"}
        one, two = t["per_batch"]["1"], t["per_batch"]["2"]
        assert one["tokens"] == two["tokens"] > 0 and one["tokens"] + two["tokens"] == t["tokens"]
        assert one["tokens_per_s"] > 0 and two["tokens_per_s"] > 0
    rows = [json.loads(ln) for ln in (out / "round2.jsonl").read_text().splitlines()]
    assert [r["input_ids"] for r in rows] == [[5, 6], [7, 8], [9, 10]] * 2


def test_the_trained_draft_starts_from_the_servers_own_embedding_and_lm_head(tmp_path):
    """kimi_accept's draft takes the target's embedding and lm_head rows exactly as the reshape hook gave them to the
    server (the same gain and seed), learns, and saves a d2t over the most frequent tokens."""
    from safetensors.torch import load_file

    cfg, gain = small(), 0.3
    ids = kimi_compare.draft_ids(8)
    H, n, T = cfg["hidden_size"], 4, 12
    g = torch.Generator().manual_seed(4)
    seq = torch.randint(0, 50, (n, T), generator=g)
    greedy = torch.roll(seq, -1, 1)
    greedy[:, 0] = -1
    d = kimi_accept.trained_draft(cfg, gain, torch.randn(n, T, len(ids) * H, generator=g), seq, greedy, 5, "cpu",
                                  str(tmp_path / "d"))
    state = load_file(os.path.join(d["path"], "model.safetensors"))
    ends = dict(t for b in kimi_shape.layer_batches(cfg, gain, 0, torch.float32, batches=[0, 9]) for t in b)
    hot = torch.arange(state["d2t"].numel()) + state["d2t"]
    assert torch.equal(state["embed_tokens.weight"], ends["model.embed_tokens.weight"])
    assert set(seq.flatten().tolist()) <= set(hot.tolist())
    assert d["train"]["iters"] == 5 and d["labels_in_the_hot_set"] == 1.0
    # lm_head rows moved in training from the server's rows of the hot tokens: close, not equal, at lr 2e-3 x 5 steps
    start = ends["lm_head.weight"][hot]
    assert torch.allclose(state["lm_head.weight"], start, atol=0.05) and not torch.equal(state["lm_head.weight"], start)


def test_the_train_phase_reads_collects_state_and_leaves_the_draft_for_online(tmp_path):
    """kimi_accept.py --phase train (no server): it refuses a state without collect's files or of another target,
    and otherwise trains on STATE/train_data.pt and leaves STATE/draft_trained and train.json for the online phase
    (which kimi_plan.py checks for)."""
    import kimi_plan

    state, out = tmp_path / "state", tmp_path / "out"
    args = ["--out", str(out), "--phase", "train", "--state", str(state), "--small", "--layers", "8", "--device", "cpu",
            "--train-iters", "3", "--prompts", "4", "--held-out", "1", "--prompt-len", "6", "--new-tokens", "4"]
    with pytest.raises(SystemExit) as e:
        kimi_accept.main(args)
    assert e.value.code == 2
    cfg = small()
    a = type("A", (), {"prompts": 4, "held_out": 1, "prompt_len": 6})()
    kimi_accept.write_target(cfg, str(state))
    train_ps, held = kimi_accept.write_prompts(a, cfg, str(state))
    g = torch.Generator().manual_seed(2)
    seq = torch.tensor([p + [1, 2, 3, 4] for p in train_ps])
    greedy = torch.roll(seq, -1, 1)
    taps = torch.randn(4, seq.shape[1], 3 * cfg["hidden_size"], generator=g)
    torch.save({"taps": taps, "seq": seq, "greedy": greedy}, state / "train_data.pt")
    (state / "collect.json").write_text("{}")
    assert kimi_plan.missing_files("online", str(state)) is not None
    with pytest.raises(SystemExit) as e:  # another target than collect served
        kimi_accept.main(args + ["--experts", "2"])
    assert e.value.code == 2
    assert kimi_accept.main(args) == 0
    r = json.loads((out / "kimi_train.json").read_text())
    assert r["ok"] and r["phase"] == "train" and r["train"]["train"]["iters"] == 3
    assert os.path.exists(state / "draft_trained" / "model.safetensors")
    assert kimi_plan.missing_files("online", str(state)) is None


def test_the_accept_phases_wait_for_the_server_as_long_as_the_phase_has_left(monkeypatch, tmp_path):
    """A served batch answers only when its last request is done: on a CPU dry run (16 prompts, 8 layers) that took
    longer than the 600 s a request was once allowed, and collect failed with the server still serving. The
    serving, the teacher-forced pass and doctor online get the seconds the phase has left."""
    from eagle3_capture.doctor.sglang_model import http

    seen = {}

    def fake_generate(base, prompts, new_tokens, timeout, concurrency, progress):
        seen["timeout"] = timeout
        return [type("R", (), {"output_ids": [1] * new_tokens})() for _ in prompts]

    monkeypatch.setattr(http, "generate", fake_generate)
    assert kimi_accept.serve("http://127.0.0.1:1", [[5, 6]], 3, 1834.0) == [[1, 1, 1]]
    assert seen["timeout"] == 1834.0

    def fake_run(cmd, **kw):
        seen["cmd"], seen["run_timeout"] = cmd, kw["timeout"]
        return type("P", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(kimi_accept.subprocess, "run", fake_run)
    kimi_accept.doctor_online("http://127.0.0.1:1", "p.json", "d", "dump", 4, "cpu", str(tmp_path / "o.json"), 1834.0)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--timeout") + 1] == "1834" and seen["run_timeout"] >= 1834.0


def test_the_online_phase_refuses_a_trainer_that_has_not_exited(tmp_path):
    """handoff(): train.json names the process that trained; a server launched while that process still runs (this
    one, for the test), before it finished, or with no such record fails the online phase; one launched after it
    exited passes."""
    import time

    me = {"pid": os.getpid(), "cmdline": kimi_accept._cmdline(os.getpid()), "finished_at": time.time()}
    assert kimi_accept.trainer_running(me)
    assert kimi_accept.handoff(me, me["finished_at"] + 5, kimi_accept.trainer_running(me))["failures"]
    gone = dict(me, pid=2 ** 22 + 17)  # above pid_max's default: no such process
    assert not kimi_accept.trainer_running(gone)
    h = kimi_accept.handoff(gone, gone["finished_at"] + 5, False)
    assert h["failures"] == [] and h["trainer_pid"] == gone["pid"] and not h["trainer_running_at_launch"]
    assert kimi_accept.handoff(gone, gone["finished_at"] - 1, False)["failures"]  # launched before it finished
    assert kimi_accept.handoff({}, time.time(), False)["failures"]


@pytest.mark.engine
@pytest.mark.sglang
@pytest.mark.slow
def test_the_phases_hand_over_through_the_state_folder_on_sglangs_cpu_path(tmp_path):
    """collect -> train -> online as the GPU machine runs them (scripts/gpu_sglang_kimi.sh: one device call each,
    /tmp/e3kimi-state between them): each phase its own kimi_accept.py process, SGLang's real launch_server on its
    CPU path (8 layers, small widths). Only the state folder carries collect's taps to train and train's draft to
    online; train starts no server, and its process has exited before the online server is launched; doctor online's
    prediction is what the server served (float32: no near-ties). The draft is not asked to accept here (two
    training prompts carry nothing to a held-out one): --min-accept-length 1."""
    import subprocess
    import sys

    import kimi_plan

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    state = tmp_path / "e3kimi-state"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(repo, "python"), os.path.join(repo, "tests", "sglang_cpu_plugin"),
         os.environ.get("PYTHONPATH", "")]))
    common = ["--state", str(state), "--small", "--layers", "8", "--device", "cpu", "--experts", "2", "--prompts",
              "2", "--held-out", "1", "--prompt-len", "6", "--new-tokens", "4", "--train-iters", "3", "--budget-s",
              "900", "--min-accept-length", "1"]

    def phase(name):
        p = subprocess.run([sys.executable, os.path.join(repo, "scripts", "gpu_sglang", "kimi_accept.py"), "--out",
                            str(tmp_path / name), "--phase", name, *common], capture_output=True, text=True, env=env,
                           cwd=repo, timeout=1000)
        path = tmp_path / name / f"kimi_{name}.json"
        assert path.exists(), (p.stdout + p.stderr)[-3000:]
        r = json.loads(path.read_text())
        assert p.returncode == 0 and r["ok"], (r["failures"], p.stderr[-2000:])
        return r

    collect = phase("collect")
    assert collect["collect"]["taps"] == [2, 6 + 4, 3 * kimi_shape.SMALL["hidden_size"]]
    assert collect["collect"]["graph_options"] == ["--disable-cuda-graph"]
    assert kimi_plan.missing_files("train", str(state)) is None
    train = phase("train")
    assert not list((tmp_path / "train").glob("*.log")), "the train phase started a server"
    trainer = train["train"]["process"]
    assert trainer["pid"] == train["pid"] != collect["pid"] and trainer["finished_at"] <= train["finished_at"]
    assert collect["finished_at"] <= train["started_at"]
    assert kimi_plan.missing_files("online", str(state)) is None
    online = phase("online")
    h = online["handoff"]
    assert h["failures"] == [] and h["trainer_pid"] == train["pid"] != online["pid"]
    assert not h["trainer_running_at_launch"] and train["finished_at"] < h["server_launched_at"]
    same = online["online_equals_offline"]
    assert same["ok"] and same["counts_equal"] and same["near_ties"] == [], same
    assert online["accept_length"]["served"] == online["accept_length"]["predicted"] >= 1.0
    assert online["dump_online"]["files"] > 0


# a launch_server stand-in: `prog --port P --model-path M MARKER`; while MARKER is absent it creates it and logs the
# bind error uvicorn logs when the port is taken, then hangs (as launch_server does); after, it serves /health and
# /get_model_info for M on P
_FAKE_LAUNCH = r'''
import http.server, json, os, sys, time
port, model, marker = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[sys.argv.index("--model-path") + 1], sys.argv[-1]
if not os.path.exists(marker):
    open(marker, "w").close()
    print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use", flush=True)
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"" if self.path == "/health" else json.dumps({"model_path": model}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _fake_server(tmp_path, model, timeout_s=60.0):
    import sys

    srv = object.__new__(kimi_accept.Server)
    srv.port, srv.timeout_s, srv.target = kimi_accept.free_port(), timeout_s, model
    srv.url = f"http://127.0.0.1:{srv.port}"
    srv.log_path = str(tmp_path / "fake.log")
    srv.cmd = [sys.executable, "-c", _FAKE_LAUNCH, "--model-path", model, "--port", str(srv.port),
               str(tmp_path / "marker")]
    srv.env, srv.proc, srv.start_s = dict(os.environ), None, None
    return srv


def test_a_port_taken_under_launch_server_is_retried_on_another(tmp_path):
    """launch_server whose port another process bound first logs the bind error and never exits: the harness sees
    the error, kills it, and launches again on a new port (it once waited out a whole phase instead)."""
    srv = _fake_server(tmp_path, str(tmp_path))
    with srv:
        assert (tmp_path / "marker").exists() and srv.start_s is not None
        assert srv.cmd[srv.cmd.index("--port") + 1] == str(srv.port)
        with open(srv.log_path) as f:  # the log is the second launch's: the first one's bind error is behind it
            assert kimi_accept.PORT_TAKEN not in f.read()
    assert srv.proc.poll() is not None, "the server outlived its with-block"


def test_a_healthy_server_that_is_not_ours_is_not_taken_for_ours(tmp_path):
    """A port taken by another healthy server (another model path) must not pass for this launch_server."""
    (tmp_path / "marker").touch()  # the stand-in serves at once, but as another model
    srv = _fake_server(tmp_path, str(tmp_path), timeout_s=8.0)
    srv.target = str(tmp_path / "another_model")
    with pytest.raises(RuntimeError, match="not healthy after 8 s"):
        srv.__enter__()
    assert srv.proc.poll() is not None
