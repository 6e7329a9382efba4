"""Per-position acceptance counted in the plugin (group ``acceptance``), exported through SGLang's /metrics, and the
drift alarm, on SGLang's real ``Req`` (its real ``update_spec_correct_drafts_histogram``, hooked through SGLang's own
load_plugins()):

- the export in two fresh processes sharing a PROMETHEUS_MULTIPROC_DIR, attention-TP ranks 0 and 1 of one server:
  rank 0 counts, rank 1 does not, and prometheus_client's MultiProcessCollector (SGLang's /metrics) reads exactly
  the sum of the requests' histograms, for hypothesis-drawn batches (acceptance_worker.py);
- the alarm: a drop fires within the CUSUM's number of verifies and names the position, once per episode; in-control
  traffic never fires it;
- every bad setting and every bad profile is one line (fuzzed), and a required profile that cannot be used refuses
  at model load.
"""
import json
import math
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sglang_fixtures import harness, require_sglang, sglang_plugin  # noqa: F401  (fixtures)
from acceptance_sim import simulated_verify

pytestmark = pytest.mark.sglang

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3


def _server_args(**kw):
    base = dict(enable_metrics=False, served_model_name="m", model_path="/models/m", speculative_algorithm="EAGLE3",
                speculative_num_steps=STEPS, speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1)
    base.update(kw)
    return SimpleNamespace(**base)


def _profile(tmp_path, histogram=(100, 200, 300, 400), steps=STEPS, name="profile.json"):
    from eagle3_capture.acceptance import profile

    p = profile.make("doctor accept", profile.Speculative(steps, 1, steps + 1), list(histogram), 8)
    return profile.write(p, str(tmp_path / name)), p


@pytest.fixture
def lines(monkeypatch):
    """The plugin's promised lines, kept instead of logged."""
    from eagle3_capture.sglang.settings import switches

    kept = []
    monkeypatch.setattr(switches, "announce", lambda level, msg: kept.append((level, msg)))
    return kept


@pytest.fixture
def counting(sglang_plugin):
    """Counting in this process, from a clean histogram; stopped after."""
    from eagle3_capture.sglang.monitor import histogram as acceptance_count, live as acceptance_live

    acceptance_live.stop()
    acceptance_count.reset()
    yield acceptance_live
    acceptance_live.stop()
    acceptance_count.reset()


def _req(i=0):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(f"r{i}", "", [1, 2, 3], SamplingParams(max_new_tokens=8))


# ----------------------------------------------------------------------------------------------------------------
# the hook and the export
# ----------------------------------------------------------------------------------------------------------------

def test_the_hook_is_in_place_on_sglangs_req(sglang_plugin):
    from sglang.srt.managers.schedule_batch import Req

    from eagle3_capture.sglang.monitor import histogram as acceptance_count
    from eagle3_capture.sglang.installed import internals
    from eagle3_capture.sglang.settings import switches
    from eagle3_capture.sglang.installed.hook_chain import hook_in_place

    assert internals.current().acceptance_path == internals.ACCEPTANCE_HISTOGRAM_PATH
    assert switches.ACCEPTANCE in sglang_plugin.registered, sglang_plugin.skipped
    assert hook_in_place(Req, "update_spec_correct_drafts_histogram", acceptance_count.update_histogram_hook)
    assert sglang_plugin.hook_status()[switches.ACCEPTANCE] == "on"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verifies=st.lists(st.lists(st.integers(0, STEPS + 2), max_size=50), min_size=1, max_size=6))
def test_counts_equal_the_requests_histograms(counting, verifies):
    """In this process (metrics off): what the flush takes is exactly the sum of the requests' histograms, a verify
    beyond --speculative-num-steps included (counted at its position, not tested)."""
    from eagle3_capture.acceptance.positions import add
    from eagle3_capture.sglang.monitor import histogram as acceptance_count

    counting.stop()  # each example from an empty histogram (the fixture runs once per test)
    acceptance_count.reset()
    f = counting.start(STEPS, None, thread=False)
    reqs = [_req(i) for i in range(len(verifies))]
    for i, ks in enumerate(verifies):
        for k in ks:
            reqs[i].update_spec_correct_drafts_histogram(k)
    h = []
    for r in reqs:
        h = add(h, r.spec_correct_drafts_histogram)
    got = acceptance_count.snapshot()
    assert add(got, [0] * len(h)) == add(h, [0] * len(got))
    f.flush()
    assert f.last == got and f.exported_positions >= STEPS


