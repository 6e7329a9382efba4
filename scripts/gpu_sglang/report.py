"""Reading and judging the GPU serving comparison's runs (scripts/gpu_sglang; compare.py runs the servers):
the per-request fields compared, equality between two runs, against the target's own greedy continuation, the
accept figures, the plugin's and SGLang's log lines, what the capture dump holds, tokens/s per timed round (median,
min/max) and the plugin / stock ratios per round pair, what the plugin's metrics counted against what was served,
and the verdict (every failed expectation, one line each) beside the findings that are observations, not
failures."""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
from typing import Dict, List, Optional, Sequence

# the plugin's promised log lines (tests/engine/test_engine.py checks the same on the CPU)
# the plugin's startup line: "eagle3_capture: [SGLang <release> (adapter ...): ]DeepseekV3ForCausalLM: taps [...] ..."
# (since 8dfdcfe it names the release and adapter first)


def startup_taps(draft_ids: Sequence[int]) -> str:
    """What the plugin's startup line says of a draft with these ids (-1: the embedding) on the demo target."""
    names = ["Embedding" if i == -1 else f"LayerOutput({i})" for i in draft_ids]
    return f"DeepseekV3ForCausalLM: taps [{', '.join(names)}]"


STARTUP = startup_taps([-1, 0, 3])  # the demo draft's (make_pair.py); its copy without the embedding has others
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
    from eagle3_capture.acceptance.positions import add

    hist = None
    for r in reqs:
        h = r["histogram"]
        if isinstance(h, list):  # histograms end at the request's largest count: add bin by bin, never zip
            hist = add(hist, h) if hist else list(h)
    return {"completion_tokens": tok, "verify_ct": ver, "tokens_per_verify": round(tok / ver, 4) if ver else None,
            "correct_drafts_histogram": hist}


def _is_startup(line: str) -> bool:
    return "eagle3_capture: " in line and "DeepseekV3ForCausalLM: taps [" in line


def log_checks(log: str, taps: str = STARTUP) -> dict:
    """The plugin's lines and SGLang's graph-capture lines in a server's log; ``taps``: what the plugin's startup
    line must say of the draft that server served (:func:`startup_taps`)."""
    lines = log.splitlines()
    graph_lines = [ln.strip()[-200:] for ln in lines if GRAPH_LINE.search(ln)]
    startup = [ln.strip()[-400:] for ln in lines if _is_startup(ln)]
    return {
        "startup_line": startup[:1],
        "startup_line_as_expected": any(_is_startup(ln) and taps in ln for ln in lines),
        "taps_on": any("taps=on" in ln for ln in lines),
        "selftest_passed": sum(SELFTEST_OK in ln for ln in lines),
        "selftest_failed": sum(SELFTEST_FAILED in ln for ln in lines),
        "selftest_lines": [ln.strip()[-300:] for ln in lines if "self-test" in ln][:3],
        "plugin_warnings": [ln.strip()[-300:] for ln in lines if "eagle3_capture" in ln and "not installed" in ln][:4],
        "graph_capture_lines": graph_lines[:12],
        # the plugin's acceptance watch (expected profile, drift alarms, metrics): what it said, for the findings
        "acceptance_lines": [ln.strip()[-300:] for ln in lines if "eagle3_capture" in ln and
                             re.search(r"profile|acceptance|drift|metrics", ln, re.I)][:4],
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
    # timed round r is round r + 1 in the windows (serve_gpu.py)
    out["written_in_timed_rounds"] = sum(1 for r in out["records"]
                                         if re.fullmatch(r"round([2-9]|\d\d+)", r.get("written_in") or ""))
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
         ("plugin_eager", "stock_eager"), ("plugin_metrics", "stock_graphs"), ("plugin_metrics", "stock_metrics"),
         ("plugin_noemb_graphs", "stock_noemb_graphs"))
# each plugin configuration's stock counterpart (the same CUDA-graph mode): what it must serve request for request
STOCK_OF = {"plugin_graphs": "stock_graphs", "plugin_eager": "stock_eager", "plugin_metrics": "stock_metrics",
            "plugin_noemb_graphs": "stock_noemb_graphs"}
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


def _same_as_stock(comp: dict, name: str) -> bool:
    """`name` serves what stock SGLang in its mode serves: a plugin configuration equals its stock counterpart; a
    stock one, by definition, when the plugin in its mode equals it."""
    if name in STOCK_OF:
        c = comp.get(f"{name} vs {STOCK_OF[name]}")
        return bool(c and c["equal"])
    mode = name.split("_", 1)[1] if "_" in name else ""
    return _plugin_matches_stock(comp, mode)


