"""The capture self-test re-run while serving (sglang/monitor/selftest.py, admission.py), around SGLang's real
ModelRunner.forward on SGLang's real DeepseekV3 on the CPU: every EAGLE3_CAPTURE_SELFTEST_EVERY served target forwards
(the draft's forwards not counted), every EAGLE3_CAPTURE_SELFTEST_SECONDS (a mocked clock), after a weight update
through SGLang's own hooked SchedulerWeightUpdaterManager method; in raise mode a failure while serving refuses new
requests on SGLang's real Req with its own abort, and a later passing check serves again; the period's settings are
one ERROR line each when malformed (hypothesis). The same in SGLang's real serving loop is the engine test's
(E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER)."""
import inspect
import logging
import types

import pytest
from hypothesis import given, settings, strategies as st

from sglang_fixtures import harness, plugin_env, require_sglang, sglang_plugin, skip_unless_sglang_has, tiny  # noqa: F401

pytestmark = pytest.mark.sglang

DECLARED = [-1, 1, 3]


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("eagle3_capture: capture self-test")]


@pytest.fixture
def fresh_selftest():
    from eagle3_capture.sglang.monitor import selftest

    selftest.reset()
    yield selftest
    selftest.reset()


@pytest.fixture
def target(tiny):
    model = tiny["model"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    yield model, tiny["cfg"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    model.model.__dict__.pop("_e3_shifted", None)


def _decodes(r, n, harness):
    for _ in range(n):
        r.forward([harness.DECODE_TOKEN])


def test_rechecks_every_n_served_target_forwards_and_not_the_drafts(harness, target, fresh_selftest, plugin_env,
                                                                     caplog):
    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST_EVERY="3", EAGLE3_CAPTURE_SELFTEST_SECONDS="0")
    r = harness.ServedRunner(model, cfg, rid="count")
    draft = harness.ServedRunner(model, cfg, rid="draft", is_draft_worker=True)  # SGLang's draft runner flag
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)          # the start-up check
        _decodes(r, 2, harness)
        _decodes(draft, 3, harness)        # not counted: the draft's runner
        assert len(_lines(caplog)) == 1
        _decodes(r, 4, harness)            # checks on the 3rd and the 6th target decode after the start-up one
    lines = _lines(caplog)
    assert len(lines) == 3, lines
    assert lines[0].endswith(" -- run at start-up") and "served EXTEND forward, request count" in lines[0]
    for ln in lines[1:]:
        assert "capture self-test passed: slot 0 equals the embedding bit for bit, 3 slots distinct (1 rows; served " \
               "DECODE forward, request count) -- run after 3 served forwards" in ln, ln
    assert not fresh_selftest.pending()


def test_rechecks_after_t_seconds_on_a_mocked_clock(harness, target, fresh_selftest, plugin_env, caplog,
                                                   monkeypatch):
    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST_EVERY="0", EAGLE3_CAPTURE_SELFTEST_SECONDS="5")
    now = [100.0]
    monkeypatch.setattr(fresh_selftest, "monotonic", lambda: now[0])
    r = harness.ServedRunner(model, cfg, rid="clock")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)          # start-up at t=100: the next is due at t=105
        now[0] = 104.9
        _decodes(r, 20, harness)           # many forwards, no count trigger: nothing
        assert len(_lines(caplog)) == 1
        now[0] = 105.0
        _decodes(r, 2, harness)            # the first re-checks, the second is 0 s after it
        now[0] = 111.0
        _decodes(r, 1, harness)
    lines = _lines(caplog)
    assert [ln.rsplit(" -- run ", 1)[1] for ln in lines] == ["at start-up", "after 5 s", "after 5 s"], lines


