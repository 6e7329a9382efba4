"""Issue 42's kinds for tests/sweep_bad_inputs.py (which imports :func:`cases`), named ``42.<n>`` after the issue's
list: 42.1 misspelt safety settings (SGLang's real load_plugins() in a subprocess, and one real ``sglang.Engine``),
42.2 ``doctor watch``'s readings, 42.3 profile files (the one parser, the plugin's model-load plan, ``watch
--profile``), 42.4 the Prometheus rules (promtool, one case per test group), 42.5 dump contracts, 42.6 the doctor's
request guard (a test-only stand-in server that aborts the case when harmed).

Every case runs whatever ``eagle3_capture`` the sweep's PYTHONPATH names: a checkout of an older commit gives the
"before" counts (the inputs are made by this file and the test helpers; the rules file read is the one beside that
package). A wrong result is ``exit 99`` with what was wrong on its line; ``doctor watch``'s "could not judge" (exit 3)
is its own outcome.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHAIN = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
DECL = ["Embedding", "LayerOutput(0)", "LayerOutput(3)"]
L = 8
N = 6


def _wrong(line):
    return 99, f"wrong result: {line}", ""


def _needs(fn, *needles, absent=()):
    """The case's outcome, or a wrong result when a needle is missing from its output or an absent one is there."""
    def run():
        code, out, err = fn()
        text = out + err
        missing = [n for n in needles if n not in text] + [f"has {a!r}" for a in absent if a in text]
        return (99, out, "wrong result: " + "; ".join(missing)) if missing else (code, out, err)
    return run


# ----------------------------------------------------------------------------------------------------------------
# 42.1 misspelt safety settings
# ----------------------------------------------------------------------------------------------------------------

SETTINGS = [  # (environment, what it must give, a needle of its line)
    ({"EAGLE3_CAPTURE_PROFILE": "{good}", "EAGLE3_CAPTURE_PROFILE_REQ": "1"}, "CLEAN",
     "misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED"),
    ({"EAGLE3_CAPTURE_PROFILE": "{good}", "EAGLE3_CAPTURE_REQUIRED_PROFILE": "1"}, "CLEAN",
     "misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED"),
    ({"EAGLE3_CAPTURE_REQ_PROFILE": "1"}, "CLEAN", "misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED"),
    ({"EAGLE3_CAPTURE_PROF_REQUIRED": "1"}, "CLEAN", "misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED"),
    ({"EAGLE3_CAPTURE_PROFILE_REQUIRE": "1"}, "CLEAN", "misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED"),
    ({"EAGLE3_CAPTURE_TEST_SELF": "raise"}, "CLEAN", "misspelt EAGLE3_CAPTURE_SELFTEST"),
    ({"EAGLE3_CAPTURE_SELF_TST": "raise"}, "CLEAN", "misspelt EAGLE3_CAPTURE_SELFTEST"),
    ({"EAGLE3_CAPTURE_DISABL": "selftest"}, "CLEAN", "misspelt EAGLE3_CAPTURE_DISABLE"),
    ({"eagle3_capture_disable_hooks": "selftest"}, "CLEAN", "misspelt EAGLE3_CAPTURE_DISABLE"),
    ({"EAGLE3_CAPTURE_GATHER": "nccl"}, "CLEAN", "exactly as near to"),
    ({"EAGLE3_CAPTURE_SELFTEST_EVERYY": "5"}, "FINDING", "closest known name: EAGLE3_CAPTURE_SELFTEST_EVERY"),
    ({"EAGLE3_CAPTURE_PROFILE": "{good}", "EAGLE3_CAPTURE_PROFILE_REQUIRED": "1"}, "OK", ""),   # controls
    ({"EAGLE3_CAPTURE_PROFILE": "{good}"}, "OK", ""),
]


