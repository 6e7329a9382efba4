"""Issue 32's plugin-side kinds for tests/sweep_bad_inputs.py (which imports :func:`plugin_cases`), named ``32.<n>``
after the issue's list (the sweep's own kinds are issue 25's):

- 32.1 two servers sharing one dump directory: two server-like replicas (tests/plugin/replica_server.py: SGLang's
  real ModelRunner.forward on the CPU, the plugin loaded by load_plugins(), its real dump writer), each in its own
  PID namespace (``unshare --pid --fork --mount-proc``: both are pid 1), with two capture declarations, at once
  into one directory that already holds another server's record. No record may be lost or replaced, and the dump
  format's reader must name both declarations.
- 32.6 misspelt settings: SGLang's real load_plugins() under each setting (tests/plugin/scenarios.py ``settings``):
  a misspelt guard (SELFTEST, DISABLE) must stop the model load with one line (a clean error), another misspelt
  name must give one ERROR line naming the closest known name (a finding), ``DISABLE=all`` with a dump must register
  nothing and create no directory.

A wrong result is ``exit 99`` with what was wrong on its line (the sweep shows a case's last line of output).
Both run subprocesses against whatever ``eagle3_capture`` the sweep's PYTHONPATH names (a checkout of an older
commit gives the "before" counts). The subprocesses run once, when the cases are built; each case then judges their
outcome in the sweep's forked child. Where PID namespaces cannot be made (not root, no unshare), every 32.1 case is a
clean error saying why (so it counts as not as it must, never as passed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SGLANG_TESTS = os.path.join(HERE, "plugin")  # bootstrap (a script, run outside pytest): replicas.py
REQUESTS, DECODES = 3, 2
GOOD, MISWIRED = "-1,1,3,5", "1,2,3"   # the two replicas' draft ids: two capture declarations
STALE = "eagle3_capture_pid1_tp0_000000.pt"  # another server's record, named as a pid-1 server named them
STALE_BYTES = b"another server's record: must never be replaced"


def _replicas(tmp):
    """Run both replicas once: what the directory holds afterwards (or why they could not run)."""
    if SGLANG_TESTS not in sys.path:
        sys.path.insert(0, SGLANG_TESTS)
    from replicas import run_replicas, unshare_problem

    why = unshare_problem()
    if why is not None:
        return {"cannot": why}
    d = os.path.join(tmp, "shared")
    os.makedirs(d)
    with open(os.path.join(d, STALE), "wb") as f:
        f.write(STALE_BYTES)
    try:
        reps = run_replicas(d, os.path.join(tmp, "work"), [(GOOD, REQUESTS), (MISWIRED, REQUESTS)], DECODES)
    except AssertionError as e:
        return {"cannot": " ".join(str(e).split())[-600:]}
    return {"dir": d, "replicas": reps}


def _records(run):
    """(records read from the replicas' files, files the replicas left, the stale file's bytes now)."""
    from eagle3_capture.dump_format import load_record

    d = run["dir"]
    files = sorted(f for f in os.listdir(d) if f.endswith(".pt") and f != STALE)
    with open(os.path.join(d, STALE), "rb") as f:
        stale = f.read()
    return [load_record(os.path.join(d, f)) for f in files], files, stale


def _no_record_lost(run):
    def case():
        if "cannot" in run:
            return 2, "", f"error: the replicas could not run: {run['cannot']}"
        recs, files, _ = _records(run)
        reps = run["replicas"]
        # the plugin's own count; the plugin before issue 32 had none: then the forwards it served (one record each)
        written = sum(r["written"] if r["written"] is not None else r["forwards"] for r in reps)
        per = {r["ids"]: sum(1 for x in recs if x.requests and x.requests[0].rid in r["rids"]) for r in reps}
        line = (f"records written {written}, found {len(recs)} ({per}; pids {[r['pid'] for r in reps]}, separate PID "
                "namespaces)")
        if len(recs) != written or any(v != REQUESTS * (1 + DECODES) for v in per.values()):
            return 99, f"wrong result: records lost: {line}", ""
        return 0, line, ""
    return case


def _nothing_replaced(run):
    def case():
        if "cannot" in run:
            return 2, "", f"error: the replicas could not run: {run['cannot']}"
        _, _, stale = _records(run)
        if stale != STALE_BYTES:
            return 99, f"wrong result: {STALE}, another server's record, was replaced ({len(stale)} bytes now)", ""
        return 0, f"{STALE} left as it was", ""
    return case


def _declarations_named(run):
    def case():
        if "cannot" in run:
            return 2, "", f"error: the replicas could not run: {run['cannot']}"
        recs, _, _ = _records(run)
        try:
            from eagle3_capture.dump_format import inventory
        except ImportError:
            return 0, (f"{len(recs)} records read, nothing names their capture declarations or servers (the dump "
                       "format has no inventory)"), ""
        line = inventory(recs).mixed()
        return (1, line, "") if line else (0, "one capture declaration (none named)", "")
    return case


# (settings, what it must give, needle in the outcome's line)
SETTINGS = [
    ({"EAGLE3_CAPTURE_SELFTST": "raise"}, "CLEAN", "EAGLE3_CAPTURE_SELFTEST"),
    ({"eagle3_capture_selftest": "raise"}, "CLEAN", "EAGLE3_CAPTURE_SELFTEST"),
    ({"EAGLE3_CAPTURE_DISABLED": "all"}, "CLEAN", "EAGLE3_CAPTURE_DISABLE"),
    ({"EAGLE3_CAPTURE_DISBALE": "selftest"}, "CLEAN", "EAGLE3_CAPTURE_DISABLE"),
    ({"EAGLE3CAPTURE_DISABLE": "taps"}, "CLEAN", "EAGLE3_CAPTURE_DISABLE"),
    ({"EAGLE3_CAPTURE_DUMPDIR": "{tmp}/typo"}, "FINDING", "closest known name: EAGLE3_CAPTURE_DUMP"),
    ({"EAGLE3_CAPTURE_DUMP_DIR": "{tmp}/typo2", "EAGLE3_CAPTURE_DUMP": "{tmp}/ok2"}, "FINDING",
     "closest known name: EAGLE3_CAPTURE_DUMP"),
    ({"EAGLE3_CAPTURE_GATHER_BACKEN": "nccl"}, "FINDING", "closest known name: EAGLE3_CAPTURE_GATHER_BACKEND"),
    ({"EAGLE3_CAPTURE_DISABLE": "all", "EAGLE3_CAPTURE_DUMP": "{tmp}/off"}, "OK", "is not used either"),
    ({}, "OK", ""),                                                       # controls: must still serve
    ({"EAGLE3_CAPTURE_DUMP": "{tmp}/ok"}, "OK", ""),
]


def _settings(tmp):
    cases = [{k: v.format(tmp=tmp) for k, v in env.items()} for env, _, _ in SETTINGS]
    cpath, opath = os.path.join(tmp, "settings.json"), os.path.join(tmp, "settings_out.json")
    with open(cpath, "w") as f:
        json.dump(cases, f)
    env = {k: v for k, v in os.environ.items() if not k.upper().replace("_", "").startswith("EAGLE3CAPTURE")}
    env["TORCHDYNAMO_DISABLE"] = "1"
    p = subprocess.run([sys.executable, os.path.join(SGLANG_TESTS, "scenarios.py"), "settings", cpath, opath],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return [{"cannot": " ".join(p.stderr.split())[-600:]}] * len(cases)
    with open(opath) as f:
        return json.load(f)


def _setting_case(r, env):
    def case():
        if "cannot" in r:
            return -2, "", f"the settings scenario failed: {r['cannot']}"
        if r["load"].startswith("eagle3_capture:"):      # the model load stopped: the server does not serve
            return 2, "", "error: " + r["load"]
        dump_dir = env.get("EAGLE3_CAPTURE_DUMP")
        if env.get("EAGLE3_CAPTURE_DISABLE") == "all" and (r["registered"] or (dump_dir and os.path.exists(dump_dir))):
            return 99, (f"wrong result: EAGLE3_CAPTURE_DISABLE=all registered {r['registered']}, dump directory "
                        f"created: {bool(dump_dir and os.path.exists(dump_dir))}"), ""
        if r["errors"]:
            return 1, "\n".join(r["errors"]), ""
        return 0, (r.get("lines") or ["served, no line"])[-1], ""
    return case


def plugin_cases(tmp):
    from sweep_bad_inputs import CLEAN, FINDING, OK, Case

    os.makedirs(tmp, exist_ok=True)
    want = {"CLEAN": CLEAN, "FINDING": FINDING, "OK": OK}
    k1 = os.path.join(tmp, "k1")
    os.makedirs(k1)
    run = _replicas(k1)
    c = [Case("32.1", "two replicas (pid 1 each, separate PID namespaces), one directory: no record lost",
              _no_record_lost(run), {OK}, ("records written",)),
         Case("32.1", "a record file already in the shared directory (a pid-1 name) is never replaced",
              _nothing_replaced(run), {OK}),
         Case("32.1", "two capture declarations in one directory: the dump format's reader names both",
              _declarations_named(run), {FINDING}, ("2 capture declarations", GOOD.replace(",", ", ")))]
    k6 = os.path.join(tmp, "k6")
    os.makedirs(k6)
    results = _settings(k6)
    for (env, w, needle), r in zip(SETTINGS, results):
        shown = " ".join(f"{k}={v.format(tmp='TMP')}" for k, v in env.items()) or "no setting"
        c.append(Case("32.6", f"load_plugins() with {shown}", _setting_case(r, {k: v.format(tmp=k6)
                                                                                  for k, v in env.items()}),
                      {want[w]}, (needle,) if needle else ()))
    return c


__all__ = ["plugin_cases"]