def test_not_counting_counts_nothing(counting):
    from eagle3_capture.sglang.monitor import histogram as acceptance_count

    r = _req()
    r.update_spec_correct_drafts_histogram(2)
    assert r.spec_correct_drafts_histogram == [0, 0, 1] and not any(acceptance_count.snapshot())


def test_multiprocess_export_counts_each_verify_once(harness, tmp_path):
    """Two processes, attention-TP ranks 0 and 1 of one server (each draws the same verifies, as the ranks of one
    server see the same requests): the counters SGLang's /metrics reads are the histograms' sums, counted once."""
    d = tmp_path / "prom"
    d.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(d),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(HERE, "acceptance_worker.py"),
                               str(tmp_path / f"r{r}.json"), str(r), "25"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    res = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    assert res[0]["histogram"] == res[1]["histogram"] and res[0]["checks"] == res[1]["checks"] == 25
    h = res[0]["histogram"]
    assert sum(h) > 0
    import acceptance_worker

    from eagle3_capture.acceptance.positions import attempts_accepted

    got = acceptance_worker.totals(str(d))
    att, acc = attempts_accepted(h, STEPS)
    assert got[("eagle3_capture:spec_verifies_total", "")] == sum(h)
    for p in range(1, STEPS + 1):
        assert got[("eagle3_capture:spec_draft_attempts_total", str(p))] == att[p - 1]
        assert got[("eagle3_capture:spec_draft_accepted_total", str(p))] == acc[p - 1]
        assert got[("eagle3_capture:acceptance_alarms_total", str(p))] == 0  # series exist from the start
    # the model-load line: once, from rank 0; rank 1 says nothing
    said = [[ln for ln in err.splitlines() if "eagle3_capture: acceptance:" in ln] for _, err in outs]
    assert len(said[0]) == 1 and said[1] == [], said
    assert ("counting on (attention-TP rank 0, attention-CP rank 0, pipeline rank 0); exported to SGLang's "
            "/metrics; alarm off: no profile (EAGLE3_CAPTURE_PROFILE is not set)") in said[0][0]


def test_exporter_interface(sglang_plugin):
    """Names and labels are names.py's (a wrong one is a ValueError naming what was expected); metrics off: no-op."""
    from eagle3_capture.acceptance import names
    from eagle3_capture.sglang.monitor import exporter

    assert "--enable-metrics is off" in exporter.configure(_server_args(), 1)
    assert not exporter.enabled() and exporter.model_name() == "m" and exporter.tp_rank() == 1
    exporter.inc(names.SELFTEST_RUNS, {names.RESULT: "passed"})  # tp_rank added from configure
    exporter.inc(names.ATTEMPTS, {names.POSITION: 1}, 3)
    exporter.set_gauge(names.CAPTURE_BROKEN, {names.TP_RANK: 0}, 1)
    for call, says in ((lambda: exporter.inc("eagle3_capture:nope", {}), "is not a counter"),
                       (lambda: exporter.inc(names.ATTEMPTS, {}), "expected ['position']"),
                       (lambda: exporter.inc(names.VERIFIES, {names.MODEL: "x"}), "model_name is added"),
                       (lambda: exporter.inc(names.VERIFIES, {}, -1), "expected a finite number >= 0"),
                       (lambda: exporter.set_gauge(names.DRIFT, {names.POSITION: 1}, float("nan")), "finite"),
                       (lambda: exporter.set_gauge(names.VERIFIES, {}, 1), "is not a gauge")):
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
            call()


# ----------------------------------------------------------------------------------------------------------------
# the alarm
# ----------------------------------------------------------------------------------------------------------------

_verify = simulated_verify


