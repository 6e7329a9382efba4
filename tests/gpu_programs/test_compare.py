"""The GPU serving comparison's own logic, on the CPU (scripts/gpu_sglang/compare.py, make_pair.py, serve_gpu.py):
what it calls equal, what it reads from logs and dumps, what it reports as a failure, the stock-convention ids,
the server arguments, the scripts' --help. The comparison itself runs on a GPU (scripts/gpu_sglang.sh); the
`engine`-marked test at the end runs the same pipeline on SGLang's CPU path."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "gpu_sglang")  # the GPU programs

import compare  # noqa: E402
import make_pair  # noqa: E402
import report  # noqa: E402
import serve_gpu  # noqa: E402


def _row(out, verify, hist, tokens=None):
    return {"input_ids": [5, 6], "output_ids": out,
            "meta_info": {"spec_verify_ct": verify, "spec_correct_drafts_histogram": hist,
                          "completion_tokens": len(out) if tokens is None else tokens}}


def test_compare_requests_names_each_difference():
    a = [_row([1, 2, 3], 2, [1, 1]), _row([4, 5, 6], 3, [2, 0])]
    same = report.compare_requests(report.per_request(a), report.per_request(json.loads(json.dumps(a))))
    assert same == {"equal": True, "n": 2, "mismatches": [], "mismatch_count": 0}
    b = [_row([1, 2, 3], 2, [0, 2]), _row([4, 5, 7], 3, [2, 0])]
    diff = report.compare_requests(report.per_request(a), report.per_request(b))
    assert not diff["equal"] and diff["mismatch_count"] == 2
    assert [(m["index"], m["field"]) for m in diff["mismatches"]] == [(0, "histogram"), (1, "output_ids")]
    assert not report.compare_requests(report.per_request(a), report.per_request(a[:1]))["equal"]
    assert not report.compare_requests([], [])["equal"], "two empty runs compare nothing"


def test_reference_and_accept_figures():
    rows = [_row([1, 2, 3, 4], 2, [0, 1]), _row([9, 9, 9, 9], 4, [3, 0])]
    ref = report.against_reference(rows, [[1, 2, 3, 4], [9, 9, 9, 8]])
    assert ref == {"equal": 1, "of": 2, "all": False, "first_differing": [1]}
    assert report.against_reference(rows, None) is None
    acc = report.accept_figures(rows)
    assert acc == {"completion_tokens": 8, "verify_ct": 6, "tokens_per_verify": round(8 / 6, 4),
                   "correct_drafts_histogram": [3, 1]}
    # histograms of different lengths (each ends at its request's largest count) add bin by bin
    longer = rows + [_row([5, 5, 5, 5], 2, [1]), _row([6, 6, 6, 6], 2, [0, 0, 2])]
    assert report.accept_figures(longer)["correct_drafts_histogram"] == [4, 1, 2]


def test_log_checks_reads_the_plugin_and_graph_lines():
    log = "\n".join([
        "[x] eagle3_capture: DeepseekV3ForCausalLM: taps [Embedding, LayerOutput(0), LayerOutput(3)] = draft ids "
        "[-1, 0, 3]; hooks: taps=on final_boundary=on",
        "[x] Capture cuda graph begin. This can take up to several minutes.",
        "[x] Capture target prefill CUDA graph begin. backend=breakable",
        "[x] eagle3_capture: capture self-test passed: slot 0 equals the embedding bit for bit (128 rows)",
        "Traceback (most recent call last):",
    ])
    c = report.log_checks(log)
    assert c["startup_line_as_expected"] and c["taps_on"]
    assert (c["selftest_passed"], c["selftest_failed"], c["graph_capture_line_count"], c["tracebacks"]) == (1, 0, 2, 1)
    bad = report.log_checks("eagle3_capture: capture self-test FAILED: slot 0 should hold Embedding")
    assert bad["selftest_failed"] == 1 and not bad["startup_line_as_expected"]
    # the startup line as the plugin writes it since it names the release and adapter first
    now = report.log_checks("[x] eagle3_capture: SGLang 0.5.23 (adapter packer+layer-boundary): DeepseekV3ForCausalLM: "
                            "taps [Embedding, LayerOutput(0), LayerOutput(3)] | draft ids [-1, 0, 3]; hooks: taps=on")
    assert now["startup_line_as_expected"] and now["startup_line"] and now["taps_on"]
    other = report.log_checks("[x] eagle3_capture: SGLang 0.5.23 (adapter packer): DeepseekV3ForCausalLM: taps "
                              "[Embedding, LayerOutput(1)] | hooks: taps=on")
    assert other["startup_line"] and not other["startup_line_as_expected"]


def _v2(ids, mode, graph=False, rids=("r0",)):
    """A dump record as the plugin wrote it before version 3 (format v2, every key), its rows split evenly between
    `rids`."""
    n, k = len(ids), len(rids)
    reqs = [{"rid": r, "row_start": i * n // k, "row_end": (i + 1) * n // k, "prefix_len": None}
            for i, r in enumerate(rids)]
    return {"format": "eagle3-capture-dump/2", "seq": 0, "forward_mode": mode, "graph": graph,
            "input_ids": torch.tensor(ids), "positions": torch.arange(n), "requests": reqs, "aux": torch.randn(n, 6),
            "layers_to_capture": [0, 1, 4], "draft_ids": [-1, 0, 3], "declared": None, "declared_convention": None,
            "describe": None, "stream": None, "stream_layer_inputs": None, "num_layers": 8, "hidden_size": 2,
            "model_class": "DeepseekV3ForCausalLM", "dtype": "torch.float32", "tp_rank": 0, "tp_size": 1,
            "attn_tp_rank": 0, "attn_tp_size": 1, "dp_rank": None, "writer": "test"}


def _v3(ids, mode, **kw):
    """A dump record as the plugin writes it now (format v3: v2 and the writing process)."""
    return {**_v2(ids, mode, **kw), "format": "eagle3-capture-dump/3", "server": "0123456789abcdef", "host": "h",
            "pid": 6}


def test_the_report_knows_the_dump_formats_version():
    from eagle3_capture.dump_format import FORMAT, FORMATS

    assert FORMATS[FORMAT] == report.CURRENT_VERSION


def test_dump_index_tells_served_prompts_from_warmups(tmp_path):
    prompts = [[7, 8, 9, 10], [20, 21, 22, 23]]
    recs = [(_v2([0, 7, 8, 9, 10, 3], "EXTEND"), 100.0),
            (_v2([1, 1, 1, 1], "TARGET_VERIFY", graph=True, rids=("a", "b")), 200.0),
            (_v3([20, 21, 22, 23, 7, 8, 9, 10], "EXTEND", rids=("c", "d")), 300.0),
            (_v2([1, 1, 1, 1], "EXTEND", rids=(None,)), 310.0),  # warm-up-like: no rid
            (_v2([9, 10], "EXTEND", rids=("e",)), 315.0),  # a prefix-cached extend: served, no whole prompt
            ({"input_ids": torch.tensor([7, 8, 9, 10]), "positions": torch.arange(4), "aux": torch.randn(4, 6),
              "forward_mode": "EXTEND"}, 320.0)]
    for i, (rec, mtime) in enumerate(recs):
        p = tmp_path / f"eagle3_capture_pid1_tp0_{i:06d}.pt"
        torch.save(rec, p)
        os.utime(p, (mtime, mtime))
    (tmp_path / "eagle3_capture_pid1_tp0_000009.pt").write_bytes(b"not a torch file")
    off = _v2([1, 2], "EXTEND")
    off.pop("writer")  # a version-2 record off the contract: the dump format's reader refuses it
    torch.save(off, tmp_path / "eagle3_capture_pid1_tp0_000010.pt")
    os.utime(tmp_path / "eagle3_capture_pid1_tp0_000010.pt", (400.0, 400.0))
    idx = report.dump_index(str(tmp_path), prompts, {"engine start": (0, 150), "round2": (250, 350)})
    assert idx["files"] == 8 and idx["with_served_prompts"] == 3
    assert idx["modes"] == ["EXTEND", "TARGET_VERIFY"]
    assert (idx["replayed_from_graph"], idx["not_current"], idx["errors"]) == (1, 5, 2)  # 4 v2 + 1 v1
    assert idx["not_served"] == 2, "the rid-less extend and the v1 record (no requests)"
    served = [r.get("served_prompts") for r in idx["records"]]
    assert served[:6] == [1, 0, 2, 0, 0, 1] and "error" in idx["records"][6]
    assert "missing keys ['writer']" in idx["records"][7]["error"]
    assert [r["written_in"] for r in idx["records"][:3]] == ["engine start", "outside the rounds", "round2"]
    assert idx["written_in_round2"] == 4
    assert report.dump_index(str(tmp_path / "none"), prompts)["files"] == 0
    bad = "\n".join(report.dump_problems("plugin_graphs", idx))
    assert "2 dump files do not load or break the dump format" in bad and "5 dump files are not format v3" in bad
    assert "2 of 8 dumped forwards are not served traffic" in bad
    assert report.dump_problems("x", {"files": 0}) == ["x: the capture dump is empty"]


SERVED_SELFTEST = ("eagle3_capture: capture self-test passed: slot 0 equals the embedding bit for bit, 3 slots "
                   "distinct (40 rows; served EXTEND forward, request 7f3a and 2 more)")


def test_the_self_test_must_pass_on_a_served_forward():
    assert report.selftest_problems("p", report.log_checks(SERVED_SELFTEST)) == []
    warm = report.log_checks("eagle3_capture: capture self-test passed: slot 0 equals the embedding bit for bit, "
                             "3 slots distinct (128 rows)")
    assert "did not run on a served forward" in report.selftest_problems("p", warm)[0]
    failed = report.log_checks("eagle3_capture: capture self-test FAILED: slot 0 should hold Embedding")
    assert "failed 1x" in report.selftest_problems("p", failed)[0]


def _run(name, ok=True, graph="on", log=None, dump_files=1, r2_equal=True):
    return {"name": name, "ok": ok, "cuda_graph": graph, "error": None if ok else "engine start: boom", "rc": 0,
            "log": log or report.log_checks("eagle3_capture: DeepseekV3ForCausalLM: taps [Embedding, "
                                             "LayerOutput(0), LayerOutput(3)]\n" + SERVED_SELFTEST + "\n"
                                             "Capture cuda graph begin"),
            "dump": {"files": dump_files, "with_served_prompts": dump_files, "not_served": 0,
                     "replayed_from_graph": dump_files if graph == "on" else 0},
            "round1_rows": [_row([1, 2], 1, [1])],
            "timed_equal_round1": {"equal": r2_equal, "mismatch_count": 0 if r2_equal else 1},
            "round2": {"tokens_per_s": 100.0 if name.startswith("plugin") else 110.0}}


def test_verdict_and_speed():
    runs = {n: _run(n, graph="off" if n.endswith("eager") else "on") for n in compare.ORDER}
    comp = report.comparisons(runs, [[1, 2]])
    assert report.verdict(runs, comp) == []
    sp = report.speed(runs)
    assert sp["plugin / stock, graphs"] == round(100 / 110, 4) and sp["plugin: graphs on / off"] == 1.0
    runs["plugin_graphs"] = _run("plugin_graphs", dump_files=0, r2_equal=False)
    runs["stock_eager"] = _run("stock_eager", ok=False, graph="off")
    runs["stock_graphs"]["round1_rows"] = [_row([1, 3], 1, [1])]
    bad = report.verdict(runs, report.comparisons(runs, [[1, 2]]))
    text = "\n".join(bad)
    assert "stock_eager: did not serve (engine start: boom)" in text
    assert "plugin_graphs: the capture dump is empty" in text
    assert "plugin_graphs: the timed rounds' outputs differ from round 1" in text
    assert "plugin_graphs vs stock_graphs: 1 differences" in text
    assert "stock_graphs: 0/1 outputs equal the target's greedy continuation" in text


def test_a_graphs_difference_stock_shows_too_is_sglangs_own():
    """Graphs on vs off differing in the same request with and without the plugin (SGLang's own numerics: its
    graphed prefill takes MLA, the eager one MHA) is a finding; the same difference with the plugin only fails."""
    runs = {n: _run(n, graph="off" if n.endswith("eager") else "on") for n in compare.ORDER}
    for n in ("plugin_graphs", "stock_graphs", "plugin_metrics", "stock_metrics"):
        runs[n]["round1_rows"] = [_row([1, 3], 2, [0])]
    comp = report.comparisons(runs, [[1, 2]])
    assert report.verdict(runs, comp) == []
    own = report.attributed(comp)
    assert set(own["pairs"]) == {"plugin_graphs vs plugin_eager", "stock_graphs vs stock_eager"}
    assert set(own["reference"]) == {"plugin_graphs", "stock_graphs", "plugin_metrics", "stock_metrics"}
    lines = report.findings(runs, comp)
    assert any("SGLang's own graphs-on vs off numerics" in ln for ln in lines)
    result = {"configs": {n: {k: v for k, v in r.items() if k != "round1_rows"} for n, r in runs.items()},
              "comparisons": comp, "ok": True, "failures": [], "speed": report.speed(runs)}
    summary = report.summary_lines(result)
    assert [ln.split()[0] for ln in summary].count("FAIL") == 0
    assert any(ln.startswith("INFO plugin_graphs vs plugin_eager") for ln in summary)
    # the plugin alone differing: a failure, and nothing is attributed to SGLang
    runs["stock_graphs"]["round1_rows"] = runs["stock_metrics"]["round1_rows"] = [_row([1, 2], 1, [1])]
    comp = report.comparisons(runs, [[1, 2]])
    bad = "\n".join(report.verdict(runs, comp))
    assert "plugin_graphs vs plugin_eager: 3 differences" in bad and "plugin_graphs vs stock_graphs: 3" in bad
    assert "plugin_graphs: 0/1 outputs equal the target's greedy continuation" in bad
    assert "plugin_metrics vs stock_graphs: 3 differences" in bad
    assert report.attributed(comp) == {"pairs": {}, "reference": {}}
    # plugin_metrics serving what stock_graphs serves: its difference from transformers is SGLang's own
    runs["plugin_metrics"]["round1_rows"] = [_row([1, 2], 1, [1])]
    runs["stock_graphs"]["round1_rows"] = runs["plugin_metrics"]["round1_rows"] = [_row([1, 4], 1, [1])]
    runs["stock_metrics"]["round1_rows"] = [_row([1, 4], 1, [1])]
    own = report.attributed(report.comparisons(runs, [[1, 2]]))["reference"]
    assert "plugin_metrics" in own and "stock_graphs" not in own, own


def test_findings_say_what_the_dump_and_self_test_saw():
    r = _run("plugin_graphs")
    r["dump"] = {"files": 32, "with_served_prompts": 5, "replayed_from_graph": 27, "not_served": 0,
                 "modes": ["EXTEND", "TARGET_VERIFY"], "written_in_round2": 0}
    r["engine_start_s"] = 41.0
    lines = report.findings({"plugin_graphs": r, "stock_eager": _run("stock_eager", ok=False, graph="off")})
    assert lines[0] == ("plugin_graphs: capture dump 32 files, 5 holding a served prompt, 27 replayed from a CUDA "
                        "graph, 0 not served traffic, forward modes ['EXTEND', 'TARGET_VERIFY'], 0 written during "
                        "the timed rounds")
    assert lines[1].startswith("plugin_graphs: self-test: ") and "41.0 s" in lines[2] and len(lines) == 3


def test_child_env_puts_the_stand_ins_on_the_path_only_for_cuda(monkeypatch):
    monkeypatch.setenv("EAGLE3_CAPTURE_DISABLE", "taps")
    monkeypatch.setenv("PYTHONPATH", "/x")
    env = compare.child_env({"EAGLE3_CAPTURE_DUMP": "/d"})
    assert env["PYTHONPATH"] == "/x" + os.pathsep + compare.STANDINS
    assert env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1" and "EAGLE3_CAPTURE_DISABLE" not in env
    assert env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
    assert env["EAGLE3_CAPTURE_DUMP"] == "/d"
    # on the CPU, the import-only sgl_kernel only for a release that needs it (decided once per PYTHONPATH)
    monkeypatch.setattr(compare, "_CPU_KERNEL_STANDIN", {"/x": "", "/y": "/k"})
    cpu = compare.child_env({}, "cpu")
    assert cpu["PYTHONPATH"] == "/x" and cpu["E3_SGLANG_CPU_STANDINS"] == "1" and cpu["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("PYTHONPATH", "/y")
    assert compare.child_env({}, "cpu")["PYTHONPATH"] == "/y" + os.pathsep + "/k"


@pytest.mark.sglang_releases
@pytest.mark.slow
def test_a_cpu_dry_run_gives_the_import_only_sgl_kernel_to_the_release_that_imports_it(monkeypatch):
    """0.5.12 imports sgl_kernel whatever the device (its memory pool, from the scheduler): its CPU dry-run servers
    get the import-only stand-in, as the release smoke's do; 0.5.23 (this environment) must not see it."""
    from sglang_release_dirs import install_hint, sglang_importable

    root = sglang_importable("0.5.12")
    if root is None:
        pytest.skip(f"SGLang 0.5.12 {install_hint('importable', '0.5.12')}")
    monkeypatch.setattr(compare, "_CPU_KERNEL_STANDIN", {})
    here = os.environ.get("PYTHONPATH", "")
    assert compare.child_env({}, "cpu").get("PYTHONPATH", "") == here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(root), here) if p))
    folder = compare.child_env({}, "cpu")["PYTHONPATH"].split(os.pathsep)[-1]
    assert sorted(os.listdir(folder)) == ["e3_standin_stubs.py", "sgl_kernel"]
    assert os.path.realpath(os.path.join(folder, "sgl_kernel")) == os.path.join(compare.STANDINS, "sgl_kernel")