def _settings_run(tmp, good):
    """SGLang's real load_plugins() once per environment (tests/plugin/scenarios.py settings), in a subprocess."""
    envs = [{k: v.format(good=good) for k, v in env.items()} for env, _, _ in SETTINGS]
    cpath, opath = os.path.join(tmp, "settings.json"), os.path.join(tmp, "settings_out.json")
    with open(cpath, "w") as f:
        json.dump(envs, f)
    env = {k: v for k, v in os.environ.items() if not k.upper().replace("_", "").startswith("EAGLE3CAPTURE")}
    env["TORCHDYNAMO_DISABLE"] = "1"
    p = subprocess.run([sys.executable, os.path.join(HERE, "plugin", "scenarios.py"), "settings", cpath, opath],
                       env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        return [{"cannot": " ".join(p.stderr.split())[-600:]}] * len(envs)
    with open(opath) as f:
        return json.load(f)


def _setting_case(r):
    def case():
        if "cannot" in r:
            return -2, "", f"the settings scenario failed: {r['cannot']}"
        if r["load"].startswith("eagle3_capture:"):  # the model load stopped: the server does not serve
            return 2, "", "error: " + r["load"]
        if r["errors"]:
            return 1, "\n".join(r["errors"]), ""
        return 0, (r.get("lines") or ["served, no line"])[-1], ""
    return case


def _engine_profile_req(demo, tmp, good):
    """One real sglang.Engine start (tests/engine/serve.py) with EAGLE3_CAPTURE_PROFILE_REQ=1: run when the cases are
    built; the case judges its outcome."""
    from engine_fixtures import BASE_ENV

    with open(os.path.join(demo, "prompts.json")) as f:
        one = os.path.join(tmp, "engine_prompt.json")
        json.dump(json.load(f)[:1], open(one, "w"))
    out = os.path.join(tmp, "engine_typo.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.upper().replace("_", "").startswith("EAGLE3CAPTURE")}
    env.update(BASE_ENV, EAGLE3_CAPTURE_PROFILE=good, EAGLE3_CAPTURE_PROFILE_REQ="1")
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "engine", "serve.py"), "--target",
                            os.path.join(demo, "target"), "--draft", os.path.join(demo, "draft"), "--prompts", one,
                            "--out", out, "--new-tokens", "2", "--context-length", "56"], env=env,
                           capture_output=True, text=True, timeout=900, cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {"log": "", "served": False, "timeout": True}
    served = os.path.exists(out) and "error" not in open(out).read(200)
    return {"log": p.stdout + p.stderr, "served": served, "timeout": False}


def _engine_case(res):
    def case():
        if res["timeout"]:
            return -3, "", "the engine did not start or stop within 900 s"
        refusal = next((ln for ln in res["log"].splitlines() if "eagle3_capture: refusing to serve" in ln), None)
        if res["served"] or refusal is None:
            return _wrong("sglang.Engine served with EAGLE3_CAPTURE_PROFILE_REQ=1 (read as a misspelt PROFILE: no "
                          "alarm required)")
        return 2, "", "error: " + refusal[refusal.index("eagle3_capture:"):]
    return case


def settings_cases(demo, tmp, good):
    from sweep_bad_inputs import CLEAN, FINDING, OK, Case

    want = {"CLEAN": CLEAN, "FINDING": FINDING, "OK": OK}
    results = _settings_run(tmp, good)
    c = []
    for (env, w, needle), r in zip(SETTINGS, results):
        shown = " ".join(f"{k}={v.format(good='good.json')}" for k, v in env.items())
        c.append(Case("42.1", f"load_plugins() with {shown}", _setting_case(r), {want[w]}, (needle,) if needle else ()))
    c.append(Case("42.1", "sglang.Engine with EAGLE3_CAPTURE_PROFILE=good.json EAGLE3_CAPTURE_PROFILE_REQ=1",
                  _engine_case(_engine_profile_req(demo, tmp, good)), {CLEAN},
                  ("misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED",)))
    return c


# ----------------------------------------------------------------------------------------------------------------
# 42.2 doctor watch's readings
# ----------------------------------------------------------------------------------------------------------------