def _traffic(live, rates, blocks, per_block, rnd):
    """`blocks` flushes of `per_block` verifies over a few requests; (alarms, verifies reaching each position)."""
    reached = [0] * STEPS
    alarms = []
    reqs = [_req(i) for i in range(4)]
    for b in range(blocks):
        for j in range(per_block):
            k = _verify(rates, rnd)
            for p in range(min(k + 1, STEPS)):
                reached[p] += 1
            reqs[j % 4].update_spec_correct_drafts_histogram(k)
        got = live.flush()
        alarms += [(b, a, list(reached)) for a in got]
    return alarms, reached


def test_a_total_failure_fires_within_the_cusums_verifies_and_names_the_position(counting, lines, tmp_path):
    from eagle3_capture.acceptance.drift import DriftMonitor, DriftSettings

    _, prof = _profile(tmp_path, (1000, 2000, 3000, 4000))
    monitor = DriftMonitor.from_profile(prof, DriftSettings())
    counting.start(STEPS, monitor, thread=False)
    rnd = random.Random(7)
    rates = [a for a in prof.acceptance()]
    alarms, _ = _traffic(counting, rates, 50, 40, rnd)
    assert alarms == [] and lines == []
    # position 2 stops accepting: each verify reaching it adds ln((1-p1)/(1-p0)) to its statistic
    pos = monitor.positions[1]
    need = math.ceil(monitor.settings.threshold / math.log((1 - pos.p1) / (1 - pos.p0)))
    per_block = 40
    broken = [rates[0], 0.0, rates[2]]
    counted = [0] * STEPS  # verifies that reached each position since the break
    for _ in range(200):
        a, reached = _traffic(counting, broken, 1, per_block, rnd)
        counted = [c + r for c, r in zip(counted, reached)]
        if a:
            break
    assert len(a) == 1 and a[0][1].position == 2, a
    assert counted[1] <= need + per_block, (counted[1], need)  # within the CUSUM's count, to the block
    errors = [m for lv, m in lines if lv == "error"]
    assert len(errors) == 1 and errors[0] == a[0][1].line()
    assert errors[0].startswith("eagle3_capture: acceptance drift ALARM at draft position 2: ")
    # the episode goes on: no second line while it lasts
    _traffic(counting, broken, 20, per_block, rnd)
    assert len([m for lv, m in lines if lv == "error"]) == 1
    assert monitor.positions[1].in_alarm and monitor.positions[1].ratio >= 1


def test_in_control_traffic_never_fires(counting, lines, tmp_path):
    """Traffic at the profile's own rates (and a little better), 2000 blocks: no alarm at the default threshold."""
    from eagle3_capture.acceptance.drift import DriftMonitor

    _, prof = _profile(tmp_path, (300, 500, 700, 900))
    monitor = DriftMonitor.from_profile(prof)
    counting.start(STEPS, monitor, thread=False)
    rnd = random.Random(11)
    alarms, reached = _traffic(counting, [min(1.0, r * 1.02) for r in prof.acceptance()], 2000, 12, rnd)
    assert alarms == [] and lines == [] and reached[0] == 24000
    assert all(p.statistic < monitor.settings.threshold for p in monitor.positions)


# ----------------------------------------------------------------------------------------------------------------
# settings and profiles: one line each
# ----------------------------------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.text(max_size=12), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.integers(-1000, 1000).map(str), st.sampled_from(["0.2", "16", "1e1", " 0.5 ", "nan", "inf",
                                                                         "0x10", "1_0", "", "-0.3", "0.9", "80"]))


@settings(max_examples=200, deadline=None)
@given(drop=st.one_of(st.none(), NUMBERS), threshold=st.one_of(st.none(), NUMBERS),
       required=st.one_of(st.none(), st.sampled_from(["0", "1", " 1 ", "", "yes", "2", "true"]), st.text(max_size=4)),
       profile=st.one_of(st.none(), st.text(max_size=20)))