def test_stock_ids_and_the_stock_draft(tmp_path):
    assert make_pair.stock_ids([-1, 0, 3]) == [0, 1, 4]
    assert make_pair.stock_ids([1, 29, 57]) == [2, 30, 58]
    # up to 0.5.12 every id gets +1: LayerOutput ids are stock's own, the embedding stays -1 (which stock raises on)
    assert make_pair.stock_ids([1, 29, 57], "shift_all") == [1, 29, 57]
    assert make_pair.stock_ids([-1, 0, 3], "shift_all") == [-1, 0, 3]
    with pytest.raises(ValueError, match="unknown id rule"):
        make_pair.stock_ids([1, 2, 3], "sideways")
    with pytest.raises(ValueError, match="start with 1"):
        make_pair.stock_ids([0, 3, 5])
    with pytest.raises(ValueError, match="integers >= -1"):
        make_pair.stock_ids([-2, 3])
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 3],
                                                                 "use_aux_hidden_state": True}, "x": 1}))
    (d / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / "stock"
    assert make_pair.write_stock_draft(str(d), str(out)) == [0, 1, 4]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 4], "use_aux_hidden_state": True}
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((d / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 3]


def _ns(**kw):
    base = dict(target="t", draft="d", steps=3, topk=1, draft_tokens=4, device="cuda", mem_fraction=0.2,
                max_total_tokens=8192, max_running=16, context_length=56, cuda_graph="on",
                decode_bs=[1, 2, 4, 8, 12, 16, 24, 32], prefill_bs=[64, 512], dtype="float32", load_format="auto",
                draft_load_format=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_engine_kwargs_graphs_on_and_off():
    on = serve_gpu.engine_kwargs(_ns(), fields={"cuda_graph_bs_decode", "cuda_graph_bs_prefill", "dtype"})
    assert on["disable_cuda_graph"] is False and on["device"] == "cuda" and on["dtype"] == "float32"
    assert on["cuda_graph_bs_decode"] == [1, 2, 4, 8, 12, 16] and on["cuda_graph_bs_prefill"] == [64, 512]
    assert (on["speculative_num_steps"], on["speculative_eagle_topk"], on["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert "load_format" not in on and "speculative_draft_load_format" not in on
    # a release with one list of decode sizes (0.5.12's ServerArgs) gets it, and no prefill sizes
    one = serve_gpu.engine_kwargs(_ns(), fields={"cuda_graph_bs", "dtype"})
    assert one["cuda_graph_bs"] == [1, 2, 4, 8, 12, 16] and "cuda_graph_bs_prefill" not in one
    off = serve_gpu.engine_kwargs(_ns(cuda_graph="off"), fields={"cuda_graph_bs_decode", "disable_cuda_graph"})
    assert off["disable_cuda_graph"] is True and "cuda_graph_bs_decode" not in off and "cuda_graph_bs" not in off
    assert "disable_piecewise_cuda_graph" not in off
    # 0.5.12 also captures prefill in a piecewise graph by default: graphs off turns that off too (on a CPU host its
    # runner asks torch.cpu for a graph pool and the server dies at start); graphs on keeps the release's default
    fields12 = {"cuda_graph_bs", "disable_cuda_graph", "disable_piecewise_cuda_graph"}
    cpu12 = serve_gpu.engine_kwargs(_ns(cuda_graph="off", device="cpu"), fields=fields12)
    assert cpu12["disable_cuda_graph"] is True and cpu12["disable_piecewise_cuda_graph"] is True
    assert "disable_piecewise_cuda_graph" not in serve_gpu.engine_kwargs(_ns(), fields=fields12)
    # the real-width run (kimi_compare.py): bf16, SGLang's dummy target, the draft's weights (and d2t) from disk
    kimi = serve_gpu.engine_kwargs(_ns(dtype="bfloat16", load_format="dummy", draft_load_format="auto"),
                                  fields={"cuda_graph_bs_decode"})
    assert (kimi["dtype"], kimi["load_format"], kimi["speculative_draft_load_format"]) == ("bfloat16", "dummy", "auto")
    with pytest.raises(ValueError, match="needs --device cuda"):
        serve_gpu.engine_kwargs(_ns(device="cpu"))
    with pytest.raises(ValueError, match="accepts none of"):  # graphs asked of a release with no size option
        serve_gpu.engine_kwargs(_ns(), fields={"dtype"})
    with pytest.raises(argparse.ArgumentTypeError):
        serve_gpu._int_list("1,x")


def _snapshot(verifies):
    """serve_gpu.py's metrics snapshot holding the plugin's verify counter (None: no eagle3_capture samples)."""
    from eagle3_capture.acceptance import names

    ours = [] if verifies is None else [{"name": names.exported(names.VERIFIES), "labels": {}, "value": verifies}]
    return {"families": 3, "sglang_families": 2, "eagle3_capture": ours}


def test_the_plugins_counters_must_count_every_served_verify():
    """A plugin server with metrics on fails the verdict when its counters, read after the last round, counted
    fewer (or more) verifies than the responses report -- 0.5.12's first CPU dry run read 7 of 8, read too soon --
    or could not be read; stock's metrics servers count nothing of the plugin's and are not judged so."""
    rows = [_row([1, 2], 3, [1, 2, 0])]
    run = {"ok": True, "cuda_graph": "off", "metrics_on": True, "round1_rows": rows, "served_verifies": 3,
           "log": report.log_checks("eagle3_capture: DeepseekV3ForCausalLM: taps [Embedding, LayerOutput(0), "
                                    "LayerOutput(3)]\n" + SERVED_SELFTEST)}
    assert report.verdict({"plugin_metrics": dict(run, metrics=_snapshot(3))}, {}) == []
    short = report.verdict({"plugin_metrics": dict(run, metrics=_snapshot(2))}, {})
    assert short == ["plugin_metrics: the plugin's counters counted 2 verifies, the responses report 3"]
    assert report.verdict({"plugin_metrics": dict(run, metrics={"error": "no directory"})}, {})
    assert report.verdict({"stock_metrics": dict(run, metrics=_snapshot(None))}, {}) == []


def test_rejudge_reads_finished_runs_and_keeps_where_they_were_served(tmp_path):
    """--rejudge: the runs of another machine, unpacked, judged by this code; its machine stays the served one."""
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "prompts.json").write_text(json.dumps([[5, 6]]))
    (pair / "reference_greedy.json").write_text(json.dumps({"outputs": [[1, 2]]}))
    (pair / "pair.json").write_text(json.dumps({"target": "/elsewhere/t", "draft": "/elsewhere/d",
                                                "draft_stock": "/elsewhere/ds", "prompts": "/elsewhere/p.json",
                                                "reference": "/elsewhere/r.json", "new_tokens": 2}))
    out = tmp_path / "cmp"
    for n in compare.ORDER:
        d = out / "runs" / n
        d.mkdir(parents=True)
        (d / "round1.jsonl").write_text(json.dumps(_row([1, 2], 1, [1])) + "\n")
        (d / "round2.jsonl").write_text(json.dumps(_row([1, 2], 1, [1])) + "\n")
        env = ({"EAGLE3_CAPTURE_DISABLE": "all"} if n.startswith("stock") else
               {} if n == "plugin_metrics" else {"EAGLE3_CAPTURE_DUMP": "/x"})
        summary = {"env": env, "engine_start_s": 1.0, "round2": {"tokens_per_s": 9.0}, "round1": {"tokens": 2}}
        if n.endswith("_metrics"):  # the counters read after the last round: one verify in each round
            summary["metrics"] = _snapshot(2 if n.startswith("plugin") else None)
        (d / "summary.json").write_text(json.dumps(summary))
        log = ("eagle3_capture: DeepseekV3ForCausalLM: taps [Embedding, LayerOutput(0), LayerOutput(3)]\n"
               + SERVED_SELFTEST + "\n" if n.startswith("plugin") else "") + "Capture cuda graph begin\n"
        (d / "server.log").write_text(log)
        if n in ("plugin_eager", "plugin_graphs"):
            (out / "dumps" / n).mkdir(parents=True)
            # as the plugin under test writes them (format v3; a run made with an older plugin is refused)
            torch.save(_v3([5, 6], "EXTEND"), out / "dumps" / n / "eagle3_capture_h_0123456789abcdef_tp0_000000.pt")
            torch.save(_v3([5, 1, 2, 9], "TARGET_VERIFY", graph=True),
                       out / "dumps" / n / "eagle3_capture_h_0123456789abcdef_tp0_000001.pt")
    (out / "gpu_sglang.json").write_text(json.dumps({"machine": {"gpu": "NVIDIA H200"}}))
    res = tmp_path / "result.json"
    assert compare.main(["--pair", str(pair), "--out", str(out), "--rejudge", "--result", str(res)]) == 0
    r = json.loads(res.read_text())
    assert r["ok"] and r["machine"] == {"gpu": "NVIDIA H200"} and r["rejudged_on"]["platform"]
    assert r["configs"]["plugin_eager"]["env"] == {"EAGLE3_CAPTURE_DUMP": "/x"}
    assert r["configs"]["plugin_graphs"]["dump"]["with_served_prompts"] == 1
    assert json.loads((out / "gpu_sglang.json").read_text()) == {"machine": {"gpu": "NVIDIA H200"}}


# ------------------------------------------------------------------------------------------------------------------
# the interleaved timed rounds: the release order, the per-round figures, the schedule end to end with stand-in
# servers (fake_server.py: serve_gpu.py's own rounds and gate files around a stand-in engine)
# ------------------------------------------------------------------------------------------------------------------

def test_interleaved_rotates_the_order_every_round():
    plan = compare.interleaved(["pg", "sg", "pm"], 5)
    rounds = [[n for n, r in plan if r == k] for k in range(1, 6)]
    assert rounds == [["pg", "sg", "pm"], ["sg", "pm", "pg"], ["pm", "pg", "sg"], ["pg", "sg", "pm"],
                      ["sg", "pm", "pg"]]
    assert [r for _, r in plan] == sorted(r for _, r in plan), "round r is released whole before round r + 1"
    assert {first[0] for first in rounds[:3]} == {"pg", "sg", "pm"}, "every configuration goes first once in 3"
    assert compare.interleaved(["a"], 3) == [("a", 1), ("a", 2), ("a", 3)]
    assert compare.interleaved(["a", "b"], 0) == [] and compare.interleaved([], 4) == []
    with pytest.raises(ValueError, match="rounds must be >= 0"):
        compare.interleaved(["a"], -1)


@given(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=6, unique=True), st.integers(0, 12))
@settings(max_examples=60, deadline=None)
def test_interleaved_serves_each_name_once_a_round_and_rotates(names, rounds):
    plan = compare.interleaved(names, rounds)
    assert len(plan) == len(names) * rounds
    for r in range(1, rounds + 1):
        order = [n for n, k in plan if k == r]
        assert sorted(order) == sorted(names)
        assert order[0] == names[(r - 1) % len(names)] and order == names[(r - 1) % len(names):] + \
            names[:(r - 1) % len(names)]
    # over a whole cycle every name goes first exactly once
    if rounds >= len(names):
        firsts = [[n for n, k in plan if k == r][0] for r in range(1, len(names) + 1)]
        assert sorted(firsts) == sorted(names)


def _stub(name, rounds):
    return argparse.Namespace(name=name, rounds=rounds, cfg={"graph": compare.config_graph(name)})


def test_the_timed_plan_runs_the_eager_rounds_first_then_the_graph_rounds_interleaved():
    servers = [_stub(n, 1 if n.endswith("eager") else 3) for n in compare.ORDER]
    plan = compare.timed_plan(servers)
    assert plan[:2] == [("plugin_eager", 1), ("stock_eager", 1)]
    assert plan[2:6] == [("plugin_graphs", 1), ("stock_graphs", 1), ("plugin_metrics", 1), ("stock_metrics", 1)]
    assert plan[6:10] == [("stock_graphs", 2), ("plugin_metrics", 2), ("stock_metrics", 2), ("plugin_graphs", 2)]
    assert len(plan) == 2 + 12
    # a server asked for fewer rounds (timed repeats 0: none) keeps its place and gets only its own
    servers[1] = _stub("plugin_graphs", 0)
    assert [x for x in compare.timed_plan(servers) if x[0] == "plugin_graphs"] == []


def test_spread_and_the_ratio_per_round_pair():
    assert report.spread([100.0, 110.0, 90.0, 105.0]) == {"n": 4, "median": 102.5, "min": 90.0, "max": 110.0,
                                                          "spread": 20.0, "spread_pct": round(2000 / 102.5, 2)}
    assert report.spread([]) is None and report.spread([None]) is None
    assert report.per_round_ratio({1: 90.0, 2: 100.0, 3: 80.0}, {1: 100.0, 3: 100.0, 4: 50.0}) == {1: 0.9, 3: 0.8}
    assert report.per_round_ratio({1: 1.0}, {1: 0.0}) == {}, "a zero denominator is no ratio"

    def timed(tps):
        return [{"round": i + 1, "tokens_per_s": v} for i, v in enumerate(tps)]

    runs = {"plugin_graphs": {"ok": True, "timed": timed([99.0, 101.0, 98.0])},
            "stock_graphs": {"ok": True, "timed": timed([100.0, 100.0, 100.0])},
            "plugin_metrics": {"ok": True, "timed": timed([97.0, None, 99.0])},  # round 2: no figure
            "stock_eager": {"ok": True, "round2": {"tokens_per_s": 50.0}},     # a run from before the rounds
            "plugin_eager": {"ok": False, "timed": timed([1.0])}}
    sp = report.speed(runs)
    assert sp["rounds"]["plugin_graphs"] == {"rounds": [1, 2, 3], "tokens_per_s": [99.0, 101.0, 98.0], "n": 3,
                                             "median": 99.0, "min": 98.0, "max": 101.0, "spread": 3.0,
                                             "spread_pct": round(300 / 99, 2)}
    assert sp["rounds"]["stock_eager"]["tokens_per_s"] == [50.0] and "plugin_eager" not in sp["rounds"]
    assert sp["ratios"]["plugin_graphs / stock_graphs"]["per_round"] == [0.99, 1.01, 0.98]
    assert sp["ratios"]["plugin_graphs / stock_graphs"]["median"] == 0.99
    pm = sp["ratios"]["plugin_metrics / stock_graphs"]
    assert (pm["rounds"], pm["per_round"], pm["min"], pm["max"]) == ([1, 3], [0.97, 0.99], 0.97, 0.99)
    assert sp["plugin / stock, graphs"] == 0.99 and sp["stock: graphs on / off"] == 2.0
    assert sp["round2_tokens_per_s"]["plugin_graphs"] == 99.0
    lines = report.speed_lines(sp, {"plan": [["a", 1]] * 9, "released": [["a", 1, 0.1, True]] * 6,
                                    "not_released": {"plugin_metrics": 3}, "stopped_for_budget": "12 s left"})
    assert lines[0] == ("INFO timed rounds: 6 of 9 served one server at a time; not released {'plugin_metrics': 3} "
                        "(stopped for the budget: 12 s left)")
    assert ("INFO tokens/s plugin_graphs / stock_graphs per round pair: median 0.99, min 0.98, max 1.01 over 3 "
            "pair(s): [0.99, 1.01, 0.98]") in lines
    assert any(ln.startswith("INFO tokens/s plugin_graphs over 3 timed round(s): median 99.0, min 98.0, max 101.0")
               for ln in lines)


def test_what_the_metrics_counted_beside_what_was_served():
    from eagle3_capture.acceptance import names

    def smp(name, value, pos=None):
        labels = {names.MODEL: "m"} if pos is None else {names.MODEL: "m", names.POSITION: str(pos)}
        return {"name": names.exported(name), "labels": labels, "value": value}

    run = {"metrics": {"families": 40, "sglang_families": 30, "eagle3_capture": [
        smp(names.VERIFIES, 10.0), smp(names.ATTEMPTS, 10.0, 1), smp(names.ACCEPTED, 6.0, 1),
        smp(names.ATTEMPTS, 6.0, 2), smp(names.ACCEPTED, 3.0, 2), smp(names.EXPECTED_ACCEPTANCE, 0.5, 1)]},
        "served_verifies": 10}
    m = report.metrics_counted(run)
    assert (m["verifies"], m["positions"], m["acceptance"]) == (10, [1, 2], [0.6, 0.5])
    assert report.metrics_line(m).startswith("eagle3_capture verifies 10, the responses' verify counts 10 (equal)")
    run["served_verifies"] = 12
    assert "(NOT equal)" in report.metrics_line(report.metrics_counted(run))
    assert "not read: boom" == report.metrics_line(report.metrics_counted({"metrics": {"error": "boom"}}))
    empty = report.metrics_counted({"metrics": {"sglang_families": 30, "eagle3_capture": []}})
    assert "no eagle3_capture:* samples (30 sglang:* families exported)" in report.metrics_line(empty)
    assert report.metrics_counted({}) is None
    assert report.profile_lines({"profile_error": "doctor accept exited 2: x"}, None) == [
        "INFO plugin_metrics served without an expected-acceptance profile: doctor accept exited 2: x"]


def test_the_profile_from_doctor_accepts_report(tmp_path):
    from eagle3_capture.acceptance import profile

    rep = {"served": {"correct_drafts_histogram": [9, 1, 0, 5]}, "prompts": 4,
           "server": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}
    p = make_pair.profile_from_accept(rep, "t", "d")
    assert (p.source, p.speculative, p.histogram, p.prompts) == ("doctor accept", profile.Speculative(3, 1, 4),
                                                                (9, 1, 0, 5), 4)
    back = profile.read(profile.write(p, str(tmp_path / "profile.json")))
    assert back.acceptance() == [6 / 15, 5 / 6, 1.0]
    with pytest.raises(ValueError, match="predicted no served histogram"):
        make_pair.profile_from_accept({"served": None, "notes": ["a tree"]}, "t", "d")
    with pytest.raises(ValueError, match="not the servers'"):
        make_pair.profile_from_accept({**rep, "server": {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 3}},
                                      "t", "d")
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in \
        make_pair.chain_flags()
    assert compare.CHAIN == make_pair.CHAIN == (3, 1, 4)


def test_a_failing_doctor_accept_leaves_no_profile_and_says_why(tmp_path):
    info = make_pair.write_profile(str(tmp_path), str(tmp_path / "no_target"), str(tmp_path / "no_draft"),
                                   str(tmp_path / "no_prompts.json"), 4, "cpu", 120)
    assert "profile" not in info and info["profile_error"].startswith("RuntimeError: doctor accept exited 2")
    assert not (tmp_path / "profile.json").exists()


def _fake_pair(tmp_path, prompts=((5, 6, 7), (8, 9)), profile=True):
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "prompts.json").write_text(json.dumps([list(p) for p in prompts]))
    # what fake_server.py answers: the reference it must equal
    ref = [[(sum(p) + 7 * i) % 97 for i in range(3)] for p in prompts]
    (pair / "reference_greedy.json").write_text(json.dumps({"outputs": ref}))
    info = {"target": "t", "draft": "d", "draft_stock": "ds", "prompts": str(pair / "prompts.json"),
            "reference": str(pair / "reference_greedy.json"), "new_tokens": 3}
    if profile:
        from eagle3_capture.acceptance import profile as prof

        info["profile"] = prof.write(make_pair.profile_from_accept(
            {"served": {"correct_drafts_histogram": [1, 0, 2, 1]}, "prompts": 2,
             "server": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}, "t", "d"), str(pair / "profile.json"))
    (pair / "pair.json").write_text(json.dumps(info))
    return pair


def _fake_env(monkeypatch, round_s, stock_factor=1.0):
    monkeypatch.setattr(compare, "SERVE", os.path.join(HERE, "fake_server.py"))
    monkeypatch.setenv("FAKE_ENGINE_ROUND_S", str(round_s))
    monkeypatch.setenv("FAKE_ENGINE_STOCK_FACTOR", str(stock_factor))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)


