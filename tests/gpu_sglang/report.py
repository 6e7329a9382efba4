"""Reading and judging the GPU serving comparison's runs (test-only, tests/gpu_sglang; compare.py runs the servers):
the per-request fields compared, equality between two runs, against the target's own greedy continuation, the
accept figures, the plugin's and SGLang's log lines, what the capture dump holds, the tokens/s ratios, and the
verdict (every failed expectation, one line each) beside the findings that are observations, not failures."""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Dict, List, Optional

# the plugin's promised log lines (tests/engine/test_engine.py checks the same on the CPU)
# the plugin's startup line: "eagle3_capture: [SGLang <release> (adapter ...): ]DeepseekV3ForCausalLM: taps [...] ..."
# (since 8dfdcfe it names the release and adapter first)
STARTUP = "DeepseekV3ForCausalLM: taps [Embedding, LayerOutput(0), LayerOutput(3)]"
SELFTEST_OK = "capture self-test passed"
SELFTEST_FAILED = "capture self-test FAILED"
GRAPH_LINE = re.compile(r"[Cc]apture.*(cuda|CUDA) ?graph", re.I)



def read_jsonl(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def per_request(rows: List[dict]) -> List[dict]:
    """What the comparisons read from each response: output ids, verify count, accept histogram, tokens."""
    out = []
    for r in rows:
        m = r.get("meta_info") or {}
        out.append({"output_ids": r.get("output_ids"), "verify_ct": m.get("spec_verify_ct"),
                    "histogram": m.get("spec_correct_drafts_histogram"),
                    "tokens": m.get("completion_tokens")})
    return out


def compare_requests(a: List[dict], b: List[dict], fields=("output_ids", "verify_ct", "histogram")) -> dict:
    """Request-by-request equality of two runs over the same prompts: {equal, n, mismatches: [{index, field}]}."""
    mism = []
    if len(a) != len(b):
        return {"equal": False, "n": [len(a), len(b)], "mismatches": [{"index": None, "field": "request count"}]}
    for i, (x, y) in enumerate(zip(a, b)):
        for f in fields:
            if x.get(f) != y.get(f):
                mism.append({"index": i, "field": f, "a": x.get(f), "b": y.get(f)})
    return {"equal": not mism and len(a) > 0, "n": len(a), "mismatches": mism[:8], "mismatch_count": len(mism)}


def against_reference(rows: List[dict], reference: Optional[List[List[int]]]) -> Optional[dict]:
    """How many responses equal the target's own greedy continuation (lossless speculative decoding)."""
    if reference is None:
        return None
    outs = [r["output_ids"] for r in per_request(rows)]
    equal = [o == ref for o, ref in zip(outs, reference)]
    return {"equal": sum(equal), "of": len(reference), "all": len(outs) == len(reference) and all(equal),
            "first_differing": [i for i, e in enumerate(equal) if not e][:8]}


def accept_figures(rows: List[dict]) -> dict:
    reqs = per_request(rows)
    tok = sum(r["tokens"] or 0 for r in reqs)
    ver = sum(r["verify_ct"] or 0 for r in reqs)
    hist = None
    for r in reqs:
        h = r["histogram"]
        if isinstance(h, list):
            hist = [x + y for x, y in zip(hist, h)] if hist else list(h)
    return {"completion_tokens": tok, "verify_ct": ver, "tokens_per_verify": round(tok / ver, 4) if ver else None,
            "correct_drafts_histogram": hist}


def _is_startup(line: str) -> bool:
    return "eagle3_capture: " in line and "DeepseekV3ForCausalLM: taps [" in line


def log_checks(log: str) -> dict:
    """The plugin's lines and SGLang's graph-capture lines in a server's log."""
    lines = log.splitlines()
    graph_lines = [ln.strip()[-200:] for ln in lines if GRAPH_LINE.search(ln)]
    startup = [ln.strip()[-400:] for ln in lines if _is_startup(ln)]
    return {
        "startup_line": startup[:1],
        "startup_line_as_expected": any(_is_startup(ln) and STARTUP in ln for ln in lines),
        "taps_on": any("taps=on" in ln for ln in lines),
        "selftest_passed": sum(SELFTEST_OK in ln for ln in lines),
        "selftest_failed": sum(SELFTEST_FAILED in ln for ln in lines),
        "selftest_lines": [ln.strip()[-300:] for ln in lines if "self-test" in ln][:3],
        "plugin_warnings": [ln.strip()[-300:] for ln in lines if "eagle3_capture" in ln and "not installed" in ln][:4],
        "graph_capture_lines": graph_lines[:12],
        "graph_capture_line_count": len(graph_lines),
        "tracebacks": log.count("Traceback (most recent call last)"),
    }


CURRENT_VERSION = 3  # the dump format's version the plugin writes (eagle3_capture.dump_format.FORMAT)


def dump_index(dump_dir: str, prompts: List[List[int]], windows: Optional[dict] = None) -> dict:
    """What the plugin's capture dump holds, each file read and checked by the dump format's one reader
    (eagle3_capture.dump_format): per file the format version, the forward mode, whether it was replayed from a CUDA
    graph, rows, request ids, whether the rows hold a served prompt (its tokens in order at some offset), and the
    round it was written in; a file that does not load or breaks the format is an error. A warm-up or capture pass of
    SGLang's has no request ids: a dump of served traffic holds none."""
    files = sorted(glob.glob(os.path.join(dump_dir, "*.pt")))
    out = {"dir": dump_dir, "files": len(files), "records": []}
    if not files:
        return out
    from eagle3_capture.dump_format import DumpError, load_record

    def holds_prompt(ids: List[int]) -> int:
        n = 0
        for pr in prompts:
            k = len(pr)
            if any(ids[s:s + k] == pr for s in range(0, max(0, len(ids) - k) + 1)):
                n += 1
        return n

    for path in files:
        rec = {"file": os.path.basename(path)}
        try:
            r = load_record(path)
            ids = r.input_ids.tolist()
            reqs = r.requests or []
            rec.update(version=r.version, forward_mode=r.forward_mode, graph=r.graph, rows=r.rows,
                       aux_shape=list(r.aux.shape) if r.aux is not None else None,
                       layers_to_capture=r.layers_to_capture, draft_ids=r.draft_ids, requests=len(reqs),
                       rids_missing=sum(1 for q in reqs if q.rid is None), served_prompts=holds_prompt(ids))
        except DumpError as e:
            rec["error"] = str(e)
        mt = os.path.getmtime(path)
        if windows:
            rec["written_in"] = next((name for name, (s, e) in windows.items() if s <= mt <= e), "outside the rounds")
        out["records"].append(rec)
    recs = [r for r in out["records"] if "error" not in r]
    out["errors"] = len(out["records"]) - len(recs)
    out["with_served_prompts"] = sum(1 for r in recs if r["served_prompts"])
    out["modes"] = sorted({r["forward_mode"] for r in recs if r.get("forward_mode")})
    out["replayed_from_graph"] = sum(1 for r in recs if r.get("graph"))
    # the plugin under test writes the current format (version 3: with the writing process)
    out["not_current"] = sum(1 for r in recs if r.get("version") != CURRENT_VERSION)
    # SGLang's warm-up / capture batches carry no request ids (a served ForwardBatch has every request's rid); an
    # extend need not hold a whole prompt (prefix cache, chunked prefill), so that is counted, not required
    out["not_served"] = sum(1 for r in recs if not r["requests"] or r["rids_missing"])
    out["written_in_round2"] = sum(1 for r in out["records"] if r.get("written_in") == "round2")
    return out


def dump_problems(name: str, d: dict) -> List[str]:
    """Why a plugin run's dump is not a dump of served traffic (the plugin dumps around the model runner's
    forward, after a graph replay too, and never SGLang's warm-up or capture passes)."""
    if not d.get("files"):
        return [f"{name}: the capture dump is empty"]
    bad = []
    if d.get("errors"):
        bad.append(f"{name}: {d['errors']} dump files do not load or break the dump format")
    if d.get("not_current"):
        bad.append(f"{name}: {d['not_current']} dump files are not format v{CURRENT_VERSION}")
    if d.get("not_served"):
        bad.append(f"{name}: {d['not_served']} of {d['files']} dumped forwards are not served traffic (warm-up or "
                   "capture passes)")
    if not d.get("with_served_prompts"):
        bad.append(f"{name}: no dumped forward holds a served prompt")
    return bad


def selftest_problems(name: str, lg: dict) -> List[str]:
    """The self-test must pass once, on a served forward (its line says 'served ... request <rid>')."""
    if not lg["selftest_passed"] or lg["selftest_failed"]:
        return [f"{name}: self-test passed {lg['selftest_passed']}x, failed {lg['selftest_failed']}x"]
    passed = [ln for ln in lg["selftest_lines"] if SELFTEST_OK in ln]
    if not any("served " in ln and "request " in ln for ln in passed):
        return [f"{name}: the self-test did not run on a served forward: {passed[:1]}"]
    return []


PAIRS = (("plugin_graphs", "plugin_eager"), ("stock_graphs", "stock_eager"), ("plugin_graphs", "stock_graphs"),
         ("plugin_eager", "stock_eager"))
REFERENCE = "vs the target's greedy continuation (transformers)"


def comparisons(runs: Dict[str, dict], reference) -> dict:
    """Request by request: graphs on vs off (plugin, stock), plugin vs stock (graphs on, off), each run vs the
    target's own transformers greedy continuation."""
    rows = {n: per_request(r["round1_rows"]) for n, r in runs.items() if r.get("ok")}
    out = {}
    for a, b in PAIRS:
        if a in rows and b in rows:
            out[f"{a} vs {b}"] = compare_requests(rows[a], rows[b])
    out[REFERENCE] = {n: against_reference(r["round1_rows"], reference) for n, r in runs.items() if r.get("ok")}
    return out


def _plugin_matches_stock(comp: dict, mode: str) -> bool:
    c = comp.get(f"plugin_{mode} vs stock_{mode}")
    return bool(c and c["equal"])


def speed(runs: Dict[str, dict]) -> dict:
    tps = {n: (r.get("round2") or {}).get("tokens_per_s") for n, r in runs.items() if r.get("ok")}
    out = {"round2_tokens_per_s": tps}
    for g in ("graphs", "eager"):
        p, s = tps.get(f"plugin_{g}"), tps.get(f"stock_{g}")
        if p and s:
            out[f"plugin / stock, {g}"] = round(p / s, 4)
    for w in ("plugin", "stock"):
        on, off = tps.get(f"{w}_graphs"), tps.get(f"{w}_eager")
        if on and off:
            out[f"{w}: graphs on / off"] = round(on / off, 4)
    return out


def verdict(runs: Dict[str, dict], comp: dict) -> List[str]:
    """Every failed expectation, one line each (empty: all held). The plugin must serve exactly what stock SGLang
    serves in the same mode; a difference between graphs on and off, or against transformers, that stock SGLang
    shows request for request too is SGLang's own (a finding, see :func:`attributed`), not the plugin's."""
    bad = []
    for n, r in runs.items():
        if not r.get("ok"):
            bad.append(f"{n}: did not serve ({r.get('error') or r.get('rc')})")
    own = attributed(comp)
    for key, c in comp.items():
        if key == REFERENCE:
            for n, ref in c.items():
                if ref is not None and not ref["all"] and n not in own["reference"]:
                    bad.append(f"{n}: {ref['equal']}/{ref['of']} outputs equal the target's greedy continuation, "
                               "and no stock run in the same mode serves the same")
        elif not c["equal"] and key not in own["pairs"]:
            bad.append(f"{key}: {c.get('mismatch_count')} differences, first {c['mismatches'][:2]}")
    for n, r in runs.items():
        if not r.get("ok"):
            continue
        if n.startswith("plugin"):
            lg = r["log"]
            if not lg["startup_line_as_expected"]:
                bad.append(f"{n}: the plugin's startup line is not in the log")
            bad += selftest_problems(n, lg)
            bad += dump_problems(n, r.get("dump") or {})
            if r.get("cuda_graph") == "on" and not (r.get("dump") or {}).get("replayed_from_graph"):
                bad.append(f"{n}: no dumped forward was replayed from a CUDA graph (served verifies under graphs)")
        if r.get("round2_equals_round1") and not r["round2_equals_round1"]["equal"]:
            bad.append(f"{n}: round 2 outputs differ from round 1 ({r['round2_equals_round1']['mismatch_count']})")
        if r.get("cuda_graph") == "on" and not r["log"]["graph_capture_line_count"]:
            bad.append(f"{n}: no CUDA-graph capture line in the log (were graphs on?)")
    return bad


def attributed(comp: dict) -> dict:
    """The differences stock SGLang shows identically, i.e. SGLang's own: graphs on vs off when the plugin equals
    stock in both modes (then both differ in the same requests, the same way), and the runs against transformers
    whose same-mode stock run serves the same outputs."""
    pairs = {}
    if _plugin_matches_stock(comp, "graphs") and _plugin_matches_stock(comp, "eager"):
        for who in ("plugin", "stock"):
            c = comp.get(f"{who}_graphs vs {who}_eager")
            if c and not c["equal"]:
                pairs[f"{who}_graphs vs {who}_eager"] = (
                    f"{c['mismatch_count']} differences in requests {[m['index'] for m in c['mismatches']]}, the "
                    "same with and without the plugin: SGLang's own graphs-on vs off numerics")
    reference = {}
    for n, ref in (comp.get(REFERENCE) or {}).items():
        mode = n.split("_", 1)[1] if "_" in n else ""
        if ref is not None and not ref["all"] and _plugin_matches_stock(comp, mode):
            reference[n] = (f"{ref['equal']}/{ref['of']} equal the transformers continuation (differing: "
                            f"{ref['first_differing']}); stock SGLang in the same mode serves the same")
    return {"pairs": pairs, "reference": reference}


def findings(runs: Dict[str, dict], comp: Optional[dict] = None) -> List[str]:
    """Observations worth reading that are not failures: what the capture dump and the self-test saw with CUDA
    graphs on (only eager forwards run Python: warm-ups, or prefills outside the captured sizes), and dump files
    written during the timed round (their cost is inside its tokens/s)."""
    out = []
    if comp:
        own = attributed(comp)
        out += [f"{k}: {v}" for k, v in own["pairs"].items()] + [f"{k}: {v}" for k, v in own["reference"].items()]
    for n, r in runs.items():
        if not r.get("ok"):
            continue
        d = r.get("dump")
        if d and d.get("files"):
            out.append(f"{n}: capture dump {d['files']} files, {d.get('with_served_prompts', 0)} holding a served "
                       f"prompt, {d.get('replayed_from_graph', 0)} replayed from a CUDA graph, "
                       f"{d.get('not_served', 0)} not served traffic, forward modes {d.get('modes')}, "
                       f"{d.get('written_in_round2', 0)} written during the timed round")
        lg = r.get("log") or {}
        if lg.get("selftest_lines"):
            out.append(f"{n}: self-test: {lg['selftest_lines'][0][-200:]}")
        if r.get("cuda_graph") == "on":
            out.append(f"{n}: {lg.get('graph_capture_line_count', 0)} CUDA-graph capture lines, engine start "
                       f"{r.get('engine_start_s')} s")
    return out


def summary_lines(result: dict) -> List[str]:
    """scripts/gpu_sglang.sh's summary lines for a result JSON: PASS / FAIL / SKIP / INFO, one check each."""
    out = []
    for n, c in result["configs"].items():
        extra = f"tokens/s {(c.get('round2') or {}).get('tokens_per_s')}" if c.get("ok") else f"{c.get('error')}"
        out.append(f"{'PASS' if c.get('ok') else 'FAIL'} serve {n} (cuda graphs {c['cuda_graph']}): {extra}")
    for n, why in result.get("skipped", {}).items():
        out.append(f"SKIP serve {n}: {why}")
    own = attributed(result["comparisons"])
    for key, c in result["comparisons"].items():
        if key == REFERENCE:
            for n, ref in c.items():
                if ref is not None:
                    word = "PASS" if ref["all"] else ("INFO" if n in own["reference"] else "FAIL")
                    out.append(f"{word} {n} vs the target's transformers greedy continuation: {ref['equal']}/"
                               f"{ref['of']} equal{' (stock serves the same)' if word == 'INFO' else ''}")
        else:
            word = "PASS" if c["equal"] else ("INFO" if key in own["pairs"] else "FAIL")
            note = " (the same with and without the plugin: SGLang's own)" if word == "INFO" else ""
            out.append(f"{word} {key}: outputs, verify counts, histograms ({c.get('mismatch_count', 0)} differences "
                       f"over {c['n']} requests){note}")
    out.append(f"{'PASS' if result['ok'] else 'FAIL'} verdict: "
               f"{'; '.join(result['failures']) or 'every expectation held'}")
    out.append(f"INFO speed: {result['speed']}")
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python tests/gpu_sglang/report.py RESULT.json   (prints the summary lines)", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        print("\n".join(summary_lines(json.load(f))))