def test_fuzz_the_acceptance_settings(drop, threshold, required, profile):
    from eagle3_capture.acceptance.drift import DROP_RANGE, THRESHOLD_RANGE
    from eagle3_capture.sglang.settings.alarm import parse_number, parse_profile_path, parse_required
    from eagle3_capture.sglang.settings.switches import read_settings

    env = {k: v for k, v in (("EAGLE3_CAPTURE_ALARM_DROP", drop), ("EAGLE3_CAPTURE_ALARM_THRESHOLD", threshold),
                             ("EAGLE3_CAPTURE_PROFILE_REQUIRED", required), ("EAGLE3_CAPTURE_PROFILE", profile))
           if v is not None}
    s = read_settings(env, prepare_dir=False)  # never raises
    bad = 0
    for name, value, parse in (("EAGLE3_CAPTURE_ALARM_DROP", drop, lambda v: parse_number("d", v, DROP_RANGE)),
                               ("EAGLE3_CAPTURE_ALARM_THRESHOLD", threshold,
                                lambda v: parse_number("t", v, THRESHOLD_RANGE)),
                               ("EAGLE3_CAPTURE_PROFILE", profile, parse_profile_path)):
        if value is None:
            continue
        try:
            parse(value)
        except ValueError:
            bad += 1
    assert len(s.errors) == bad, (env, s.errors)
    for e in s.errors:
        assert "\n" not in e and e.endswith("ignored: the acceptance alarm is off in this process (counting and "
                                            "export stay on)")
    assert (s.alarm.drift is None) == (bad > 0)
    try:
        parse_required(required or "")
        assert s.refusal is None
    except ValueError:
        assert s.refusal is not None and "EAGLE3_CAPTURE_PROFILE_REQUIRED=" in s.refusal and "\n" not in s.refusal
    if s.alarm.drift is not None:
        assert DROP_RANGE[0] <= s.alarm.drift.drop <= DROP_RANGE[1]


BAD_PROFILES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"{}", b"[]", b"null", b'{"format": "eagle3-capture/acceptance-profile", "version": 1}',
                     b"NaN", b'{"a": Infinity}']),
    st.fixed_dictionaries({"format": st.just("eagle3-capture/acceptance-profile"), "version": st.just(1),
                           "source": st.sampled_from(["doctor accept", "x"]),
                           "speculative": st.fixed_dictionaries({"num_steps": st.integers(-1, 5),
                                                                 "eagle_topk": st.integers(0, 2),
                                                                 "num_draft_tokens": st.integers(0, 6)}),
                           "prompts": st.integers(-1, 3),
                           "correct_drafts_histogram": st.lists(st.integers(-2, 5), max_size=6)}
                          ).map(lambda d: json.dumps(d).encode()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=BAD_PROFILES, required=st.booleans())
def test_fuzz_a_profile_at_model_load_is_one_line(tmp_path, raw, required):
    """Any file: a usable profile of this server's flags turns the alarm on; anything else is one ERROR line and the
    alarm off -- or, required, one refusal line -- and counting stays on."""
    from eagle3_capture.acceptance import profile
    from eagle3_capture.sglang.monitor import live as acceptance_live
    from eagle3_capture.sglang.settings.alarm import AlarmSettings

    f = tmp_path / "p.json"
    f.write_bytes(raw)
    try:
        usable = profile.read(str(f)).speculative == profile.Speculative(STEPS, 1, STEPS + 1)
    except profile.ProfileError:
        usable = False
    plan = acceptance_live.plan(_server_args(), AlarmSettings(profile=str(f), required=required), (True, "rank 0"))
    assert plan.counting and "\n" not in plan.line
    if usable:
        assert plan.monitor is not None and plan.errors == () and plan.refusal is None
        return
    assert plan.monitor is None and "alarm off: " in plan.line
    if required:
        assert plan.errors == () and plan.refusal.startswith("eagle3_capture: refusing to serve: "
                                                             "EAGLE3_CAPTURE_PROFILE_REQUIRED=1 and ")
        assert "\n" not in plan.refusal
    else:
        assert plan.refusal is None and len(plan.errors) == 1 and "\n" not in plan.errors[0]
        assert plan.errors[0].endswith("the acceptance alarm is off (counting and export stay on)")