def test_the_interleaved_schedule_end_to_end_with_stand_in_servers(tmp_path, monkeypatch):
    """Five serve_gpu.py processes (stand-in engine) side by side: every timed round released alone, in the plan's
    order, none overlapping another; per-round figures and ratios in the JSON; the metrics snapshot read."""
    _fake_env(monkeypatch, 0.1, stock_factor=0.8)
    monkeypatch.setenv("FAKE_ENGINE_FLUSH_FAILS", "1")
    pair, out = _fake_pair(tmp_path), tmp_path / "cmp"
    rc = compare.main(["--pair", str(pair), "--out", str(out), "--rounds", "3", "--eager-rounds", "2",
                       "--timed-repeats", "2", "--budget-s", "120", "--per-round-s", "5", "--reserve-s", "2"])
    r = json.loads((out / "gpu_sglang.json").read_text())
    sched = r["schedule"]
    assert len(sched["plan"]) == 2 * 2 + 4 * 3 and sched["stopped_for_budget"] is None and not sched["not_released"]
    assert [x[:2] for x in sched["released"]] == sched["plan"] and all(x[3] for x in sched["released"])
    # the servers' own clocks: the timed rounds ran one at a time, in the plan's order
    served = sorted((t["wall"][0], t["wall"][1], n, t["round"]) for n, c in r["configs"].items() for t in c["timed"])
    assert [[n, k] for _, _, n, k in served] == sched["plan"]
    assert all(a[1] <= b[0] for a, b in zip(served, served[1:])), "two timed rounds overlapped"
    cfg = r["configs"]
    assert all(c["ok"] and c["rc"] == 0 for c in cfg.values()), {n: c["error"] for n, c in cfg.items()}
    assert [len(cfg[n]["timed"]) for n in compare.ORDER] == [2, 3, 3, 3, 3, 2]
    summary = json.loads((out / "runs" / "stock_graphs" / "summary.json").read_text())
    assert summary["flush_retries"] == 4, "every flush (after round 1 and each timed round) retried once"
    assert cfg["plugin_graphs"]["timed_equal_round1"]["equal"] and cfg["plugin_graphs"]["timed_equal_round1"]["n"] == 12
    assert [cfg[n]["server_info"]["enable_metrics"] for n in ("plugin_graphs", "plugin_metrics")] == [False, True]
    assert cfg["plugin_metrics"]["env"] == {"EAGLE3_CAPTURE_PROFILE": str(pair / "profile.json")}
    sp = r["speed"]
    assert sp["rounds"]["plugin_graphs"]["n"] == 3 and len(sp["ratios"]["plugin_metrics / stock_graphs"]["per_round"]) == 3
    assert 0.6 < sp["ratios"]["plugin_graphs / stock_graphs"]["median"] < 0.95, sp["ratios"]  # stock 1 / 0.8 faster
    # what the stand-in's counters counted: every response's verifies, round 1 and the timed rounds
    watch = r["acceptance_watch"]
    assert watch["metrics"]["verifies"] == watch["metrics"]["served_verifies"] == 4 * 2 * (1 + 3 * 2)
    assert watch["metrics"]["acceptance"] == watch["expected"] == watch["served"] == [0.75, 1.0, 0.3333]
    assert (out / "runs" / "plugin_metrics" / "metrics.prom").exists()
    # judged as the GPU run is: the stand-in prints none of the plugin's lines and writes no dump, so the plugin
    # checks fail -- and only those (plugin_metrics has no dump to check)
    assert rc == 1 and r["comparisons"]["plugin_metrics vs stock_graphs"]["equal"]
    fails = "\n".join(r["failures"])
    assert "plugin_metrics: the plugin's startup line is not in the log" in fails
    assert "plugin_graphs: the capture dump is empty" in fails and "plugin_metrics: the capture dump" not in fails
    assert all(f.startswith(("plugin_eager:", "plugin_graphs:", "plugin_metrics:")) for f in r["failures"]), fails
    lines = report.summary_lines(r)
    assert "PASS plugin_metrics vs stock_graphs: outputs, verify counts, histograms (0 differences over 2 requests)" \
        in lines
    assert any(ln.startswith("INFO timed rounds: 16 of 16 served one server at a time") for ln in lines)
    assert any(ln.startswith("INFO plugin_metrics profile ") for ln in lines)


