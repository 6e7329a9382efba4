"""serve_gpu.py with a stand-in for ``sglang.Engine`` (test-only): the same rounds, gate files, summary and metrics
snapshot, without SGLang, so compare.py's side-by-side schedule runs end to end on the CPU in seconds
(tests/gpu_programs/test_compare.py sets compare.SERVE to this file).

The stand-in answers every prompt with a continuation that depends only on the prompt (greedy-like: the same each
round), one verify per 2 tokens and a fixed histogram of correct drafts, and takes ``FAKE_ENGINE_ROUND_S`` seconds
per generate call (x ``FAKE_ENGINE_STOCK_FACTOR`` with EAGLE3_CAPTURE_DISABLE=all, to give stock another speed).
With enable_metrics it counts the plugin's acceptance counters (eagle3_capture.acceptance.names) in Prometheus'
multiprocess mode, in a directory it names in PROMETHEUS_MULTIPROC_DIR as SGLang does. ``FAKE_ENGINE_FAIL=start``
makes the engine start fail (a server that never gets through round 1); ``FAKE_ENGINE_FLUSH_FAILS=1`` makes every
other radix-cache flush fail, as SGLang's does while it still holds a finished request. Nothing here prints the plugin's lines or
writes a capture dump: the report's plugin checks fail on these servers, as they must.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "gpu_sglang")  # the GPU programs
HISTOGRAM = [1, 0, 2, 1]  # per response: 4 verifies accepting 0, 2, 2 and 3 drafts


class FakeEngine:
    SERVER_ARGS_FIELDS = ("cuda_graph_bs_decode", "cuda_graph_bs_prefill")  # SGLang 0.5.23's (serve_gpu.engine_kwargs)

    def __init__(self, **kw):
        if os.environ.get("FAKE_ENGINE_FAIL") == "start":
            raise RuntimeError("the fake engine was told to fail at start")
        self.kw = kw
        if not kw.get("disable_cuda_graph"):  # SGLang's line, which the report reads to tell graphs were on
            print("stand-in engine: Capture cuda graph begin (nothing captured)", flush=True)
        stock = os.environ.get("EAGLE3_CAPTURE_DISABLE") == "all"
        self.round_s = float(os.environ.get("FAKE_ENGINE_ROUND_S", "0.05")) * (
            float(os.environ.get("FAKE_ENGINE_STOCK_FACTOR", "1")) if stock else 1.0)
        self.counters = None
        if kw.get("enable_metrics"):
            # as sglang.Engine: the multiprocess directory set before prometheus_client is imported
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fake_prom_")
            from prometheus_client import Counter

            from eagle3_capture.acceptance import names, positions

            self.positions = positions
            self.counters = {n: Counter(n, names.COUNTERS[n][1], list(names.COUNTERS[n][0]))
                             for n in (names.VERIFIES, names.ATTEMPTS, names.ACCEPTED)}
            self.names = names

    def get_server_info(self):
        return {"disable_cuda_graph": self.kw.get("disable_cuda_graph"), "enable_metrics": self.kw.get("enable_metrics")}

    def flush_cache(self):
        # FAKE_ENGINE_FLUSH_FAILS=1: every other call fails, as SGLang's does while a request is still held
        if os.environ.get("FAKE_ENGINE_FLUSH_FAILS") == "1":
            self.flushes = getattr(self, "flushes", 0) + 1
            if self.flushes % 2:
                return argparse.Namespace(success=False, message="pending requests (stand-in)")
        return argparse.Namespace(success=True, message="")

    def generate(self, input_ids, sampling_params):
        time.sleep(self.round_s)
        n = int(sampling_params["max_new_tokens"])
        outs = []
        for ids in input_ids:
            out = [(sum(ids) + 7 * i) % 97 for i in range(n)]
            outs.append({"output_ids": out, "meta_info": {"completion_tokens": n, "spec_verify_ct": sum(HISTOGRAM),
                                                          "spec_correct_drafts_histogram": list(HISTOGRAM)}})
            if self.counters:
                self._count()
        return outs

    def _count(self):
        nm = self.names
        att, acc = self.positions.attempts_accepted(HISTOGRAM, len(HISTOGRAM) - 1)
        self.counters[nm.VERIFIES].labels("fake").inc(sum(HISTOGRAM))
        for p, (a, c) in enumerate(zip(att, acc), start=1):
            self.counters[nm.ATTEMPTS].labels("fake", str(p)).inc(a)
            self.counters[nm.ACCEPTED].labels("fake", str(p)).inc(c)

    def shutdown(self):
        return None


if __name__ == "__main__":
    sys.path.insert(0, PROGRAMS)  # bootstrap: run as a script (a server process), outside pytest
    import serve_gpu

    sys.exit(serve_gpu.main(sys.argv[1:], make_engine=FakeEngine))