def _pages():
    from metrics_server import Answer, State, page, text_page

    exp = dict(expected=[0.8, 0.7, 0.6], expected_accept_length=2.5)
    full = page(State([30, 30, 30, 30], **exp))
    good = [State([10, 10, 10, 10], **exp), State([20, 20, 20, 20], **exp)]
    bad = {
        "positions 2-3 missing for one reading": text_page(100, [100, None, None], [75, None, None]),
        "a body cut short of its Content-Length at a line boundary":
            Answer(full.split(b"# HELP eagle3_capture:spec_draft_accepted")[0], length=len(full)),
        "100 of 5000 promised bytes": Answer(full[:100], length=5000),
        "accepted > attempts": text_page(200, [200, 150, 100], [250, 100, 50]),
        "accept length 251 with 3 positions": text_page(1, [1, 1, 1], [1, 1, 248]),
        "accepted at position 2 > at position 1": text_page(200, [200, 150, 140], [150, 140, 151]),
        "a duplicated series (doubling verifies/s)": text_page(
            200, [200, 150, 100], [150, 100, 50], extra='eagle3_capture:spec_verifies_total{model_name="m"} 200\n'),
        'position="01"': text_page(200, [200, 150, 100], [150, 100, 50], positions=["01", "2", "3"]),
        'position="1.0"': text_page(200, [200, 150, 100], [150, 100, 50], positions=["1.0", "2", "3"]),
        "an accepted counter down while verifies grew": text_page(81, [81, 61, 41], [61, 41, 5]),
        "headers dripped for ever": Answer(full, drip_headers=True),
        "a body dripped for ever": Answer(full, drip_body=True),
    }
    return good, bad, State([40, 40, 40, 40], **exp), exp


def watch_cases(tmp, profile_path):
    from metrics_server import MetricsServer, State
    from sweep_bad_inputs import CLEAN, FINDING, OK, UNJUDGED, Case, cli

    good, bad, last, exp = _pages()

    def watch(pages, *extra, count=None):
        def run():
            with MetricsServer(pages) as s:
                n = len(pages) - 1 if count is None else count
                return cli("doctor", "watch", "--server", s.url, "--interval", "0.1", "--no-progress", "--count", n,
                           *extra)
        return run

    def no_bad_figure(fn):
        """Exit 0 or 1 with a figure no reading can give (acceptance outside [0, 1], a negative count, an accept
        length over positions + 1) is a wrong result, whatever the exit code."""
        import re

        def run():
            code, out, err = fn()
            for m in re.finditer(r"accept length (-?[0-9.]+) live", out):
                if not 1.0 <= float(m.group(1)) <= 4.0:
                    return _wrong(f"accept length {m.group(1)} shown")
            for m in re.finditer(r"(-?[0-9.]+) \((-?\d+)/(-?\d+)\)", out):
                if not 0.0 <= float(m.group(1)) <= 1.0 or int(m.group(2)) < 0:
                    return _wrong(f"acceptance {m.group(0)} shown")
            return code, out, err
        return run

    c = [Case("42.2", "watch: good readings (must pass)", watch(good + [last]), {OK}),
         Case("42.2", "watch: a restart, counters from 0 (must pass, noted)",
              _needs(watch(good + [State([1, 2, 3, 4], **exp), State([2, 3, 4, 5], **exp)]), "RESTART"), {OK})]
    for what, b in bad.items():
        for extra, tag in (((), ""), (("--profile", profile_path), " with --profile")):
            c.append(Case("42.2", f"watch{tag}: {what}, mid-watch", no_bad_figure(watch(good + [b, last], *extra)),
                          {UNJUDGED}))
        if what not in ("positions 2-3 missing for one reading", "an accepted counter down while verifies grew"):
            c.append(Case("42.2", f"watch: {what}, first reading", watch([b], count=1), {CLEAN}))
    drift = [State([10, 10, 10, 10], alarm=[0, 0, 0], drift=[0, 0, 0], **exp),
             State([20, 20, 20, 20], alarm=[0, 0, 0], drift=[0, 1e308, 0], **exp)]
    c.append(Case("42.2", "watch: a drift of 1e308 with the alarm gauge at 0", watch(drift), {FINDING}))
    return c


# ----------------------------------------------------------------------------------------------------------------
# 42.3 profile files
# ----------------------------------------------------------------------------------------------------------------