def test_the_schedule_stops_releasing_rounds_when_time_runs_short(tmp_path, monkeypatch):
    _fake_env(monkeypatch, 0.5)
    pair, out = _fake_pair(tmp_path, profile=False), tmp_path / "cmp"
    compare.main(["--pair", str(pair), "--out", str(out), "--only", "plugin_graphs,stock_graphs,plugin_metrics",
                  "--rounds", "8", "--timed-repeats", "1", "--budget-s", "14", "--per-round-s", "1",
                  "--reserve-s", "3"])
    r = json.loads((out / "gpu_sglang.json").read_text())
    sched = r["schedule"]
    ran = len(sched["released"])
    assert sched["stopped_for_budget"] and 0 < ran < 24 and ran + sum(sched["not_released"].values()) == 24
    assert [x[:2] for x in sched["released"]] == sched["plan"][:ran]
    for n, c in r["configs"].items():  # told to stop, each shut down cleanly with the rounds it had served
        assert c["ok"] and c["rc"] == 0, (n, c["error"])
        assert len(c["timed"]) == sum(1 for x in sched["released"] if x[0] == n)
        assert c["stopped_before_round"] == len(c["timed"]) + 1
    assert any("(stopped for the budget:" in ln for ln in report.summary_lines(r))
    assert "INFO plugin_metrics served without an expected-acceptance profile: the pair has none" in \
        report.summary_lines(r)


