"""Issue 32's doctor kinds for tests/sweep_bad_inputs.py, the messages part (tests/sweep_issue32_doctor.py gathers
them): 32.1 a dump directory several servers or declarations write, 32.8 waits and messages."""
from __future__ import annotations

import json
import os
import shutil
import time

from sweep_issue32_doctor import CHAIN, DECLARED, L, N, expect, with_server

DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]
OTHER = ["Embedding", "LayerOutput(0)", "LayerOutput(1)"]


def shared_cases(demo, tmp, t, pp, resp):
    """32.1: one directory, two declarations: the doctor names both, no verdict on the mixture."""
    from sweep_bad_inputs import FINDING, OK, Case, cli

    d = os.path.join(tmp, "i32_1_shared")
    t.write_dump(d, DECLARED, list(range(L + 1)), run="replica-a", declared=DECL)
    t.write_dump(d, [0, 1, 2], list(range(L + 1)), run="replica-b", declared=OTHER, start_seq=50)
    solo = os.path.join(tmp, "i32_1_solo")
    t.write_dump(solo, DECLARED, list(range(L + 1)), run="replica-a", declared=DECL)
    c = [Case("32.1", "fingerprint --captured: one server's records (must pass)",
              lambda: cli("doctor", "fingerprint", "--captured", solo), {OK}),
         Case("32.1", "fingerprint --captured: two declarations in one directory",
              expect(lambda: cli("doctor", "fingerprint", "--captured", d), str(DECL), str(OTHER)), {FINDING})]
    mixed = os.path.join(tmp, "i32_1_mixed_ref")
    os.makedirs(mixed)
    for n in ("captured_correct", "captured_miswired"):
        shutil.copy(os.path.join(demo, f"{n}.safetensors"), os.path.join(mixed, f"{n}.safetensors"))
    ref = os.path.join(demo, "reference.safetensors")
    c.append(Case("32.1", "fingerprint --reference: two declarations in one directory",
                  expect(lambda: cli("doctor", "fingerprint", "--reference", ref, "--captured", mixed),
                         "[0, 1, 4]", "[1, 4, 7]"), {FINDING}))
    return c


def message_cases(demo, tmp, t, pp, resp):
    """32.8: waits that say what they wait for and end, messages that say what they mean."""
    from sweep_bad_inputs import CLEAN, FINDING, OK, Case, cli

    draft = os.path.join(demo, "draft")
    c = []
    empty = os.path.join(tmp, "i32_8_empty")
    os.makedirs(empty)
    c.append(Case("32.8", "online --dump EMPTY_DIR against a server that writes nothing (default --timeout)",
                  with_server(t, lambda url: ("doctor", "online", "--server", url, "--prompts", pp, "--draft", draft,
                                              "--dump", empty, "--new-tokens", N, "--server-args", CHAIN,
                                              "--no-progress", "--device", "cpu", "--threads", 1)),
                  {CLEAN}, ("nothing new was written",)))
    two = os.path.join(tmp, "i32_8_two_runs")
    newer = t.write_dump(two, DECLARED, list(range(L + 1)), run="aaa", declared=DECL)
    older = t.write_dump(two, DECLARED, list(range(L + 1)), run="zzz", declared=DECL, start_seq=100)
    now = time.time()
    for p in older:
        os.utime(p, (now - 100, now - 100))
    for p in newer:
        os.utime(p, (now, now))
    out_json = os.path.join(tmp, "i32_8_accept.json")
    c.append(Case("32.8", "accept --hidden-states: two doctor runs of the same tokens (the newest, with a note)",
                  expect(lambda: cli("doctor", "accept", "--hidden-states", two, "--prompts", pp, "--draft", draft,
                                     "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1,
                                     "--json", out_json), "newest written is used (rid eagle3-doctor-aaa-0"), {OK}))
    other = os.path.join(tmp, "i32_8_other_decl")
    t.write_dump(other, [0, 1, 2], [0, 1, 2], declared=OTHER)
    c.append(Case("32.8", "online without target: the server ran another draft's declaration",
                  expect(lambda: cli("doctor", "online", "--server", resp, "--prompts", pp, "--draft", draft, "--dump",
                                     other, "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads",
                                     1), str(DECL), str(OTHER), "DUMP_STREAM=all"), {FINDING}))
    with open(resp) as f:
        rs = [json.loads(ln) for ln in f]
    rs[1]["output_ids"][2] = 100000
    oov = os.path.join(tmp, "i32_8_oov.jsonl")
    with open(oov, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rs))
    ok_dump = os.path.join(tmp, "i32_8_dump")
    t.write_dump(ok_dump, DECLARED, list(range(L + 1)), declared=DECL)
    c.append(Case("32.8", "online: a recorded answer with a token id outside the vocabulary",
                  lambda: cli("doctor", "online", "--server", oov, "--prompts", pp, "--draft", draft, "--dump",
                              ok_dump, "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1),
                  {CLEAN}, ("outside the target's vocabulary",)))
    return c


__all__ = ["shared_cases", "message_cases"]