def test_a_profile_of_other_flags_is_not_comparable(tmp_path):
    from eagle3_capture.sglang.monitor import live as acceptance_live
    from eagle3_capture.sglang.settings.alarm import AlarmSettings

    path, _ = _profile(tmp_path, (1, 2, 3, 4, 5), steps=4)
    plan = acceptance_live.plan(_server_args(), AlarmSettings(profile=path), (True, "rank 0"))
    assert plan.monitor is None and len(plan.errors) == 1
    assert ("was made with --speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5, "
            "this server runs with --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4: not comparable") in plan.errors[0]
    path, prof = _profile(tmp_path, name="good.json")
    plan = acceptance_live.plan(_server_args(), AlarmSettings(profile=path), (True, "attention-TP rank 0"))
    assert plan.monitor is not None and plan.errors == () and plan.refusal is None
    bound = plan.monitor.false_alarms_per_hour()
    assert plan.line == (f"eagle3_capture: acceptance: counting on (attention-TP rank 0); "
                         f"{acceptance_live.exporter.why_off() or acceptance_live.EXPORTED}; profile {path} "
                         f"(3 positions, accept length {prof.accept_length:.2f}, 1000 verifies); alarm on: drop 20%, "
                         f"threshold 16 nats, 3 positions tested, at most {bound:.1e} false alarms per hour")
    # not the rank that counts: nothing said, no alarm (the other rank says it)
    quiet = acceptance_live.plan(_server_args(), AlarmSettings(profile=path), (False, "attention-TP rank 1"))
    assert not quiet.counting and quiet.line == "" and quiet.errors == ()
    # no speculative decoding: nothing to count; required: refused
    plan = acceptance_live.plan(_server_args(speculative_algorithm=None), AlarmSettings(required=True),
                                (True, "rank 0"))
    assert not plan.counting and plan.refusal.endswith("no speculative decoding: no acceptance to watch")


def test_a_required_profile_refuses_at_model_load(sglang_plugin, lines, monkeypatch, tmp_path):
    """Through the plugin's real model-load hook: EAGLE3_CAPTURE_PROFILE_REQUIRED=1 with a missing profile stops the
    server there with one line; with a usable one the model loads and counting starts."""
    from eagle3_capture.sglang.monitor import histogram as acceptance_count, live as acceptance_live
    from eagle3_capture.sglang.settings import switches

    runner = SimpleNamespace(server_args=_server_args(), tp_rank=0, is_draft_worker=False)
    monkeypatch.setattr(acceptance_count, "output_rank", lambda: (True, "attention-TP rank 0"))
    try:
        switches.configure({"EAGLE3_CAPTURE_PROFILE_REQUIRED": "1",
                            "EAGLE3_CAPTURE_PROFILE": str(tmp_path / "missing.json")})
        with pytest.raises(RuntimeError) as e:
            sglang_plugin.load_model_hook(lambda self: pytest.fail("the model must not load"), runner)
        assert str(e.value).startswith("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_PROFILE_REQUIRED=1 and "
                                       f"profile {tmp_path / 'missing.json'}: cannot be read")
        path, _ = _profile(tmp_path)
        switches.configure({"EAGLE3_CAPTURE_PROFILE_REQUIRED": "1", "EAGLE3_CAPTURE_PROFILE": path,
                            "EAGLE3_CAPTURE_ALARM_THRESHOLD": "20"})
        assert sglang_plugin.load_model_hook(lambda self: "loaded", runner) == "loaded"
        assert acceptance_count.counting() and acceptance_live.flusher().monitor.settings.threshold == 20
        assert [lv for lv, _ in lines] == ["info"] and "alarm on: drop 20%, threshold 20 nats" in lines[0][1]
        # the draft's runner loads without a word
        draft = SimpleNamespace(server_args=_server_args(), tp_rank=0, is_draft_worker=True)
        assert sglang_plugin.load_model_hook(lambda self: "draft", draft) == "draft" and len(lines) == 1
    finally:
        acceptance_live.stop()
        acceptance_count.reset()
        switches.configure()