def test_a_server_that_never_gets_through_round_1_does_not_hold_the_others(tmp_path, monkeypatch):
    _fake_env(monkeypatch, 0.05)
    pair, out = _fake_pair(tmp_path), tmp_path / "cmp"
    table = compare.config_table

    def failing_stock(pair_, out_, device="cuda"):  # stock_graphs' engine fails at start
        t = table(pair_, out_, device)
        t["stock_graphs"]["env"] = {**t["stock_graphs"]["env"], "FAKE_ENGINE_FAIL": "start"}
        return t

    monkeypatch.setattr(compare, "config_table", failing_stock)
    compare.main(["--pair", str(pair), "--out", str(out), "--only", "plugin_graphs,stock_graphs,plugin_metrics",
                  "--rounds", "2", "--timed-repeats", "1", "--budget-s", "60", "--per-round-s", "5"])
    r = json.loads((out / "gpu_sglang.json").read_text())
    assert r["schedule"]["not_released"] == {"stock_graphs": 2}
    assert not r["configs"]["stock_graphs"]["ok"] and "engine start: RuntimeError" in r["configs"]["stock_graphs"]["error"]
    assert [len(r["configs"][n]["timed"]) for n in ("plugin_graphs", "plugin_metrics")] == [2, 2]
    assert "stock_graphs: did not serve" in "\n".join(r["failures"])
    assert set(r["speed"]["ratios"]) == {"plugin_metrics / plugin_graphs"}   # no stock figure to divide by