def test_a_weight_update_through_sglangs_hooked_method_rearms_the_check(harness, target, fresh_selftest,
                                                                        plugin_env, sglang_plugin, caplog):
    skip_unless_sglang_has("sglang.srt.managers.scheduler_components.weight_updater",
                           "the scheduler's SchedulerWeightUpdaterManager")
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

    from eagle3_capture.sglang.installed import internals
    from eagle3_capture.sglang.installed.hook_chain import hook_in_place

    path = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager." \
           "update_weights_from_disk"
    assert path in internals.current().weight_update_paths
    assert hook_in_place(SchedulerWeightUpdaterManager, "update_weights_from_disk", fresh_selftest.weight_update_hook)
    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST_EVERY="0", EAGLE3_CAPTURE_SELFTEST_SECONDS="0")
    r = harness.ServedRunner(model, cfg, rid="reload")
    versions = []
    # SGLang's own manager, with no runner to load into (the update itself is SGLang's business, not the test's)
    given = dict(
        # the worker loads nothing: 0.5.23 asks it for its runners, 0.5.13-0.5.22 to update from disk itself
        tp_worker=types.SimpleNamespace(weight_update_runners=lambda: [],
                                        update_weights_from_disk=lambda recv_req: (True, "loaded nothing")),
        draft_worker=None,
        memory_saver_adapter=None, flush_cache=lambda **kw: True, is_fully_idle=lambda: True,
        scheduler=types.SimpleNamespace(record_weight_version_change=lambda new_version: versions.append(new_version)))
    # the manager's constructor differs by release (0.5.16 also wants the TP CPU group): None for what it adds
    params = inspect.signature(SchedulerWeightUpdaterManager.__init__).parameters
    given = {k: v for k, v in given.items() if k in params}
    given.update({k: None for k, q in params.items() if k != "self" and k not in given
                  and q.default is inspect.Parameter.empty and q.kind is not inspect.Parameter.VAR_KEYWORD
                  and q.kind is not inspect.Parameter.VAR_POSITIONAL})
    manager = SchedulerWeightUpdaterManager(**given)
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)
        _decodes(r, 3, harness)            # both triggers off: no re-check
        assert len(_lines(caplog)) == 1 and not fresh_selftest.pending()
        out = manager.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path="/new", weight_version="v2"))
        # SGLang's method ran: 0.5.23 records the new version, older releases return the worker's message
        assert out.success and (versions == ["v2"] or out.message == "loaded nothing"), (out, versions)
        assert fresh_selftest.pending()
        _decodes(r, 2, harness)
    lines = _lines(caplog)
    assert len(lines) == 2 and lines[1].endswith(" -- run after a weight update (update_weights_from_disk)"), lines


