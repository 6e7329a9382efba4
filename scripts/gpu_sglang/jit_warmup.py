"""Build SGLang 0.5.23's JIT kernels (tvm-ffi + nvcc) that the tested serving path loads, in parallel, before the
first server starts (scripts/gpu_sglang; scripts/gpu_sglang.sh runs it beside the extension build).

A server compiles each at its first use, one after another; built here side by side, they land in SGLang's own
JIT cache (same sources, flags and build key), so the servers load them. It is also the check that they build on
this machine at all: a failure is reported with the compiler's message. The list is read from SGLang's source
for a float32 DeepseekV3 target (MLA rope head 8) + Llama EAGLE-3 draft (4 KV heads x 16) with the triton
backend; a kernel missing from it is simply compiled later by the server.

    python scripts/gpu_sglang/jit_warmup.py [--workers 6]

Prints one line per kernel (seconds or error) and a JSON summary; exit status 0 when every one built.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def jobs():
    import torch

    from sglang.kernels.ops.activation import activation
    from sglang.kernels.ops.attention import clamp_position, rope
    from sglang.kernels.ops.kvcache import kvcache
    from sglang.kernels.ops.speculative import tree

    def store_cache():
        # the draft's KV rows: 4 heads x 16 x float32 = 256 bytes (False means SGLang falls back, logged by it)
        if not kvcache.can_use_store_cache(256, 256):
            raise RuntimeError("can_use_store_cache(256, 256) is False (see SGLang's warning above)")

    return {
        "rotary_embedding (elementwise/pos_enc.cuh; rope heads 8 and 16 take this fallback)":
            rope._jit_rotary_embedding_module,
        "activation float32 (elementwise/activation.cuh; silu_and_mul)":
            lambda: activation.activation_module(torch.float32),
        "store_cache 256-byte rows (elementwise/kvcache.cuh; the draft's KV)": store_cache,
        "clamp_position int64 (elementwise/clamp_position.cuh)":
            lambda: clamp_position._jit_clamp_position_module(torch.int64),
        "clamp_position int32": lambda: clamp_position._jit_clamp_position_module(torch.int32),
        "speculative tree build / greedy verify (speculative/tree.cuh)": tree._jit_tree_module,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=6)
    a = p.parse_args(argv)
    sys.path.append(os.path.join(HERE, "standins"))
    os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
    t0 = time.time()
    try:
        todo = jobs()
    except BaseException as e:
        print(json.dumps({"ok": False, "import_error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()[-3000:]}, indent=1))
        return 1
    report = {}

    def build(item):
        name, fn = item
        s = time.time()
        try:
            fn()
            report[name] = {"ok": True, "seconds": round(time.time() - s, 1)}
        except BaseException as e:
            report[name] = {"ok": False, "seconds": round(time.time() - s, 1),
                            "error": f"{type(e).__name__}: {str(e)[-2000:]}"}
        print(f"jit_warmup: {name}: {report[name]}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, a.workers)) as ex:
        list(ex.map(build, todo.items()))
    ok = all(r["ok"] for r in report.values())
    print(json.dumps({"ok": ok, "seconds": round(time.time() - t0, 1), "kernels": report}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