def test_the_servers_gate_files(tmp_path):
    g = serve_gpu.Gate(str(tmp_path), gated=True, timeout_s=0.3, poll_s=0.01)
    g.ready()
    assert (tmp_path / "ready").exists() and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(TimeoutError, match="not released for timed round 1 within 0 s"):
        g.wait(1)
    (tmp_path / "go.1").write_text("x")
    assert g.wait(1) is True
    g.done(1)
    assert (tmp_path / "done.1").exists()
    with pytest.raises(TimeoutError, match="not told to stop"):
        g.wait_stop()
    (tmp_path / "stop").write_text("x")
    assert g.wait(2) is False and g.wait_stop() >= 0
    free = serve_gpu.Gate(str(tmp_path / "none"), gated=False, timeout_s=0)
    free.ready()
    assert free.wait(7) is True and free.wait_stop() == 0 and not (tmp_path / "none").exists()


def test_serve_gpu_refuses_bad_rounds(capsys):
    with pytest.raises(SystemExit) as e:
        serve_gpu.main(["--target", "t", "--draft", "d", "--prompts", "p", "--out-dir", "o", "--timed-rounds", "-1"])
    assert e.value.code == 2 and "--timed-rounds must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["scripts/gpu_sglang.sh", "scripts/fetch_device_wheels.sh"])
