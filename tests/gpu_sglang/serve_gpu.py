"""Serve prompts through SGLang 0.5.23's real ``sglang.Engine`` (EAGLE-3) on one CUDA GPU, CUDA graphs on or off,
and record each response and the timings. Test-only (tests/gpu_sglang; run by compare.py, one process per server:
an Engine owns scheduler and detokenizer processes, and SGLang's ``load_plugins()`` runs once per process).

    python tests/gpu_sglang/serve_gpu.py --target DIR --draft DIR --prompts prompts.json --out-dir DIR \
        [--cuda-graph on|off] [--steps 3 --topk 1 --draft-tokens 4] [--new-tokens 16] [--timed-repeats 4]

Two rounds on one engine: round 1 serves every prompt once (its responses are what the comparisons read, and a
first round pays the Triton / JIT compiles); then the radix cache is flushed and round 2 serves the prompts
``--timed-repeats`` times over, timed (tokens/s). With ``--go-file`` the server writes ``--ready-file`` after
round 1 and waits for the go file before round 2, so servers started side by side time one at a time. Writes ``round1.jsonl`` / ``round2.jsonl`` (one line per
response: input_ids, output_ids, meta_info) and ``summary.json`` (timings, token counts, server info), or on a
failure ``summary.json`` with ``"error"`` and exit status 3. The caller's environment chooses what loads: this
project's plugin (``EAGLE3_CAPTURE_DISABLE``, ``EAGLE3_CAPTURE_DUMP``), and the compiled-package stand-ins
(tests/gpu_sglang/standins on PYTHONPATH, ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def engine_kwargs(a) -> dict:
    """The server: the demo pair in float32 with the triton attention backend on one GPU, as the CPU engine tests
    serve it (tests/engine/serve.py) but on CUDA, with SGLang's CUDA graphs on or off."""
    if a.device == "cpu" and a.cuda_graph == "on":
        raise ValueError("--cuda-graph on needs --device cuda")
    kw = dict(
        model_path=a.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=a.draft,
        speculative_num_steps=a.steps, speculative_eagle_topk=a.topk, speculative_num_draft_tokens=a.draft_tokens,
        device=a.device, dtype="float32", tp_size=1, attention_backend="triton", skip_tokenizer_init=True,
        mem_fraction_static=a.mem_fraction, max_total_tokens=a.max_total_tokens, chunked_prefill_size=512,
        max_running_requests=a.max_running, context_length=a.context_length, log_level="info",
        disable_cuda_graph=(a.cuda_graph == "off"),
    )
    if a.cuda_graph == "on":
        # fewer captured sizes than SGLang's defaults (24 decode, 30 prefill) to keep the start short; every size
        # runs the same capture code
        kw["cuda_graph_bs_decode"] = [b for b in a.decode_bs if b <= a.max_running]
        kw["cuda_graph_bs_prefill"] = list(a.prefill_bs)
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


def main(argv=None) -> int:
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
    p.add_argument("--timed-repeats", type=int, default=4, help="round 2 serves the prompts this many times")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--context-length", type=int, default=56)
    p.add_argument("--max-total-tokens", type=int, default=8192)
    p.add_argument("--mem-fraction", type=float, default=0.2)
    p.add_argument("--go-file", default=None,
                   help="after round 1, write --ready-file and wait for this file before the timed round")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--go-timeout", type=float, default=600)
    p.add_argument("--decode-bs", type=_int_list, default=[1, 2, 4, 8, 12, 16, 24, 32],
                   help="decode batch sizes captured in CUDA graphs (comma-separated)")
    p.add_argument("--prefill-bs", type=_int_list, default=[64, 128, 256, 512],
                   help="prefill token counts captured in (breakable) CUDA graphs (comma-separated)")
    a = p.parse_args(argv)
    if a.timed_repeats < 0 or a.new_tokens < 1 or a.max_running < 1:
        p.error("--timed-repeats must be >= 0, --new-tokens and --max-running >= 1")
    if a.device == "cpu" and a.cuda_graph == "on":
        p.error("--cuda-graph on needs --device cuda")

    os.makedirs(a.out_dir, exist_ok=True)
    summary = {"argv": sys.argv[1:], "cuda_graph": a.cuda_graph, "pid": os.getpid(),
               "env": {k: v for k, v in os.environ.items() if k.startswith(("EAGLE3_CAPTURE", "SGLANG_", "TORCH"))}}
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
        import sglang

        summary["sglang_version"] = getattr(sglang, "__version__", None)
        stage = "engine start"
        kw = engine_kwargs(a)
        summary["engine_kwargs"] = kw
        engine = sglang.Engine(**kw)
        t1 = time.time()
        summary["engine_start_s"] = round(t1 - t0, 2)
        try:
            info = engine.get_server_info()
            summary["server_info"] = {k: _jsonable(info.get(k)) for k in (
                "cuda_graph_config", "disable_cuda_graph", "attention_backend", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests", "version")
                if k in info}
        except Exception as e:  # informative only
            summary["server_info_error"] = f"{type(e).__name__}: {e}"
        stage = "round 1"
        outs1 = engine.generate(input_ids=prompts, sampling_params=params)
        t2 = time.time()
        _write_jsonl(os.path.join(a.out_dir, "round1.jsonl"), prompts, outs1)
        summary["round1"] = {"requests": len(prompts), "tokens": _tokens(outs1), "seconds": round(t2 - t1, 3)}
        # wall-clock windows, to place what the capture dump wrote (compare.py)
        summary["windows"] = {"engine start": [t0, t1], "round1": [t1, t2]}
        if a.timed_repeats:
            stage = "flush cache"
            engine.flush_cache()
            if a.go_file:
                # servers started side by side: the caller releases one timed round at a time
                stage = "waiting for the timed round"
                with open(a.ready_file or a.go_file + ".ready", "w") as f:
                    f.write(str(time.time()))
                waited = time.time()
                while not os.path.exists(a.go_file):
                    if time.time() - waited > a.go_timeout:
                        raise TimeoutError(f"not released for the timed round within {a.go_timeout:.0f} s")
                    time.sleep(0.1)
                summary["waited_for_timed_round_s"] = round(time.time() - waited, 1)
            stage = "round 2"
            timed = prompts * a.timed_repeats
            w3, t3 = time.time(), time.perf_counter()
            outs2 = engine.generate(input_ids=timed, sampling_params=params)
            t4, w4 = time.perf_counter(), time.time()
            summary["windows"]["round2"] = [w3, w4]
            _write_jsonl(os.path.join(a.out_dir, "round2.jsonl"), timed, outs2)
            tok = _tokens(outs2)
            summary["round2"] = {"requests": len(timed), "tokens": tok, "seconds": round(t4 - t3, 4),
                                 "tokens_per_s": round(tok / (t4 - t3), 1)}
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