def test_raise_mode_refuses_new_requests_on_a_real_req_until_a_check_passes(harness, target, fresh_selftest,
                                                                              plugin_env, caplog):
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from eagle3_capture.sglang.monitor import admission

    def queued(self, req, is_retracted=False):
        return ("queued", req.rid)

    def new_req(rid):
        return Req(rid, "", [1, 2, 3], SamplingParams())

    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST="raise", EAGLE3_CAPTURE_SELFTEST_EVERY="2", EAGLE3_CAPTURE_SELFTEST_SECONDS="0")
    r = harness.ServedRunner(model, cfg, rid="broken")
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)          # start-up: passes
        ok = new_req("before")
        assert admission.add_request_hook(queued, None, ok) == ("queued", "before") and ok.to_finish is None
        model.model.layers_to_capture = [1, 2, 4]  # the capture goes wrong while serving
        _decodes(r, 2, harness)            # the re-check fails: no exception, the server keeps its requests
        line = fresh_selftest.refusal()
        assert line is not None and "\n" not in line
        assert line.startswith("eagle3_capture: request refused: the capture self-test failed while serving (run "
                               "after 2 served forwards; EAGLE3_CAPTURE_SELFTEST=raise): slot 0 should hold Embedding")
        req = new_req("after")
        assert admission.add_request_hook(queued, None, req) == ("queued", "after")  # still queued: SGLang finishes it
        assert isinstance(req.to_finish, FINISH_ABORT) and req.to_finish.message == line
        # SGLang's own step after the request's forward: the abort becomes its finish reason (0.5.23:
        # update_finish_state; check_finished up to 0.5.20)
        (getattr(req, "update_finish_state", None) or req.check_finished)()
        j = req.finished_reason.to_json()
        # 503 where the release's abort takes a status (0.5.20+); before, SGLang's own default (400 on 0.5.12)
        takes_status = "status_code" in inspect.signature(Req.set_finish_with_abort).parameters
        assert j["type"] == "abort" and j["message"] == line, j
        assert j.get("status_code") == 503 if takes_status else j.get("status_code") in (None, 400), j
        back = new_req("retracted")        # in flight before the failure: left alone
        admission.add_request_hook(queued, None, back, is_retracted=True)
        assert back.to_finish is None
        model.set_eagle3_layers_to_capture(list(DECLARED))  # a reload fixes it
        def update_weights_from_disk(self):  # as SGLang's method would, after a reload that fixed the capture
            return "updated"

        assert fresh_selftest.weight_update_hook(update_weights_from_disk, None) == "updated"
        _decodes(r, 1, harness)
        assert fresh_selftest.refusal() is None
        fine = new_req("fixed")
        admission.add_request_hook(queued, None, fine)
        assert fine.to_finish is None
    lines = _lines(caplog)
    assert [ln.split(": ")[1] for ln in lines] == ["capture self-test passed", "capture self-test FAILED",
                                                   "capture self-test passed"], lines
    errors = [m.getMessage() for m in caplog.records if m.levelno == logging.ERROR and m.name.startswith("eagle3")]
    assert len(errors) == 2 and "FAILED" in errors[0] and errors[1].startswith(
        "eagle3_capture: refusing new requests from now on (EAGLE3_CAPTURE_SELFTEST=raise)"), errors
    assert any(m.startswith("eagle3_capture: serving requests again") for m in caplog.messages)


def test_a_start_up_failure_in_raise_mode_still_stops_the_server(harness, target, fresh_selftest, plugin_env):
    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST="raise")
    model.model.layers_to_capture = [1, 2, 4]
    r = harness.ServedRunner(model, cfg, rid="first")
    with pytest.raises(RuntimeError, match=r"FAILED: slot 0 should hold Embedding.* -- run at start-up "
                                           r"\(EAGLE3_CAPTURE_SELFTEST=raise\)"):
        r.forward(harness.PROMPT)
    assert fresh_selftest.refusal() is None


def test_each_verdict_is_counted_for_the_exporter(harness, target, fresh_selftest, plugin_env, monkeypatch):
    from eagle3_capture.acceptance import names
    from eagle3_capture.sglang.monitor import exporter

    calls = []
    monkeypatch.setattr(exporter, "enabled", lambda: True)
    monkeypatch.setattr(exporter, "inc", lambda name, labels, by=1: calls.append(("inc", name, dict(labels))))
    monkeypatch.setattr(exporter, "set_gauge", lambda name, labels, v: calls.append(("gauge", name, dict(labels), v)))
    model, cfg = target
    plugin_env(EAGLE3_CAPTURE_SELFTEST_EVERY="1", EAGLE3_CAPTURE_SELFTEST_SECONDS="0")
    r = harness.ServedRunner(model, cfg, rid="metrics")
    r.forward(harness.PROMPT)
    model.model.layers_to_capture = [1, 2, 4]
    _decodes(r, 1, harness)
    rank = {names.TP_RANK: "0"}
    assert calls == [("inc", names.SELFTEST_RUNS, dict(rank, result="passed")),
                     ("gauge", names.CAPTURE_BROKEN, rank, 0),
                     ("inc", names.SELFTEST_RUNS, dict(rank, result="failed")),
                     ("inc", names.SELFTEST_FAILURES, rank),
                     ("gauge", names.CAPTURE_BROKEN, rank, 1)], calls