def test_scripts_have_help_and_refuse_unknown_options(script):
    h = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert h.returncode == 0 and "usage: bash " + script in h.stdout, h.stdout + h.stderr
    bad = subprocess.run(["bash", script, "--bogus"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "unknown" in bad.stderr


@pytest.mark.parametrize("argv,needle", [
    (["--pair", "p", "--out", "o", "--only", "plugin_eager,bogus"], "unknown configuration"),
    (["--pair", "p", "--out", "o", "--rounds", "0"], "--rounds and --eager-rounds must be >= 1"),
    (["--pair", "p", "--out", "o", "--mem-fraction", "1.5"], "--mem-fraction must be in (0, 1)"),
])
def test_compare_rejects_bad_arguments(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# the whole pipeline on SGLang's CPU path (no CUDA graphs there): make_pair --reuse, two servers, the JSON
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.sglang
@pytest.mark.slow
def test_the_pipeline_runs_on_the_cpu_path(tmp_path):
    from doctor_helpers import demo_fast

    _, demo = demo_fast()
    pair = tmp_path / "pair"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "make_pair.py"), "--out", str(pair), "--reuse", demo,
                        "--device", "cpu", "--prompts", "2", "--new-tokens", "4"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "cmp"
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "compare.py"), "--pair", str(pair), "--out", str(out),
                        "--device", "cpu", "--only", "plugin_eager,stock_eager", "--timed-repeats", "1",
                        "--budget-s", "1200", "--per-config-s", "600"],
                       capture_output=True, text=True, env=env, timeout=1300)
    r = json.loads((out / "gpu_sglang.json").read_text())
    assert p.returncode == 0 and r["ok"], r["failures"]
    assert r["comparisons"]["plugin_eager vs stock_eager"]["equal"]
    assert all(v["all"] for v in r["comparisons"]["vs the target's greedy continuation (transformers)"].values())
    pe = r["configs"]["plugin_eager"]
    assert pe["log"]["startup_line_as_expected"] and pe["log"]["selftest_passed"] >= 1
    assert pe["dump"]["with_served_prompts"] >= 1 and pe["timed_equal_round1"]["equal"]
    assert r["speed"]["round2_tokens_per_s"]["plugin_eager"] > 0
    assert r["pair"].get("profile"), r["pair"].get("profile_error")  # make_pair's doctor accept ran on the CPU


# (release, id rule its own set_eagle3_layers_to_capture applies, adapter named in the plugin's startup line)
RELEASE_DRY_RUNS = [pytest.param("0.5.12", "shift_all", "list-in-loop", id="0.5.12"),
                    pytest.param("0.5.20", "shift_if_first_is_1", "packer", id="0.5.20")]