def spread(values: Sequence[float]) -> Optional[dict]:
    """Median, min, max and the spread (max - min, and as a percentage of the median) of per-round figures."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    return {"n": len(vals), "median": round(med, 4), "min": round(min(vals), 4), "max": round(max(vals), 4),
            "spread": round(max(vals) - min(vals), 4),
            "spread_pct": round(100.0 * (max(vals) - min(vals)) / med, 2) if med else None}


def round_tokens_per_s(run: dict) -> Dict[int, float]:
    """{timed round: tokens/s} of a run (a run from before several rounds: its one timed round as round 1)."""
    timed = run.get("timed")
    if isinstance(timed, list):
        return {int(t["round"]): float(t["tokens_per_s"]) for t in timed
                if isinstance(t, dict) and t.get("tokens_per_s") and t.get("round") is not None}
    r2 = (run.get("round2") or {}).get("tokens_per_s")
    return {1: float(r2)} if r2 else {}


def per_round_ratio(a: Dict[int, float], b: Dict[int, float]) -> Dict[int, float]:
    """a / b for every round both served (round r of one beside round r of the other: the same stretch of the
    interleaved schedule)."""
    return {r: a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r] > 0}


RATIOS = (("plugin_graphs", "stock_graphs"), ("plugin_metrics", "stock_graphs"), ("plugin_metrics", "stock_metrics"),
          ("plugin_metrics", "plugin_graphs"))


def speed(runs: Dict[str, dict]) -> dict:
    """tokens/s per timed round of each configuration (median, min/max), the plugin / stock ratios per round pair
    (median, min/max), and the figures of old: the first timed round, plugin / stock and graphs on / off of the
    medians."""
    per = {n: round_tokens_per_s(r) for n, r in runs.items() if r.get("ok")}
    first = {n: (t.get(1) if t else None) for n, t in per.items()}
    out = {"round2_tokens_per_s": first,
           "rounds": {n: {"rounds": sorted(t), "tokens_per_s": [t[k] for k in sorted(t)], **(spread(t.values()) or {})}
                      for n, t in per.items() if t},
           "ratios": {}}
    for a, b in RATIOS:
        if per.get(a) and per.get(b):
            q = per_round_ratio(per[a], per[b])
            if q:
                out["ratios"][f"{a} / {b}"] = {"rounds": sorted(q), "per_round": [round(q[k], 4) for k in sorted(q)],
                                               **spread(q.values())}
    med = {n: v["median"] for n, v in out["rounds"].items()}
    for g in ("graphs", "eager"):
        p, s = med.get(f"plugin_{g}"), med.get(f"stock_{g}")
        if p and s:
            out[f"plugin / stock, {g}"] = round(p / s, 4)
    for w in ("plugin", "stock"):
        on, off = med.get(f"{w}_graphs"), med.get(f"{w}_eager")
        if on and off:
            out[f"{w}: graphs on / off"] = round(on / off, 4)
    return out


def metrics_counted(run: dict) -> Optional[dict]:
    """What the plugin's Prometheus counters (serve_gpu.py's snapshot after the last round, summed over the
    scheduler processes by SGLang's multiprocess collector) counted: verifies and, per draft position, attempts and
    accepted; beside the verifies the responses report (round 1 and every timed round)."""
    m = run.get("metrics")
    if not isinstance(m, dict):
        return None
    if m.get("error"):
        return {"error": m["error"]}
    from eagle3_capture.acceptance import names

    verifies, att, acc = 0.0, {}, {}
    for smp in m.get("eagle3_capture") or []:
        name, labels, value = smp.get("name"), smp.get("labels") or {}, smp.get("value") or 0.0
        pos = labels.get(names.POSITION)
        if name == names.exported(names.VERIFIES):
            verifies += value
        elif name == names.exported(names.ATTEMPTS) and pos is not None:
            att[int(pos)] = att.get(int(pos), 0.0) + value
        elif name == names.exported(names.ACCEPTED) and pos is not None:
            acc[int(pos)] = acc.get(int(pos), 0.0) + value
    positions = sorted(set(att) | set(acc))
    return {"samples": len(m.get("eagle3_capture") or []), "sglang_families": m.get("sglang_families"),
            "verifies": int(verifies), "served_verifies": run.get("served_verifies"),
            "acceptance": [round(acc.get(p, 0.0) / att[p], 4) if att.get(p) else None for p in positions],
            "positions": positions}


def served_acceptance(rows: List[dict], positions: int) -> Optional[List[Optional[float]]]:
    """Per draft position, accepted / attempts over the responses' histograms of correct drafts."""
    hist = accept_figures(rows)["correct_drafts_histogram"]
    if not hist:
        return None
    from eagle3_capture.acceptance.positions import attempts_accepted

    att, acc = attempts_accepted(hist[:positions + 1], positions)
    return [round(a / n, 4) if n else None for n, a in zip(att, acc)]


