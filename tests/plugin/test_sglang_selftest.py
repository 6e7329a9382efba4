"""The capture self-test (sglang/monitor/selftest.py) around SGLang's real ModelRunner.forward, on SGLang's real
DeepseekV3 on the CPU: it passes on the plugin's capture, and names the slot when the capture is wired wrong at run time
(the embedding slot holding a later layer, two slots alike); EAGLE3_CAPTURE_SELFTEST=raise stops the forward. That it
never runs on SGLang's warm-up or capture passes is in test_sglang_served_dump.py; the same check in SGLang's real
serving loop is in tests/engine."""
import logging

import pytest
import torch

from sglang_fixtures import harness, plugin_env, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

DECLARED = [-1, 1, 3]


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if "capture self-test" in r.getMessage()]


@pytest.fixture
def fresh_selftest():
    from eagle3_capture.sglang.monitor import selftest

    selftest.reset()
    yield selftest
    selftest.reset()


def _serve(harness, model, cfg, rid="req-0"):
    """A prefill and a decode step through SGLang's ModelRunner.forward (the path of every served forward)."""
    r = harness.ServedRunner(model, cfg, rid=rid)
    return r.forward(harness.PROMPT)[0], r.forward([harness.DECODE_TOKEN])[0]


def test_passes_on_the_plugins_capture_once_per_process(harness, tiny, fresh_selftest, caplog):
    model, cfg = tiny["model"], tiny["cfg"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
        _serve(harness, model, cfg, rid="rid-abc")  # a prefill and a decode step: the test runs on the first only
    lines = _lines(caplog)
    assert len(lines) == 1 and "passed: slot 0 equals the embedding bit for bit, 3 slots distinct" in lines[0]
    assert f"({len(harness.PROMPT)} rows; served EXTEND forward, request rid-abc)" in lines[0], lines[0]


def test_names_the_slot_when_the_embedding_is_not_captured(harness, tiny, fresh_selftest, caplog):
    model, cfg = tiny["model"], tiny["cfg"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    model.model.layers_to_capture = [1, 2, 4]  # a capture wired one tap later than declared, after model load
    try:
        with caplog.at_level(logging.INFO, logger="eagle3_capture.sglang"):
            _serve(harness, model, cfg)
    finally:
        model.set_eagle3_layers_to_capture(list(DECLARED))
    lines = _lines(caplog)
    assert len(lines) == 1 and "FAILED" in lines[0] and "slot 0 should hold Embedding" in lines[0], lines
    assert "the slot holds Embedding" not in lines[0]
    assert [r.levelno for r in caplog.records if "FAILED" in r.getMessage()] == [logging.ERROR]


def test_two_equal_slots_and_raise_mode(harness, tiny, fresh_selftest, plugin_env):
    from eagle3_capture.sglang.taps.target import SPEC_ATTR

    model, cfg = tiny["model"], tiny["cfg"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    prefill, _ = _serve(harness, model, cfg)  # uses up this process's self-test (it passes)
    aux = prefill.logits_output.hidden_states.clone()
    H = cfg.hidden_size
    aux[:, 2 * H:] = aux[:, H:2 * H]  # slot 2 a copy of slot 1
    fresh_selftest.reset()
    plugin_env(EAGLE3_CAPTURE_SELFTEST="raise")
    ids = torch.tensor(harness.PROMPT)
    with pytest.raises(RuntimeError, match=r"slots 1 and 2 hold the same values.*EAGLE3_CAPTURE_SELFTEST=raise"):
        fresh_selftest.check(model.model, getattr(model.model, SPEC_ATTR), ids, None, (None, aux))


def test_bad_selftest_setting_is_refused():
    from eagle3_capture.sglang.settings import switches

    assert switches.selftest_raises({}) is False and switches.selftest_raises({"EAGLE3_CAPTURE_SELFTEST": "raise"})
    with pytest.raises(ValueError, match="expected 'log' or 'raise'"):
        switches.selftest_raises({"EAGLE3_CAPTURE_SELFTEST": "yes"})


def test_announce_reaches_stderr_before_logging_is_configured(capfd):
    """SGLang loads plugins before it configures logging: the plugin's lines must not be lost then."""
    from eagle3_capture.sglang.settings import switches

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        switches.announce("info", "eagle3_capture: a line before logging is configured")
    finally:
        root.handlers[:] = saved
    err = capfd.readouterr().err
    assert "] eagle3_capture: a line before logging is configured" in err


def test_announce_reaches_stderr_when_a_root_handler_would_drop_it(capfd):
    """Importing SGLang's modules (the plugin reads the installed release's internals at load) leaves a root handler
    at WARNING before SGLang configures logging: an INFO startup line (`taps hook off ...`) must still be written."""
    from eagle3_capture.sglang.settings import switches

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = [logging.StreamHandler()]
    root.setLevel(logging.WARNING)
    try:
        switches.announce("info", "eagle3_capture: a line under a WARNING root handler")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    err = capfd.readouterr().err
    assert err.count("eagle3_capture: a line under a WARNING root handler") == 1, err