def _bad_profiles(tmp):
    from eagle3_capture.acceptance import profile as P

    good = P.make("doctor accept", P.Speculative(3, 1, 4), [100, 200, 300, 400], 8).to_json()

    def edited(row, key, value):
        d = json.loads(json.dumps(good))
        d["positions"][row][key] = value
        return json.dumps(d)

    bodies = {
        "nested 200000 deep": "[" * 200000,
        "an object nested 50000 deep": '{"a": ' * 50000 + "1" + "}" * 50000,
        "a 5000-digit integer": json.dumps(good).replace('"prompts": 8', '"prompts": ' + "9" * 5000),
        "a number 1e999": json.dumps(good).replace('"prompts": 8', '"prompts": 1e999'),
        "positions[0].acceptance 1.5": edited(0, "acceptance", 1.5),
        "positions[1].acceptance -0.25": edited(1, "acceptance", -0.25),
        "positions[2].acceptance 0.9, not accepted / attempts": edited(2, "acceptance", 0.9),
        "positions[0].attempts 1000.0 (a float)": edited(0, "attempts", 1000.0),
    }
    paths = {}
    for i, (what, body) in enumerate(bodies.items()):
        p = os.path.join(tmp, f"profile_{i}.json")
        with open(p, "w") as f:
            f.write(body)
        paths[what] = p
    g = os.path.join(tmp, "profile_good.json")
    with open(g, "w") as f:
        json.dump(good, f)
    return paths, g


def _read(path):
    """profile.read: one ProfileError line naming the file, or the profile; anything else propagates."""
    def run():
        from eagle3_capture.acceptance import profile as P

        try:
            P.read(path)
        except P.ProfileError as e:
            return 2, "", f"error: {' '.join(str(e).split())}"
        return 0, f"read {path}", ""
    return run


def _plan(path):
    """The plugin's model-load plan with this profile (counting rank, the profile's flags): one ERROR line naming
    the file with counting on is the promised outcome (a finding); a usable alarm from it is a wrong result."""
    def run():
        from types import SimpleNamespace

        from eagle3_capture.sglang.monitor import live
        from eagle3_capture.sglang.settings.alarm import AlarmSettings

        args = SimpleNamespace(enable_metrics=False, served_model_name="m", model_path="m",
                               speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=1,
                               speculative_num_draft_tokens=4)
        p = live.plan(args, AlarmSettings(profile=path), (True, "attention-TP rank 0"))
        if p.monitor is not None:
            return 0, f"alarm on from {path}", ""
        if not p.counting:
            return _wrong(f"counting off: {p.line}")
        if len(p.errors) != 1 or path not in p.errors[0]:
            return _wrong(f"the ERROR line does not name the file: {p.errors}")
        return 1, p.errors[0], ""
    return run


def profile_cases(tmp, server_pages):
    from metrics_server import MetricsServer
    from sweep_bad_inputs import CLEAN, FINDING, OK, Case, cli

    paths, good = _bad_profiles(tmp)

    def watch(path):
        def run():
            with MetricsServer(server_pages) as s:
                return cli("doctor", "watch", "--server", s.url, "--interval", "0.1", "--no-progress", "--count", 1,
                           "--profile", path)
        return run

    c = [Case("42.3", "profile.read: a good profile (must pass)", _read(good), {OK}),
         Case("42.3", "plugin model-load plan: a good profile (must pass)", _plan(good), {OK}),
         Case("42.3", "watch --profile ''", watch(""), {CLEAN}, ("empty path",))]
    for what, p in paths.items():
        c.append(Case("42.3", f"profile.read: {what}", _read(p), {CLEAN}, (p,)))
        c.append(Case("42.3", f"plugin model-load plan: {what}", _plan(p), {FINDING}, (p,)))
        c.append(Case("42.3", f"watch --profile: {what}", watch(p), {CLEAN}, ("--profile",)))
    return c


# ----------------------------------------------------------------------------------------------------------------
# 42.4 the Prometheus rules
# ----------------------------------------------------------------------------------------------------------------

def _rules_under_test() -> str:
    import eagle3_capture

    return os.path.abspath(os.path.join(os.path.dirname(eagle3_capture.__file__), "..", "..", "monitoring",
                                        "prometheus", "eagle3_capture.rules.yml"))