@pytest.mark.engine
@pytest.mark.sglang_releases
@pytest.mark.slow
@pytest.mark.parametrize("version,rule,adapter", RELEASE_DRY_RUNS)
def test_the_pipeline_runs_on_the_cpu_path_on_the_releases_the_gpu_runs_serve(tmp_path, version, rule, adapter):
    """scripts/gpu_sglang.sh's pipeline with SGLANG=0.5.12 (the seed's release) or 0.5.20 (a packer release), as the
    device runs it but on SGLang's CPU path, the release first on PYTHONPATH: the id rule read from the release's
    own code (server_flags, the GPU stand-ins on the path, as gpu_sglang.sh reads it), make_pair with it, then
    compare.py --device cpu. The servers get the release's graphs-off flags (0.5.12's piecewise prefill graph off
    too) and, on 0.5.12, the import-only sgl_kernel. The plugin serves the target's greedy continuation with the
    embedding captured (its self-test on a served forward); on 0.5.12 stock raises on that embedding tap and the
    copy without it serves plugin = stock, its own taps in the plugin's startup line; on 0.5.20 plugin = stock."""
    import server_flags
    from doctor_helpers import demo_fast
    from sglang_release_dirs import install_hint, sglang_importable

    root = sglang_importable(version)
    if root is None:
        pytest.skip(f"SGLang {version} {install_hint('importable', version)}")
    _, demo = demo_fast()
    here = [str(root), os.path.join(REPO, "python"), os.path.join(REPO, "tests", "sglang_cpu_plugin")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(here + [os.environ.get("PYTHONPATH", "")]))
    gpu_env = dict(env, PYTHONPATH=os.pathsep.join([str(root), compare.STANDINS] + here[1:]),
                   SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1")
    opts = server_flags.accepted(gpu_env, cwd=REPO)
    assert (opts["version"], opts["id_rule"]) == (version, rule)
    pair, out = tmp_path / "pair", tmp_path / "cmp"
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "make_pair.py"), "--out", str(pair), "--reuse", demo,
                        "--device", "cpu", "--prompts", "2", "--new-tokens", "4", "--id-rule", rule, "--profile",
                        "off"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "compare.py"), "--pair", str(pair), "--out", str(out),
                        "--device", "cpu", "--only", "plugin_eager,stock_eager", "--timed-repeats", "0",
                        "--budget-s", "1500", "--per-config-s", "600"],
                       capture_output=True, text=True, env=env, timeout=1600)
    r = json.loads((out / "gpu_sglang.json").read_text())
    assert p.returncode == 0 and r["ok"], (r["failures"], p.stdout[-3000:])
    cfg, comp = r["configs"], r["comparisons"]
    noemb = rule == "shift_all"  # +1 on every id: stock cannot capture the embedding tap
    assert r["stock_raises"] == noemb
    assert set(cfg) == {"plugin_eager", "stock_eager"} | (set(compare.NOEMB) if noemb else set())
    raising = {"stock_eager"} if noemb else set()  # SGLang kills that server's process: no summary.json
    for name, c in cfg.items():
        assert c["cuda_graph"] == "off"
        if name not in raising:
            assert c["ok"], (name, c["error"])
            kw = json.loads((out / "runs" / name / "summary.json").read_text())["engine_kwargs"]
            assert kw["disable_cuda_graph"] is True and kw.get("disable_piecewise_cuda_graph", False) == noemb
    pe = cfg["plugin_eager"]
    assert pe["ok"] and pe["log"]["startup_line_as_expected"] and pe["log"]["selftest_passed"] >= 1
    assert f"SGLang {version} (adapter {adapter}" in pe["log"]["startup_line"][0]
    assert "slot 0 equals the embedding bit for bit" in " ".join(pe["log"]["selftest_lines"])
    assert pe["dump"]["with_served_prompts"] >= 1
    greedy = comp["vs the target's greedy continuation (transformers)"]
    if noemb:
        assert not cfg["stock_eager"]["ok"] and report.stock_raises_as_expected(cfg["stock_eager"])
        assert comp["plugin_noemb_graphs vs stock_noemb_graphs"]["equal"]
        assert cfg["plugin_noemb_graphs"]["log"]["startup_line_as_expected"]
        assert all(greedy[n]["all"] for n in ("plugin_eager", *compare.NOEMB)), greedy
    else:
        assert comp["plugin_eager vs stock_eager"]["equal"]
        assert all(greedy[n]["all"] for n in ("plugin_eager", "stock_eager")), greedy


def test_the_cpu_dry_run_serves_every_configuration_with_graphs_off(tmp_path):
    """--device cpu: the GPU run's whole table (the metrics server and the no-embedding pair of a release that cannot
    capture the embedding included), each with graphs off -- the CPU has none -- under its own name."""
    pair = {"draft": "d", "draft_stock": "s", "draft_noemb": "n", "profile": "p"}
    gpu, cpu = compare.config_table(pair, str(tmp_path)), compare.config_table(pair, str(tmp_path), "cpu")
    assert set(gpu) == set(cpu) >= set(compare.ORDER + compare.NOEMB)
    assert {n for n, c in gpu.items() if c["graph"] == "on"} >= {"plugin_graphs", "stock_graphs", *compare.NOEMB}
    assert all(c["graph"] == "off" for c in cpu.values())
    assert all({k: v for k, v in cpu[n].items() if k != "graph"} == {k: v for k, v in gpu[n].items() if k != "graph"}
               for n in gpu)


def test_a_release_that_cannot_capture_the_embedding_expects_stock_to_raise():
    """0.5.12 (every id +1): stock's servers must fail on the embedding tap (residual None at layer input 0) while
    the plugin's serve; a stock server that serves, or fails otherwise, is a failure."""
    err = f"round 1: RuntimeError: scheduler died; TypeError: {report.STOCK_EMBEDDING_ERROR}"
    raised = {"ok": False, "error": err, "cuda_graph": "off"}
    other = {"ok": False, "error": "engine start: OSError: no GPU", "cuda_graph": "off"}
    served = {"ok": True, "cuda_graph": "off", "log": report.log_checks(""), "timed_equal_round1": None}
    assert report.stock_raises_as_expected(raised) and not report.stock_raises_as_expected(other)
    assert not any(line.startswith("stock_eager") for line in report.verdict({"stock_eager": raised}, {}, True))
    assert any("not on the embedding tap" in line for line in report.verdict({"stock_eager": other}, {}, True))
    assert any("cannot capture" in line for line in report.verdict({"stock_eager": served}, {}, True))
    assert any("did not serve" in line for line in report.verdict({"stock_eager": raised}, {}, False))
    lines = report.summary_lines({"configs": {"stock_eager": raised}, "comparisons": {}, "stock_raises": True,
                                  "ok": True, "failures": []})
    assert lines[0].startswith("PASS serve stock_eager raised on the embedding tap")


def test_a_release_without_the_embedding_gets_a_pair_that_both_sides_can_serve(tmp_path):
    """0.5.12: the draft's embedding tap becomes the lowest LayerOutput not declared; that copy's ids mean the same
    layer inputs to the plugin and to 0.5.12's stock (+1 on every id), so it serves both, compared on round 1."""
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0, 3]}}))
    (d / "model.safetensors").write_bytes(b"weights")
    ids = make_pair.write_without_embedding(str(d), str(tmp_path / "noemb"))
    assert ids == [0, 1, 3] and make_pair.stock_ids(ids, "shift_all") == ids
    pair = {"draft": str(d), "draft_stock": "s", "draft_noemb": str(tmp_path / "noemb"), "noemb_ids": ids}
    table = compare.config_table(pair, str(tmp_path))
    assert table["plugin_noemb_graphs"]["draft"] == table["stock_noemb_graphs"]["draft"] == pair["draft_noemb"]
    # the plugin's startup line names that copy's taps (0.5.12's first CPU dry run judged it by the demo draft's)
    line = ("[x] eagle3_capture: SGLang 0.5.12 (adapter list-in-loop): DeepseekV3ForCausalLM: taps [LayerOutput(0), "
            "LayerOutput(1), LayerOutput(3)] | draft ids [0, 1, 3] | layer inputs [1, 2, 4]")
    assert table["plugin_noemb_graphs"]["taps"] == report.startup_taps(ids)
    assert report.log_checks(line, table["plugin_noemb_graphs"]["taps"])["startup_line_as_expected"]
    assert not report.log_checks(line)["startup_line_as_expected"]  # not the demo draft's taps
    assert report.startup_taps([-1, 0, 3]) == report.STARTUP
    assert table["stock_noemb_graphs"]["env"] == {"EAGLE3_CAPTURE_DISABLE": "all"}
    assert ("plugin_noemb_graphs", "stock_noemb_graphs") in report.PAIRS
    # its stock server must serve (not raise) even where stock's embedding servers must raise
    noemb_failed = {"ok": False, "error": f"TypeError: {report.STOCK_EMBEDDING_ERROR}", "cuda_graph": "on"}
    assert any(line.startswith("stock_noemb_graphs: did not serve")
               for line in report.verdict({"stock_noemb_graphs": noemb_failed}, {}, True))
