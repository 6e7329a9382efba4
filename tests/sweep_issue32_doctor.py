"""Issue 32's doctor-side kinds for tests/sweep_bad_inputs.py (which imports :func:`doctor_cases`): bad data rows,
draft weights that are not what they seem, paths that leave their directory, requests that could harm the server,
MLA draft configs, and the waits and messages of `doctor online` on a dump. Kinds are named ``32.<n>`` after the
issue's list (the sweep's own kinds are issue 25's).

Each case states what it must give, as the sweep's cases do; a case that must name something anywhere in the
output (not only on its last line) is wrapped by :func:`expect`, which turns a run that lacks it into ``exit 99``
(a wrong result). A case talking to a server starts a test-only stand-in (tests/doctor/fake_sglang.py) in its own
forked child; a request the stand-in counts as harmful makes the child abort, reported as a crash (what SGLang's
scheduler does on a token id outside the vocabulary).
"""
from __future__ import annotations

import json
import os
import signal
import shutil

CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
N = 6                  # new tokens of the teacher-forced requests
DECLARED = [0, 1, 4]   # the demo draft's taps as layer inputs
L = 8


def expect(fn, *needles, absent=()):
    """The case's (code, out, err), or exit 99 when a needle is missing from out + err or an absent one is there."""
    def run():
        code, out, err = fn()
        text = out + err
        if any(n not in text for n in needles) or any(a in text for a in absent):
            return 99, out, "wrong result: " + " ".join(
                [f"missing {n!r}" for n in needles if n not in text] + [f"has {a!r}" for a in absent if a in text])
        return code, out, err
    return run


def with_server(tf, make_args, **fake):
    """Run the doctor against a FakeSGLang (started here, in the forked child); abort if the doctor harmed it."""
    def run():
        from fake_sglang import FakeSGLang
        from sweep_bad_inputs import cli

        with FakeSGLang(tf, **fake) as srv:
            code, out, err = cli(*make_args(srv.url))
        if srv.harm:
            os.kill(os.getpid(), signal.SIGABRT)  # the server died: the sweep reports a crash
        return code, out, err
    return run


def _teacher_forced(demo, tmp):
    from dump_helpers import teacher_forced_from_demo

    return teacher_forced_from_demo(demo, tmp, 3, N, "i32")


def _edit_records(d, fn):
    from dump_helpers import edit_records

    return edit_records(d, fn)


def data_cases(demo, tmp, t, pp, resp):
    """32.2: NaN / Inf / all-zero rows are never a verdict."""
    import torch

    from sweep_bad_inputs import CLEAN, FINDING, OK, Case, cli
    from dump_helpers import write_training

    draft = os.path.join(demo, "draft")
    full = list(range(L + 1))
    decl = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]

    def dump(name, served=DECLARED, stream=full, edit=None):
        d = os.path.join(tmp, f"i32_2_{name}")
        t.write_dump(d, served, stream, declared=decl)
        return _edit_records(d, edit) if edit else d

    def rows(key, value, which=slice(2, 5), cols=None):
        def edit(i, rec):
            if i == 0:
                x = rec[key]
                if key == "aux":
                    x[which, cols if cols is not None else slice(None)] = value
                else:
                    x[cols if cols is not None else slice(None), which] = value
        return edit

    def fingerprint(d, *extra):
        return lambda: cli("doctor", "fingerprint", "--captured", d, *extra)

    def online(d, *extra):
        return lambda: cli("doctor", "online", "--server", resp, "--prompts", pp, "--draft", draft, "--dump", d,
                           "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1, *extra)

    def accept(d):
        return lambda: cli("doctor", "accept", "--hidden-states", d, "--prompts", pp, "--draft", draft,
                           "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)

    c = []
    verdicts = ("every served slot holds the declared tap", "verdict: matches", "capture or draft-side mismatch",
                "the server's draft or flags", "does NOT capture what training used")
    nan, inf = float("nan"), float("inf")
    c.append(Case("32.2", "fingerprint, no reference: a clean full-stream dump (must pass)",
                  fingerprint(dump("ok")), {OK}))
    for what, key, value, cols in (("3 NaN rows in the served slots", "aux", nan, None),
                                   ("3 Inf rows in served slot 1", "aux", inf, slice(64, 128)),
                                   ("3 all-zero rows in the served slots", "aux", 0.0, None),
                                   ("3 NaN rows in the stream at every layer", "stream", nan, None),
                                   ("3 NaN rows in the stream at an undeclared layer", "stream", nan, [6])):
        d = dump(what.replace(" ", "_"), edit=rows(key, value, cols=cols))
        c.append(Case("32.2", f"fingerprint, no reference: {what}", expect(fingerprint(d), "3 ", "rows",
                                                                            absent=verdicts), {FINDING}))
        c.append(Case("32.2", f"online --dump: {what}", expect(online(d), "rows", absent=verdicts), {FINDING}))
    d = dump("all_nan_stream", edit=lambda i, rec: rec["stream"].fill_(nan))
    c.append(Case("32.2", "fingerprint, no reference: every stream row NaN", fingerprint(d), {CLEAN}, ("NaN",)))
    c.append(Case("32.2", "online --dump: every stream row NaN", online(d), {CLEAN}, ("NaN",)))
    d = dump("zero_stream", edit=lambda i, rec: rec["stream"].zero_())
    c.append(Case("32.2", "accept --hidden-states: an all-zero stream", accept(d), {CLEAN}, ("zero",)))
    d = dump("nan_stream_rows", edit=rows("stream", nan, cols=DECLARED))
    c.append(Case("32.2", "accept --hidden-states: NaN rows in the declared layers' stream",
                  expect(accept(d), "NaN", "left out"), {FINDING}))
    c.append(Case("32.2", "accept --hidden-states: a clean dump (must pass)", accept(dump("ok_accept")), {OK}))
    # training data
    tr = os.path.join(tmp, "i32_2_train_ok")
    write_training(tr, t.sent, t.stack, DECLARED, dtype=torch.float32)
    srv = dump("for_training")

    def training(d):
        return lambda: cli("doctor", "fingerprint", "--training-data", d, "--captured", srv)

    c.append(Case("32.2", "training data: clean (must pass)", training(tr), {OK}))
    for what, value, all_rows in (("3 NaN rows", nan, False), ("3 all-zero rows", 0.0, False),
                                  ("every row NaN", nan, True)):
        d = os.path.join(tmp, f"i32_2_train_{what.replace(' ', '_')}")
        stacks = [s.clone() for s in t.stack]
        if all_rows:
            for s in stacks:
                s[:] = value
        else:
            stacks[0][2:5] = value
        write_training(d, t.sent, stacks, DECLARED, dtype=torch.float32)
        if all_rows:
            c.append(Case("32.2", f"training data: {what}", training(d), {CLEAN}, ("NaN",)))
        else:
            c.append(Case("32.2", f"training data: {what}", expect(training(d), "3 ", "rows", absent=verdicts),
                          {FINDING}))
    return c


def doctor_cases(demo, tmp):
    """Every issue-32 doctor case, for tests/sweep_bad_inputs.py."""
    os.makedirs(tmp, exist_ok=True)
    t, pp, resp = _teacher_forced(demo, tmp)
    cases = []
    from sweep_issue32_inputs import draft_cases, request_cases
    from sweep_issue32_messages import message_cases, shared_cases

    for build in (shared_cases, data_cases, draft_cases, request_cases, message_cases):
        cases += build(demo, tmp, t, pp, resp)
    return cases


__all__ = ["doctor_cases", "expect", "with_server"]
