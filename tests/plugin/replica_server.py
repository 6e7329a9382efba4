"""One server-like replica for the shared-dump tests (issue 32, kind 1): a process that serves through SGLang's real
``ModelRunner.forward`` on the CPU (harness.py: the tiny DeepseekV3, the plugin loaded by SGLang's own
``load_plugins()``), so that every record it dumps goes through the plugin's real dump and writer
(sglang/dump/forwards.py, sglang/dump/writer.py) into ``$EAGLE3_CAPTURE_DUMP``:

    python tests/plugin/replica_server.py OUT.json IDS REQUESTS [DECODES]

IDS: the ids passed to ``set_eagle3_layers_to_capture`` (comma separated; what the replica's draft declares: two
replicas with different ids hold two capture declarations). Each of REQUESTS requests is one prefill of the prompt
and DECODES decode steps, each a served forward and so one record. OUT.json: this process's pid (in its own PID
namespace), how many forwards it served, how many records the plugin says it wrote (``dump.written()``), and the
rids. Run by tests/plugin/test_sglang_replicas.py and tests/sweep_issue32_plugin.py, two at a time, each in its own
PID namespace (``unshare --pid --fork``): both are pid 1 there.
"""
from __future__ import annotations

import json
import os
import sys

from harness import DECODE_TOKEN, PROMPT, ServedRunner, build_hf, build_sglang, setup_process, tiny_config


def main(out_path: str, ids: str, requests: str, decodes: str = "2") -> None:
    if not os.environ.get("EAGLE3_CAPTURE_DUMP"):
        raise SystemExit("replica_server.py: EAGLE3_CAPTURE_DUMP is not set: expected the shared dump directory")
    setup_process()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from eagle3_capture.sglang.dump import forwards as dump

    cfg = tiny_config()
    model = build_sglang(cfg, build_hf(cfg))
    model.set_eagle3_layers_to_capture([int(i) for i in ids.split(",")])
    tag = f"{os.uname().nodename}-{os.getpid()}-{ids.replace(',', '_').replace('-', 'm')}"
    forwards, rids = 0, []
    for n in range(int(requests)):
        rid = f"replica-{tag}-{n}"
        r = ServedRunner(model, cfg, rid=rid)
        r.forward(PROMPT)
        for _ in range(int(decodes)):
            r.forward([DECODE_TOKEN])
        forwards += 1 + int(decodes)
        rids.append(rid)
    if not dump.flush(120):
        raise SystemExit("replica_server.py: the dump's writer did not finish within 120 s")
    # the plugin's own count of records it put on disk (the old plugin, before issue 32, had no such count: then
    # the forwards served stand for it, which is what it would have written)
    written = dump.written() if hasattr(dump, "written") else None
    with open(out_path, "w") as f:
        json.dump({"pid": os.getpid(), "forwards": forwards, "written": written, "rids": rids, "ids": ids}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