def profile_check(runs: Dict[str, dict], pair: dict) -> Optional[dict]:
    """The pair's expected-acceptance profile (make_pair.py: doctor accept's prediction) beside the acceptance
    plugin_metrics served in round 1 and what its counters counted."""
    r = runs.get("plugin_metrics")
    if not r or not r.get("ok"):
        return None
    out = {"profile": pair.get("profile"), "profile_error": pair.get("profile_error"),
           "metrics": metrics_counted(r)}
    if pair.get("profile") and os.path.exists(pair["profile"]):
        from eagle3_capture.acceptance import profile as prof

        try:
            pr = prof.read(pair["profile"])
            out["expected"] = [None if x is None else round(x, 4) for x in pr.acceptance()]
            out["expected_accept_length"] = round(pr.accept_length, 4)
            out["served"] = served_acceptance(r["round1_rows"], pr.positions)
        except prof.ProfileError as e:
            out["profile_error"] = str(e)
    return out


# Up to 0.5.12 (every id +1) stock SGLang captures the embedding as layer input 0, where DeepseekV2Model.forward adds
# hidden_states + residual with residual None: its first forward raises this TypeError
STOCK_EMBEDDING_ERROR = "unsupported operand type(s) for +: 'Tensor' and 'NoneType'"


def stock_raises_as_expected(run: dict) -> bool:
    """A stock run on such a release that failed on the embedding tap (its error or its log's tail says so)."""
    text = f"{run.get('error') or ''}\n{run.get('log_tail') or ''}\n{' '.join(run.get('first_error_lines') or [])}"
    return not run.get("ok") and STOCK_EMBEDDING_ERROR in text


def verdict(runs: Dict[str, dict], comp: dict, stock_raises: bool = False) -> List[str]:
    """Every failed expectation, one line each (empty: all held). The plugin must serve exactly what stock SGLang
    serves in the same mode; a difference between graphs on and off, or against transformers, that stock SGLang
    shows request for request too is SGLang's own (a finding, see :func:`attributed`), not the plugin's.
    ``stock_raises``: the release cannot capture the draft's embedding tap (0.5.12 and older): every stock run must
    fail on it (:data:`STOCK_EMBEDDING_ERROR`) while the plugin's serve -- the embedding captured where stock
    raises."""
    bad = []
    for n, r in runs.items():
        if stock_raises and n.startswith("stock") and "noemb" not in n:
            if r.get("ok"):
                bad.append(f"{n}: served, but this release cannot capture the draft's embedding tap: were the ids "
                           "written in its convention?")
            elif not stock_raises_as_expected(r):
                bad.append(f"{n}: did not serve, and not on the embedding tap ({r.get('error') or r.get('rc')})")
            continue
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
            if r.get("metrics_on"):
                bad += metrics_problems(n, metrics_counted(r))
            if _dumped(r):  # the configurations that ran with a capture dump
                bad += dump_problems(n, r.get("dump") or {})
                if r.get("cuda_graph") == "on" and not (r.get("dump") or {}).get("replayed_from_graph"):
                    bad.append(f"{n}: no dumped forward was replayed from a CUDA graph (served verifies under "
                               "graphs)")
        same = r.get("timed_equal_round1")
        if same and not same["equal"]:
            bad.append(f"{n}: the timed rounds' outputs differ from round 1 ({same['mismatch_count']})")
        if r.get("cuda_graph") == "on" and not r["log"]["graph_capture_line_count"]:
            bad.append(f"{n}: no CUDA-graph capture line in the log (were graphs on?)")
    return bad


def metrics_problems(name: str, m: Optional[dict]) -> List[str]:
    """A plugin server with SGLang's metrics on: its counters, read after the last round, must have counted every
    verify the responses report (round 1 and the timed rounds), no more and no fewer."""
    if not m or m.get("error"):
        return [f"{name}: its metrics were not read ({(m or {}).get('error', 'no snapshot')})"]
    if m["verifies"] != m["served_verifies"]:
        return [f"{name}: the plugin's counters counted {m['verifies']} verifies, the responses report "
                f"{m['served_verifies']}"]
    return []