def test_the_cpu_standins_late_shift_fails_a_recheck_not_the_start_up(harness, target, fresh_selftest, plugin_env,
                                                                      caplog, monkeypatch):
    """The engine test's fault in-process: E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER=3 around SGLang's ModelRunner.forward."""
    import e3_sglang_cpu

    model, cfg = target
    monkeypatch.setenv(e3_sglang_cpu.SHIFT_AFTER_ENV, "3")
    monkeypatch.setattr(e3_sglang_cpu, "_target_forwards", [0])
    plugin_env(EAGLE3_CAPTURE_SELFTEST_EVERY="1", EAGLE3_CAPTURE_SELFTEST_SECONDS="0")
    r = harness.ServedRunner(model, cfg, rid="late")
    forward = r.mr.forward
    r.mr.forward = lambda fb: e3_sglang_cpu.shift_capture_after_hook(lambda self, b: forward(b), r.mr, fb)
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        r.forward(harness.PROMPT)
        _decodes(r, 2, harness)            # target forwards 2 and 3: the third runs shifted
    lines = _lines(caplog)
    assert [("passed" in ln, ln.rsplit(" -- run ", 1)[1]) for ln in lines] == [
        (True, "at start-up"), (True, "after 1 served forwards"), (False, "after 1 served forwards")], lines
    assert "slot 0 should hold Embedding" in lines[2] and "the slot holds layer input 1 (LayerOutput(0))" in lines[2]
    with pytest.raises(ValueError, match="E3_SGLANG_CPU_SHIFT_CAPTURE_AFTER='0'"):
        e3_sglang_cpu.shift_after({e3_sglang_cpu.SHIFT_AFTER_ENV: "0"})


# ----------------------------------------------------------------------------------------------------------------
# The period's settings: not a guard, one ERROR line and the default
# ----------------------------------------------------------------------------------------------------------------

PERIOD = {"EAGLE3_CAPTURE_SELFTEST_EVERY": (10000, 10 ** 9), "EAGLE3_CAPTURE_SELFTEST_SECONDS": (300, 604800)}


def _parsed(name, value):
    v = value.strip()
    if not v.isascii() or not v.isdigit():
        return None
    n = int(v)
    return n if n <= PERIOD[name][1] else None


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(PERIOD)),
       value=st.one_of(st.text(max_size=12), st.integers(-5, 10 ** 10).map(str),
                       st.sampled_from(["0", " 7 ", "1e3", "5s", "300.0", "0x10", "１２", "604801", "1000000001"])))
def test_fuzz_a_period_setting_is_its_value_or_one_error_line_and_the_default(name, value):
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings({name: value}, prepare_dir=False)
    field = "selftest_every" if name.endswith("EVERY") else "selftest_seconds"
    want = _parsed(name, value)
    assert s.refusal is None and s.dump is None
    if want is not None:
        assert s.errors == () and getattr(s, field) == want
    else:
        assert len(s.errors) == 1 and "\n" not in s.errors[0] and s.errors[0].startswith(f"eagle3_capture: {name}=")
        assert f"the default {PERIOD[name][0]} applies" in s.errors[0] and getattr(s, field) == PERIOD[name][0]


def test_a_misspelt_period_name_is_one_error_line_not_a_refusal_nor_the_dumps():
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings({"EAGLE3_CAPTURE_SELFTEST_EVRY": "5", "EAGLE3_CAPTURE_DUMP": "/tmp/x"}, prepare_dir=False)
    assert s.refusal is None and s.dump is not None and s.selftest_every == 10000
    assert s.errors == ("eagle3_capture: EAGLE3_CAPTURE_SELFTEST_EVRY is not a variable of eagle3-capture (closest "
                        "known name: EAGLE3_CAPTURE_SELFTEST_EVERY); ignored",), s.errors
    s = read_settings({"EAGLE3_CAPTURE_SELFTST": "raise"}, prepare_dir=False)  # the guard's typo still refuses
    assert s.refusal is not None and "EAGLE3_CAPTURE_SELFTEST" in s.refusal