def rule_cases(tmp):
    """One case per test group of monitoring/prometheus/tests/{both_name_forms, impossible_counts,
    metrics_absent_alert}.yml (this checkout's tests), run by promtool against the rules beside the package under
    test; the groups of recording.yml stand for the rules that must keep passing."""
    import shutil

    import yaml

    from sweep_bad_inputs import OK, Case

    tests = os.path.join(os.path.dirname(HERE), "monitoring", "prometheus", "tests")
    rules = _rules_under_test()
    promtool = shutil.which("promtool")
    c = []
    for name, what in (("both_name_forms.yml", "both name forms in one window"),
                       ("impossible_counts.yml", "impossible counts"),
                       ("metrics_absent_alert.yml", "the plugin's series absent under SGLang's traffic"),
                       ("recording.yml", "recording rules on known traffic (must pass)")):
        with open(os.path.join(tests, name)) as f:
            doc = yaml.safe_load(f)
        for i, group in enumerate(doc["tests"]):
            path = os.path.join(tmp, f"{name[:-4]}_{i}.yml")
            with open(path, "w") as f:
                yaml.safe_dump({**doc, "rule_files": [rules], "tests": [group]}, f)

            def run(path=path):
                if promtool is None:
                    return 2, "", "error: promtool is not on PATH (bash scripts/ensure_prometheus.sh)"
                p = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True, timeout=120)
                if p.returncode == 0:
                    return 0, "promtool: SUCCESS", ""
                first = next((ln.strip() for ln in (p.stdout + p.stderr).splitlines()
                              if "err" in ln.lower() or "exp:" in ln), "FAILED")
                return _wrong(f"promtool: {first[:300]}")
            c.append(Case("42.4", f"promtool: {what}, group {i + 1}", run, {OK}))
    return c


# ----------------------------------------------------------------------------------------------------------------
# 42.5 dump contracts
# ----------------------------------------------------------------------------------------------------------------

def _teacher_forced(demo, tmp):
    from dump_helpers import teacher_forced_from_demo

    return teacher_forced_from_demo(demo, tmp, 2, N, "i42")


def _edit_records(d, fn):
    from dump_helpers import edit_records

    return edit_records(d, fn)