def _dumped(run: dict) -> bool:
    """The run had a capture dump: its environment asked for one (or the report holds its index)."""
    return "EAGLE3_CAPTURE_DUMP" in (run.get("env") or {}) or "dump" in run


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
        if ref is not None and not ref["all"] and _same_as_stock(comp, n):
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
                       f"{d.get('written_in_timed_rounds', d.get('written_in_round2', 0))} written during the "
                       "timed rounds")
        lg = r.get("log") or {}
        if lg.get("selftest_lines"):
            out.append(f"{n}: self-test: {lg['selftest_lines'][0][-200:]}")
        if r.get("cuda_graph") == "on":
            out.append(f"{n}: {lg.get('graph_capture_line_count', 0)} CUDA-graph capture lines, engine start "
                       f"{r.get('engine_start_s')} s")
        if lg.get("acceptance_lines"):
            out.append(f"{n}: acceptance lines: {lg['acceptance_lines']}")
        if r.get("metrics_on"):
            out.append(f"{n}: metrics: {metrics_line(metrics_counted(r))}")
    return out


def metrics_line(m: Optional[dict]) -> str:
    if not m:
        return "no snapshot (the server did not read its metrics)"
    if m.get("error"):
        return f"not read: {m['error']}"
    if not m["samples"]:
        return (f"no eagle3_capture:* samples ({m.get('sglang_families')} sglang:* families exported): the plugin "
                "counts nothing here")
    agree = "equal" if m["verifies"] == m["served_verifies"] else "NOT equal"
    return (f"eagle3_capture verifies {m['verifies']}, the responses' verify counts {m['served_verifies']} "
            f"({agree}); acceptance per position {m['acceptance']}")


def summary_lines(result: dict) -> List[str]:
    """scripts/gpu_sglang.sh's summary lines for a result JSON: PASS / FAIL / SKIP / INFO, one check each."""
    out = []
    for n, c in result["configs"].items():
        if result.get("stock_raises") and n.startswith("stock") and "noemb" not in n and stock_raises_as_expected(c):
            out.append(f"PASS serve {n} raised on the embedding tap as this release does (layer input 0, residual "
                       "None); the plugin's servers capture it")
            continue
        tps = [t.get("tokens_per_s") for t in c.get("timed") or []] or [(c.get("round2") or {}).get("tokens_per_s")]
        extra = f"tokens/s {tps[0] if len(tps) == 1 else tps}" if c.get("ok") else f"{c.get('error')}"
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
    out += speed_lines(result.get("speed") or {}, result.get("schedule"))
    if "plugin_metrics" in result["configs"]:
        out += profile_lines(result.get("pair") or {}, result.get("acceptance_watch"))
    return out


def speed_lines(sp: dict, schedule: Optional[dict]) -> List[str]:
    """INFO lines: tokens/s per configuration over its timed rounds, the ratios per round pair, how many rounds
    were released."""
    out = []
    if schedule:
        plan, rel = schedule.get("plan") or [], schedule.get("released") or []
        line = f"INFO timed rounds: {sum(1 for x in rel if x[3])} of {len(plan)} served one server at a time"
        if schedule.get("not_released"):
            line += f"; not released {schedule['not_released']}"
        if schedule.get("stopped_for_budget"):
            line += f" (stopped for the budget: {schedule['stopped_for_budget']})"
        out.append(line)
    for n, v in (sp.get("rounds") or {}).items():
        out.append(f"INFO tokens/s {n} over {v['n']} timed round(s): median {v['median']}, min {v['min']}, max "
                   f"{v['max']} (spread {v['spread_pct']}%): {v['tokens_per_s']}")
    for k, v in (sp.get("ratios") or {}).items():
        out.append(f"INFO tokens/s {k} per round pair: median {v['median']}, min {v['min']}, max {v['max']} over "
                   f"{v['n']} pair(s): {v['per_round']}")
    rest = {k: v for k, v in sp.items() if k not in ("rounds", "ratios")}
    out.append(f"INFO speed: {rest}")
    return out


def profile_lines(pair: dict, watch: Optional[dict]) -> List[str]:
    if not pair.get("profile"):
        return [f"INFO plugin_metrics served without an expected-acceptance profile: "
                f"{pair.get('profile_error') or 'the pair has none'}"]
    if not watch:
        return [f"INFO plugin_metrics profile {pair['profile']} (plugin_metrics did not serve)"]
    return [f"INFO plugin_metrics profile {pair['profile']}: expected acceptance per position {watch.get('expected')} "
            f"(accept length {watch.get('expected_accept_length')}), served in round 1 {watch.get('served')}"
            + (f"; {watch['profile_error']}" if watch.get("profile_error") else ""),
            f"INFO plugin_metrics metrics: {metrics_line(watch.get('metrics'))}"]


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python scripts/gpu_sglang/report.py RESULT.json   (prints the summary lines)", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        print("\n".join(summary_lines(json.load(f))))