@pytest.mark.parametrize("what,body,reason", [
    ("nested 200000 deep", "[" * 200000, "nested 200000 deep"),
    ("a 5000-digit integer", '{"format": "eagle3-capture/acceptance-profile", "prompts": ' + "9" * 5000 + "}",
     "a number of 5000 characters"),
    ("an acceptance of 1.5", None, "positions[0].acceptance is 1.5"),
    ("a negative acceptance", None, "positions[1].acceptance is -0.25"),
])
def test_a_bad_profile_is_one_line_naming_the_file_and_counting_stays_on(sglang_plugin, lines, monkeypatch, tmp_path,
                                                                        what, body, reason):
    """Through the plugin's real model-load hook: a profile that cannot be used -- however it is bad -- is one ERROR
    line naming the file and why, and counting (and the export) start anyway. Before the one bounded parser, deep
    nesting gave "setting up the acceptance counts failed (RecursionError ...)": no file named, counting off."""
    from eagle3_capture.sglang.monitor import histogram as acceptance_count, live as acceptance_live
    from eagle3_capture.sglang.settings import switches

    f = tmp_path / "bad.json"
    if body is None:
        path, _ = _profile(tmp_path, name="good.json")
        d = json.load(open(path))
        d["positions"][0 if "1.5" in reason else 1]["acceptance"] = 1.5 if "1.5" in reason else -0.25
        body = json.dumps(d)
    f.write_text(body)
    runner = SimpleNamespace(server_args=_server_args(), tp_rank=0, is_draft_worker=False)
    monkeypatch.setattr(acceptance_count, "output_rank", lambda: (True, "attention-TP rank 0"))
    try:
        switches.configure({"EAGLE3_CAPTURE_PROFILE": str(f)})
        assert sglang_plugin.load_model_hook(lambda self: "loaded", runner) == "loaded"
        assert acceptance_count.counting() and acceptance_live.flusher() is not None
        assert acceptance_live.flusher().monitor is None
        errors = [m for lv, m in lines if lv == "error"]
        assert len(errors) == 1 and "\n" not in errors[0], lines
        assert errors[0].startswith(f"eagle3_capture: profile {f}: {reason}"), errors[0]
        assert errors[0].endswith("the acceptance alarm is off (counting and export stay on)")
        assert any("counting on" in m for lv, m in lines if lv == "info"), lines
    finally:
        acceptance_live.stop()
        acceptance_count.reset()
        switches.configure()


def test_ranks_that_cannot_be_read_are_one_error_line(tmp_path):
    from eagle3_capture.sglang.monitor import live as acceptance_live
    from eagle3_capture.sglang.settings.alarm import AlarmSettings

    plan = acceptance_live.plan(_server_args(), AlarmSettings(), (None, "the attention-TP rank cannot be read (X)"))
    assert not plan.counting and plan.line == "" and len(plan.errors) == 1 and plan.refusal is None
    assert plan.errors[0].startswith("eagle3_capture: acceptance: counting off in this process: the attention-TP "
                                     "rank cannot be read (X)")


def test_the_rank_that_counts_is_read_from_sglangs_parallel_groups(harness):
    """The harness's process has SGLang's real (gloo, one rank) parallel state: rank 0 of every dimension."""
    from eagle3_capture.sglang.monitor import histogram as acceptance_count

    counts, text = acceptance_count.output_rank()
    assert counts is True and text == "attention-TP rank 0, attention-CP rank 0, pipeline rank 0"
    assert acceptance_count.tp_rank() == 0


@pytest.mark.parametrize("name,refused", [("EAGLE3_CAPTURE_PROFILE_REQUIRD", True),
                                          ("EAGLE3_CAPTURE_PROFILEREQUIRED", True),
                                          ("EAGLE3_CAPTURE_ALARM_THRESHLD", False),
                                          ("EAGLE3_CAPTURE_ALARMDROP", False),
                                          ("EAGLE3_CAPTURE_PROFILES", False)])
def test_a_misspelt_acceptance_setting(name, refused):
    """A misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED refuses (read as unset it would serve without the alarm the
    operator required); a misspelt alarm setting turns the alarm off with one ERROR line naming the closest name."""
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings({name: "1"}, prepare_dir=False)
    if refused:
        assert s.refusal.startswith(f"eagle3_capture: refusing to serve: {name}='1' is not a setting of the plugin; "
                                    "it looks like a misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED") and s.errors == ()
        return
    assert s.refusal is None and len(s.errors) == 1 and s.alarm.drift is None, s
    assert s.errors[0].startswith(f"eagle3_capture: {name} is not a setting of the plugin (closest known name: "
                                  "EAGLE3_CAPTURE_")
    assert s.errors[0].endswith("ignored: the acceptance alarm is off in this process (counting and export stay on)")