def dump_cases(demo, tmp, t, pp, resp):
    from sweep_bad_inputs import CLEAN, FINDING, OK, Case, cli
    from dump_helpers import write_checkpoint

    draft = os.path.join(demo, "draft")
    full = list(range(L + 1))
    v3 = "eagle3-capture-dump/3"

    def replicas(name, miswired_ltc, holds=None, version3=True):
        d = os.path.join(tmp, f"i42_5_{name}")
        who = (lambda s: dict(format=v3, server=s, host="node")) if version3 else (lambda s: {})
        t.write_dump(d, [0, 1, 4], full, run="replica-a", declared=DECL, pid=6, **who("a" * 16))
        t.write_dump(d, miswired_ltc, full, run="replica-a", declared=DECL, pid=6, start_seq=50, holds=holds,
                     **who("b" * 16))
        return d

    def dump(name, edit=None, **override):
        d = os.path.join(tmp, f"i42_5_{name}")
        t.write_dump(d, [0, 1, 4], full, **{"declared": DECL, **override})
        return _edit_records(d, edit) if edit else d

    def fingerprint(d, *extra):
        return lambda: cli("doctor", "fingerprint", "--captured", d, *extra)

    def online(d):
        return lambda: cli("doctor", "online", "--server", resp, "--prompts", pp, "--draft", draft, "--dump", d,
                           "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)

    def accept(d):
        return lambda: cli("doctor", "accept", "--hidden-states", d, "--prompts", pp, "--draft", draft,
                           "--server-args", CHAIN, "--no-progress", "--device", "cpu", "--threads", 1)

    verdict = "every served slot holds the declared tap"
    c = [Case("42.5", "fingerprint --captured: one server's records (must pass)", fingerprint(dump("ok")), {OK}),
         Case("42.5", "online --dump: one server's records (must pass)", online(dump("ok_online")), {OK})]
    mis = replicas("mis", [0, 2, 5])
    hidden = replicas("hidden", [0, 1, 4], holds=[1, 2, 5])
    what = "a miswired replica reusing the correct one's rids (its own labels)"
    c.append(Case("42.5", f"fingerprint --captured: {what}", _needs(fingerprint(mis), "2 declarations", "[0, 2, 5]"),
                  {FINDING}))
    c.append(Case("42.5", f"online --dump: {what}", _needs(online(mis), "capture differently", "[0, 2, 5]"),
                  {FINDING}))
    what = "a miswired replica reusing the rids, labelled as declared"
    c.append(Case("42.5", f"fingerprint --captured: {what}", _needs(fingerprint(hidden), absent=(verdict,)),
                  {FINDING}))
    c.append(Case("42.5", f"online --dump: {what}", _needs(online(hidden), absent=(verdict,)), {FINDING}))
    v2 = replicas("v2", [0, 2, 5], version3=False)
    c.append(Case("42.5", "fingerprint --captured: version-2 replicas sharing a pid and rids", fingerprint(v2),
                  {CLEAN}, ("disagree at position",)))
    c.append(Case("42.5", "accept --hidden-states: version-2 replicas sharing a pid and rids", accept(v2), {CLEAN},
                  ("disagree at position",)))
    for what, decl, ids in (("declared 2 of 3 taps", DECL[:2], [-1, 0]),
                            ("declared 4 taps for 3 slots", DECL + ["LayerOutput(5)"], [-1, 0, 3, 5]),
                            ("declared LayerOutput(99) on 8 layers", ["Embedding", "LayerOutput(0)", "LayerOutput(99)"],
                             [-1, 0, 99])):
        d = dump(what.replace(" ", "_"), declared=decl, draft_ids=ids)
        c.append(Case("42.5", f"fingerprint --captured: {what}", fingerprint(d), {CLEAN}, ("declared",)))
        c.append(Case("42.5", f"online --dump: {what}", online(dump(what.replace(" ", "_") + "_o", declared=decl,
                                                                      draft_ids=ids)), {CLEAN}, ("declared",)))

    corrupt = dump("corrupt")
    for name in sorted(os.listdir(corrupt))[:1]:  # one bit of the stream's bytes, after the record was written
        import torch

        p = os.path.join(corrupt, name)
        rec = torch.load(p)
        data = bytearray(open(p, "rb").read())
        at = data.find(rec["stream"][3, 2].numpy().tobytes()[:16])
        data[at + 3] ^= 0x10
        open(p, "wb").write(bytes(data))
    c.append(Case("42.5", "fingerprint --captured: one bit of a record's stream flipped on disk", fingerprint(corrupt),
                  {CLEAN}, ("CRC-32",)))
    c.append(Case("42.5", "online --dump: one bit of a record's stream flipped on disk", online(corrupt), {CLEAN},
                  ("CRC-32",)))
    conflict = dump("conflict", edit=lambda i, rec: rec["input_ids"].add_(1) if i == 1 else None, per_record=1,
                    chunk=5)
    # the second record also claims the first one's positions: two records, one token, two values
    _edit_records(conflict, lambda i, rec: rec["positions"].sub_(5) if i == 1 else None)
    c.append(Case("42.5", "accept --hidden-states: two records giving one position two tokens", accept(conflict),
                  {CLEAN}, ("disagree at position",), ))
    m = t.side.target.model
    cfg = dict(t.side.target.config_dict)
    cfg.pop("vocab_size", None)
    ck = write_checkpoint(os.path.join(tmp, "i42_5_ck"), {"model.embed_tokens.weight":
                                                          m.get_input_embeddings().weight.detach()}, cfg)
    for token, what, needle in ((10 ** 6, "dumped ids of 10^6", "outside the vocabulary of --target-checkpoint"),
                                (-5, "negative dumped ids", "is negative")):
        d = dump(f"ids_{token}", edit=lambda i, rec, tok=token: rec["input_ids"].__setitem__(3, tok) if i == 0
                 else None)
        c.append(Case("42.5", f"fingerprint --captured --target-checkpoint: {what}",
                      fingerprint(d, "--target-checkpoint", ck), {CLEAN}, (needle,)))
    return c


# ----------------------------------------------------------------------------------------------------------------
# 42.6 the request guard
# ----------------------------------------------------------------------------------------------------------------

def guard_cases(demo, tmp, t, pp):
    import torch

    from dump_helpers import write_checkpoint, write_training
    from sweep_bad_inputs import CLEAN, OK, Case
    from sweep_issue32_doctor import with_server

    draft = os.path.join(demo, "draft")
    configs = ("--draft-config", os.path.join(draft, "config.json"), "--target-config",
               os.path.join(demo, "target", "config.json"))
    data = os.path.join(tmp, "i42_6_training")
    write_training(data, [s.clone() for s in t.sent], t.stack, [0, 1, 4], dtype=torch.float32)

    def dump_dir(name):
        d = os.path.join(tmp, f"i42_6_dump_{name}")
        os.makedirs(d, exist_ok=True)
        return d

    def fp(name):
        return lambda url: ("doctor", "fingerprint", "--training-data", data, "--server", url, "--captured",
                            dump_dir(name), "--timeout", 20, *configs)

    def online(name, *extra):
        return lambda url: ("doctor", "online", "--server", url, "--prompts", pp, "--draft", draft, "--dump",
                            dump_dir(name), "--new-tokens", N, "--server-args", CHAIN, "--no-progress", "--device",
                            "cpu", "--threads", 1, "--timeout", 20, *extra)

    cfg = json.load(open(os.path.join(demo, "target", "config.json")))
    cfg["vocab_size"] = 300
    ck = write_checkpoint(os.path.join(tmp, "i42_6_ck300"),
                          {"model.embed_tokens.weight": t.side.target.model.get_input_embeddings().weight.detach()},
                          cfg, shards=1)
    c = [Case("42.6", "fingerprint --server: every source agrees (must pass)",
              with_server(t, fp("ok"), dump_dir=dump_dir("ok"), declared=DECL), {OK})]
    for served in (128, 512):
        c.append(Case("42.6", f"fingerprint --server: --target-config says 256, the server serves {served}",
                      with_server(t, fp(f"v{served}"), dump_dir=dump_dir(f"v{served}"), vocab=served), {CLEAN},
                      ("nothing sent",)))
        c.append(Case("42.6", f"online: the target's config says 256, the server serves {served}",
                      with_server(t, online(f"o{served}"), dump_dir=dump_dir(f"o{served}"), vocab=served), {CLEAN},
                      ("nothing sent",)))
    c.append(Case("42.6", "online: --target-checkpoint says 300, the draft's config 256",
                  with_server(t, online("ck300", "--target-checkpoint", ck), dump_dir=dump_dir("ck300")), {CLEAN},
                  ("not agreed",)))
    c.append(Case("42.6", "online: ids outside the vocabulary in the teacher-forced input_top_logprobs",
                  _needs(with_server(t, online("top"), dump_dir=dump_dir("top"), top_offset=1000),
                         absent=("sampling, dtype",)), {CLEAN}, ("input_top_logprobs",)))
    return c


# ----------------------------------------------------------------------------------------------------------------

def cases(demo, tmp, only=None):
    """The issue-42 cases of the kinds in `only` (e.g. {"42.2"}; None or {"42"}: all), for tests/sweep_bad_inputs.py;
    only the kinds asked for are built (42.1 starts SGLang: minutes)."""
    from eagle3_capture.acceptance import profile as P

    def wanted(kind):
        return not only or "42" in only or kind in only

    for sub in ("k1", "k3", "k4"):
        os.makedirs(os.path.join(tmp, sub), exist_ok=True)
    good = P.write(P.make("doctor accept", P.Speculative(3, 1, 4), [100, 200, 300, 400], 8),
                   os.path.join(tmp, "good_profile.json"))
    c = []
    if wanted("42.1"):
        c += settings_cases(demo, os.path.join(tmp, "k1"), good)
    if wanted("42.2"):
        c += watch_cases(tmp, good)
    if wanted("42.3"):
        c += profile_cases(os.path.join(tmp, "k3"), _pages()[0])
    if wanted("42.4"):
        c += rule_cases(os.path.join(tmp, "k4"))
    if wanted("42.5") or wanted("42.6"):
        t, pp, resp = _teacher_forced(demo, tmp)
        if wanted("42.5"):
            c += dump_cases(demo, tmp, t, pp, resp)
        if wanted("42.6"):
            c += guard_cases(demo, tmp, t, pp)
    return c


__all__ = ["cases"]
