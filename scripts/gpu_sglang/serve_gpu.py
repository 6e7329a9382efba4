"""Serve prompts through SGLang 0.5.23's real ``sglang.Engine`` (EAGLE-3) on one CUDA GPU, CUDA graphs on or off,
and record each response and the timings. (scripts/gpu_sglang; run by compare.py, one process per server:
an Engine owns scheduler and detokenizer processes, and SGLang's ``load_plugins()`` runs once per process).

    python scripts/gpu_sglang/serve_gpu.py --target DIR --draft DIR --prompts prompts.json --out-dir DIR \
        [--cuda-graph on|off] [--steps 3 --topk 1 --draft-tokens 4] [--new-tokens 16] [--timed-repeats 4] \
        [--timed-rounds 1] [--gated] [--enable-metrics] [--dtype float32|bfloat16] [--load-format auto|dummy]
        [--draft-load-format auto|dummy] [--timed-batches 1,16]

Round 1 serves every prompt once (its responses are what the comparisons read, and a first round pays the Triton /
JIT compiles). Then ``--timed-rounds`` R timed rounds, each serving the prompts ``--timed-repeats`` times over
after a flush of the radix cache (tokens/s per round). With ``--gated`` the caller paces the timed rounds through
files in ``--out-dir`` (so servers started side by side time one at a time): the server writes ``ready`` after
round 1, and for r = 1..R waits for ``go.<r>`` (or ``stop``: no more rounds, shut down), serves, writes
``done.<r>``; after round R it waits for ``stop`` before it shuts down (not beside another server's timed round). Timed round r is round r + 1 in the files: ``round1.jsonl``, ``round2.jsonl``, ... (one line per
response: input_ids, output_ids, meta_info) and ``summary.json`` (timings, token counts, ``timed``: one entry per
timed round, server info), or on a failure ``summary.json`` with ``"error"`` and exit status 3. With
``--enable-metrics`` SGLang exports its Prometheus metrics (and this project's plugin its acceptance counts); the
server reads them from SGLang's multiprocess directory after the last round (and two of the plugin's export periods)
into ``metrics.prom`` and the summary's ``metrics``. The caller's environment chooses what loads: this project's
plugin (``EAGLE3_CAPTURE_DISABLE``, ``EAGLE3_CAPTURE_DUMP``, ``EAGLE3_CAPTURE_PROFILE``), and the compiled-package
stand-ins (scripts/gpu_sglang/standins on PYTHONPATH, ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def engine_kwargs(a, fields=None) -> dict:
    """The server: the demo pair in float32 with the triton attention backend on one GPU, as the CPU engine tests
    serve it (tests/engine/serve.py) but on CUDA, with SGLang's CUDA graphs on or off. ``fields``: the installed
    release's ServerArgs field names (None: read from the release), which name the CUDA-graph sizes
    (server_flags.py: one list up to 0.5.12, decode and prefill lists later) and, graphs off, whether there is a
    piecewise prefill graph to turn off too (0.5.12)."""
    if a.device == "cpu" and a.cuda_graph == "on":
        raise ValueError("--cuda-graph on needs --device cuda")
    kw = dict(
        model_path=a.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=a.draft,
        speculative_num_steps=a.steps, speculative_eagle_topk=a.topk, speculative_num_draft_tokens=a.draft_tokens,
        device=a.device, dtype=a.dtype, tp_size=1, attention_backend="triton", skip_tokenizer_init=True,
        mem_fraction_static=a.mem_fraction, max_total_tokens=a.max_total_tokens, chunked_prefill_size=512,
        max_running_requests=a.max_running, context_length=a.context_length, log_level="info",
        disable_cuda_graph=(a.cuda_graph == "off"), enable_metrics=bool(getattr(a, "enable_metrics", False)),
    )
    if a.load_format != "auto":
        kw["load_format"] = a.load_format
    if a.draft_load_format is not None:
        kw["speculative_draft_load_format"] = a.draft_load_format
    from server_flags import eager_kwargs, graph_kwargs, release_options

    fields = release_options()["fields"] if fields is None else fields
    if a.cuda_graph == "on":
        # fewer captured sizes than SGLang's defaults (24 decode, 30 prefill) to keep the start short; every size
        # runs the same capture code
        kw.update(graph_kwargs(fields, [b for b in a.decode_bs if b <= a.max_running], list(a.prefill_bs)))
    else:  # no graph at all: 0.5.12's piecewise prefill graph off too
        kw.update(eager_kwargs(fields))
    return kw


def _int_list(text: str):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(vals))


def _write_jsonl(path, prompts, outs):
    with open(path, "w") as f:
        for ids, o in zip(prompts, outs):
            f.write(json.dumps({"input_ids": ids, "output_ids": o.get("output_ids"),
                                "meta_info": o.get("meta_info")}) + "\n")


def _tokens(outs) -> int:
    return sum(int(o["meta_info"]["completion_tokens"]) for o in outs)


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        return repr(x)


class Gate:
    """The caller's pacing of the timed rounds through files in the server's out dir (``--gated``): ``ready``
    after round 1, then per timed round r: wait for ``go.<r>`` (``stop``: no more rounds), then ``done.<r>``.
    Ungated, every round runs at once."""

    def __init__(self, out_dir: str, gated: bool, timeout_s: float, poll_s: float = 0.05):
        self.dir, self.gated, self.timeout_s, self.poll_s = out_dir, gated, timeout_s, poll_s

    def _touch(self, name: str) -> None:
        # written whole, then renamed: the caller never reads a half-written file
        path = os.path.join(self.dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(str(time.time()))
        os.replace(path + ".tmp", path)

    def ready(self) -> None:
        if self.gated:
            self._touch("ready")

    def wait(self, r: int) -> bool:
        """True when released for timed round r, False when told to stop; TimeoutError when neither comes."""
        if not self.gated:
            return True
        go, stop = os.path.join(self.dir, f"go.{r}"), os.path.join(self.dir, "stop")
        t0 = time.time()
        while True:
            if os.path.exists(go):
                return True
            if os.path.exists(stop):
                return False
            if time.time() - t0 > self.timeout_s:
                raise TimeoutError(f"not released for timed round {r} within {self.timeout_s:.0f} s")
            time.sleep(self.poll_s)

    def done(self, r: int) -> None:
        if self.gated:
            self._touch(f"done.{r}")

    def wait_stop(self) -> float:
        """After the last round: wait for ``stop``, so that this server shuts down only when the caller says (not
        beside another's timed round). Returns the seconds waited."""
        t0 = time.time()
        while self.gated and not os.path.exists(os.path.join(self.dir, "stop")):
            if time.time() - t0 > self.timeout_s:
                raise TimeoutError(f"not told to stop within {self.timeout_s:.0f} s of the last timed round")
            time.sleep(self.poll_s)
        return round(time.time() - t0, 2)


def flush(engine, summary: dict, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Flush the radix cache, retried until SGLang says it did: right after generate() returns, the scheduler may
    still hold the last request ("Cache not flushed because there are pending requests") and a failed flush would
    leave the next round's prompts cached -- a faster round than the others, not a measurement. The retries are
    counted in ``summary["flush_retries"]``."""
    t0, tries = time.time(), 0
    while True:
        res = engine.flush_cache()
        ok = res if isinstance(res, bool) else getattr(res, "success", None)
        if ok is None:
            raise TypeError(f"flush_cache() returned {res!r}; expected a bool or an object with .success")
        if ok:
            summary["flush_retries"] = summary.get("flush_retries", 0) + tries
            return
        if time.time() - t0 > timeout_s:
            raise RuntimeError(f"the radix cache was not flushed within {timeout_s:.0f} s ({tries + 1} tries): "
                               f"{getattr(res, 'message', '')}")
        tries += 1
        time.sleep(poll_s)


def timed_rounds(engine, prompts, params, a, gate: Gate, summary: dict) -> None:
    """Rounds 2..R+1: each after a radix-cache flush, released by the gate, timed alone. ``summary["timed"]`` gets
    one entry per round served; ``summary["round2"]`` is the first (as before there were several)."""
    timed = prompts * a.timed_repeats
    # (batch size, requests): a last group smaller than its batch size still counts for that size
    groups = ([(b, timed[i:i + b]) for b in a.timed_batches for i in range(0, len(timed), b)] if a.timed_batches
              else [(len(timed), timed)])
    summary["timed"] = []
    flush(engine, summary)
    gate.ready()
    for r in range(1, a.timed_rounds + 1):
        t_wait = time.time()
        if not gate.wait(r):
            summary["stopped_before_round"] = r
            return
        waited = round(time.time() - t_wait, 2)
        w0, t0 = time.time(), time.perf_counter()
        outs, per_batch = [], {}
        for size, g in groups:
            g0 = time.perf_counter()
            got = engine.generate(input_ids=g, sampling_params=params)
            b = per_batch.setdefault(str(size), {"tokens": 0, "seconds": 0.0})
            b["tokens"] += _tokens(got)
            b["seconds"] += time.perf_counter() - g0
            outs += got
        t1, w1 = time.perf_counter(), time.time()
        served = [x for _, g in groups for x in g]
        _write_jsonl(os.path.join(a.out_dir, f"round{r + 1}.jsonl"), served, outs)
        tok = _tokens(outs)
        entry = {"round": r, "requests": len(served), "tokens": tok, "seconds": round(t1 - t0, 4),
                 "tokens_per_s": round(tok / (t1 - t0), 1), "waited_s": waited, "wall": [w0, w1]}
        if a.timed_batches:
            entry["per_batch"] = {k: {"tokens": v["tokens"], "seconds": round(v["seconds"], 4),
                                      "tokens_per_s": round(v["tokens"] / v["seconds"], 1)}
                                  for k, v in per_batch.items()}
        summary["timed"].append(entry)
        summary["windows"][f"round{r + 1}"] = [w0, w1]
        if r == 1:
            summary["round2"] = {k: entry[k] for k in ("requests", "tokens", "seconds", "tokens_per_s")}
            summary["waited_for_timed_round_s"] = waited
        flush(engine, summary)  # before the next round, and before the caller releases another server
        gate.done(r)
    summary["waited_for_stop_s"] = gate.wait_stop()


def metrics_snapshot(out_dir: str) -> dict:
    """SGLang's Prometheus metrics as its /metrics would serve them (read from its multiprocess directory, which
    sglang.Engine sets in this process with enable_metrics): the text into metrics.prom, this project's samples
    (eagle3_capture:*) and the family count returned."""
    d = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not d or not os.path.isdir(d):
        return {"error": f"PROMETHEUS_MULTIPROC_DIR is {d!r}: no metrics directory (metrics off?)"}
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=d)
    families = list(reg.collect())
    with open(os.path.join(out_dir, "metrics.prom"), "wb") as f:
        f.write(generate_latest(reg))
    ours = [{"name": s.name, "labels": dict(s.labels), "value": s.value}
            for fam in families if fam.name.startswith("eagle3_capture:") for s in fam.samples]
    return {"families": len(families), "sglang_families": sum(fam.name.startswith("sglang:") for fam in families),
            "eagle3_capture": ours}


def main(argv=None, make_engine=None) -> int:
    """`make_engine`: what stands in for ``sglang.Engine`` (tests/gpu_programs/fake_server.py); None: SGLang's."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", required=True, help="a JSON list of token-id lists")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--cuda-graph", choices=("on", "off"), default="on")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of the same pipeline with the CPU test stand-ins (tests/sglang_cpu_plugin)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--timed-repeats", type=int, default=4, help="each timed round serves the prompts this many times")
    p.add_argument("--timed-rounds", type=int, default=1, help="timed rounds after round 1 (0: none)")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--context-length", type=int, default=56)
    p.add_argument("--max-total-tokens", type=int, default=8192)
    p.add_argument("--mem-fraction", type=float, default=0.2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                   help="dummy: SGLang's random weights (the target needs only config.json)")
    p.add_argument("--draft-load-format", choices=("auto", "dummy"), default=None,
                   help="the draft's (default: --load-format's); auto reads the draft's weights, d2t included")
    p.add_argument("--timed-batches", type=_int_list, default=None,
                   help="each timed round serves the prompts in groups of each of these sizes, one generate() per "
                        "group (tokens/s per batch size); default: all prompts x --timed-repeats at once")
    p.add_argument("--enable-metrics", action="store_true",
                   help="SGLang's Prometheus metrics on (enable_metrics=True); read into metrics.prom at the end")
    p.add_argument("--gated", action="store_true",
                   help="after round 1 write ready, and wait for go.<r> in --out-dir before timed round r (stop: "
                        "no more rounds); write done.<r> after it")
    p.add_argument("--go-timeout", type=float, default=600, help="--gated: longest wait for one go file")
    p.add_argument("--decode-bs", type=_int_list, default=[1, 2, 4, 8, 12, 16, 24, 32],
                   help="decode batch sizes captured in CUDA graphs (comma-separated)")
    p.add_argument("--prefill-bs", type=_int_list, default=[64, 128, 256, 512],
                   help="prefill token counts captured in (breakable) CUDA graphs (comma-separated)")
    a = p.parse_args(argv)
    if a.timed_repeats < 0 or a.timed_rounds < 0 or a.new_tokens < 1 or a.max_running < 1:
        p.error(f"--timed-repeats and --timed-rounds must be >= 0, --new-tokens and --max-running >= 1; got "
                f"{a.timed_repeats}, {a.timed_rounds}, {a.new_tokens}, {a.max_running}")
    if not 0.0 < a.mem_fraction < 1.0:
        p.error(f"--mem-fraction must be in (0, 1), got {a.mem_fraction}")
    if a.device == "cpu" and a.cuda_graph == "on":
        p.error("--cuda-graph on needs --device cuda")
    if not (a.timed_repeats and a.timed_rounds):
        a.timed_rounds = 0  # nothing to time

    os.makedirs(a.out_dir, exist_ok=True)
    summary = {"argv": sys.argv[1:] if argv is None else list(argv), "cuda_graph": a.cuda_graph, "pid": os.getpid(),
               "env": {k: v for k, v in os.environ.items()
                       if k.startswith(("EAGLE3_CAPTURE", "SGLANG_", "TORCH", "E3_"))}}
    spath = os.path.join(a.out_dir, "summary.json")

    def finish(code: int) -> int:
        with open(spath, "w") as f:
            json.dump(summary, f, indent=1)
        return code

    with open(a.prompts) as f:
        prompts = json.load(f)
    params = {"temperature": 0, "max_new_tokens": a.new_tokens, "ignore_eos": True}
    stage = "import sglang"
    engine = None
    try:
        t0 = time.time()
        if make_engine is None:
            import sglang

            summary["sglang_version"] = getattr(sglang, "__version__", None)
            make_engine = sglang.Engine
        stage = "engine start"
        # a stand-in engine names the ServerArgs fields it takes; SGLang's are read from the release
        kw = engine_kwargs(a, getattr(make_engine, "SERVER_ARGS_FIELDS", None))
        summary["engine_kwargs"] = kw
        engine = make_engine(**kw)
        t1 = time.time()
        summary["engine_start_s"] = round(t1 - t0, 2)
        try:
            info = engine.get_server_info()
            summary["server_info"] = {k: _jsonable(info.get(k)) for k in (
                "cuda_graph_config", "disable_cuda_graph", "attention_backend", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests", "version",
                "enable_metrics") if k in info}
        except Exception as e:  # informative only
            summary["server_info_error"] = f"{type(e).__name__}: {e}"
        stage = "round 1"
        outs1 = engine.generate(input_ids=prompts, sampling_params=params)
        t2 = time.time()
        _write_jsonl(os.path.join(a.out_dir, "round1.jsonl"), prompts, outs1)
        summary["round1"] = {"requests": len(prompts), "tokens": _tokens(outs1), "seconds": round(t2 - t1, 3)}
        # wall-clock windows, to place what the capture dump wrote (compare.py)
        summary["windows"] = {"engine start": [t0, t1], "round1": [t1, t2]}
        if a.timed_rounds:
            stage = "timed rounds"
            timed_rounds(engine, prompts, params, a, Gate(a.out_dir, a.gated, a.go_timeout), summary)
        if a.enable_metrics:
            stage = "metrics"
            try:
                # the plugin exports what it counted once per period (its acceptance thread, every
                # drift.BLOCK_SECONDS): read after two, or the last round's last verifies may not be in the files yet
                # (0.5.12's first CPU dry run read 7 verifies of the responses' 8)
                from eagle3_capture.acceptance.drift import BLOCK_SECONDS

                time.sleep(2 * BLOCK_SECONDS)
                summary["metrics"] = metrics_snapshot(a.out_dir)
            except Exception as e:  # the served rounds stand; the report says the metrics could not be read
                summary["metrics"] = {"error": f"{type(e).__name__}: {e}"}
        stage = "shutdown"
        engine.shutdown()
        engine = None
        return finish(0)
    except BaseException as e:  # the failure is the result the caller reports
        summary["error"] = f"{stage}: {type(e).__name__}: {e}"
        summary["traceback"] = traceback.format_exc()[-6000:]
        traceback.print_exc()
        if engine is not None:
            try:
                engine.shutdown()
            except BaseException:
                pass
        return finish(3)


if __name__ == "__main__":  # SGLang spawns its scheduler: the import of this file must not serve again
    sys.exit(main())
