"""The plugin loads through SGLang's own load_plugins() from the installed entry point, and every hook is really in
place on SGLang's classes and functions (SGLang only logs a hook it could not apply)."""
import pkgutil

import pytest

from eagle3_capture.sglang.installed.hook_chain import hook_in_place
from scenarios import run_script
from sglang_fixtures import harness, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang


def _resolve(path):
    obj_path, attr = path.rsplit(".", 1)
    return pkgutil.resolve_name(obj_path), attr


def _expected_groups(plugin):
    from eagle3_capture.sglang import draft
    from eagle3_capture.sglang.settings import switches

    groups = [switches.TAPS, switches.FINAL_BOUNDARY, switches.CAPTURE, switches.SELFTEST]
    if draft.unavailable() is None:
        groups += [switches.DRAFT_FC, switches.GATHER]  # gather: its error poll around the draft extend
    # A group the installed release cannot have (the fused capture before 0.5.23's packer slot(), the gather where
    # the MLA draft's fc is unsharded) is left out naming the release; the taps and the self-test never are.
    unavailable = {g: v["unavailable"] for g, v in plugin.release_summary()["groups"].items() if "hooks" not in v}
    assert not set(unavailable) & {switches.TAPS, switches.FINAL_BOUNDARY, switches.SELFTEST}, unavailable
    for g, why in unavailable.items():
        assert g not in plugin.registered and plugin.skipped[g].startswith("not on SGLang "), (g, plugin.skipped)
        assert why in plugin.skipped[g], (g, why, plugin.skipped[g])
    return [g for g in groups if g not in unavailable]


def test_load_plugins_puts_every_hook_in_place(sglang_plugin):
    plugin = sglang_plugin
    for group in _expected_groups(plugin):
        assert group in plugin.registered, f"group {group} not registered: {plugin.skipped.get(group)}"
        for path, fn in plugin.HOOKS[group]:
            obj, attr = _resolve(path)
            current = getattr(obj, attr)
            assert hasattr(current, "__wrapped__"), f"{path} is not wrapped by SGLang's HookRegistry"
            assert hook_in_place(obj, attr, fn), f"{path}: our hook {fn.__name__} is not in its chain"
        assert plugin.hook_status()[group] == "on", plugin.hook_status()


def test_hooks_reach_the_names_sglang_calls(sglang_plugin):
    """Subclasses see the hooked methods, and deepseek_v2's module-level references are the hooked ones."""
    from sglang.srt.model_executor import model_runner
    from sglang.srt.models import deepseek_v2
    from eagle3_capture.sglang.taps import capture, model_forward, target
    from eagle3_capture.sglang.installed import internals
    from eagle3_capture.sglang import served

    plugin = sglang_plugin
    release = internals.current()
    for cls in (deepseek_v2.DeepseekV2ForCausalLM, deepseek_v2.DeepseekV3ForCausalLM,
                deepseek_v2.DeepseekV32ForCausalLM):
        assert hook_in_place(cls, "set_eagle3_layers_to_capture", target.set_eagle3_layers_to_capture_hook)
    assert hook_in_place(deepseek_v2.DeepseekV2Model, "forward", model_forward.model_forward_hook)
    # DeepseekV2Model.forward calls these through deepseek_v2's own module-level names
    if release.final_boundary in (internals.FINAL_NORM, internals.RESIDUAL_NORM):
        norm = "final_norm" if release.final_boundary == internals.FINAL_NORM else "norm"
        hook = (model_forward.final_norm_hook if release.final_boundary == internals.FINAL_NORM
                else model_forward.residual_norm_hook)
        assert hook_in_place(deepseek_v2.residual_batch, norm, hook)
        assert hook_in_place(deepseek_v2.residual_batch, "complete_output", model_forward.complete_output_hook)
    else:  # the last decoder layer's output (and layer input 0 on list-in-loop)
        assert hook_in_place(deepseek_v2.DeepseekV2DecoderLayer, "forward", model_forward.decoder_layer_hook)
    if release.uses_packer:
        from sglang.srt.layers import aux_hidden_states

        assert deepseek_v2.AuxHiddenStatePacker is aux_hidden_states.AuxHiddenStatePacker
        assert hook_in_place(deepseek_v2.AuxHiddenStatePacker, "__init__", model_forward.packer_init_hook)
    if release.packer_slot:
        assert hook_in_place(deepseek_v2.AuxHiddenStatePacker, "append", capture.packer_append_hook)
    # the self-test runs around the model runner's forward, which every served forward goes through
    assert hook_in_place(model_runner.ModelRunner, "forward", served.runner_forward_hook)
    # Kimi-K2.5 delegates to its DeepseekV3ForCausalLM language model
    from sglang.srt.models import kimi_k25
    assert kimi_k25.DeepseekV3ForCausalLM is deepseek_v2.DeepseekV3ForCausalLM


def test_unknown_switch_name_refuses_to_serve(sglang_plugin, monkeypatch):
    """A typo in EAGLE3_CAPTURE_DISABLE never makes register() raise (SGLang would log a traceback and serve stock
    SGLang without the plugin): the plugin registers only its refusal, which stops the server at model load with
    one line."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from eagle3_capture.sglang.settings import switches

    with pytest.raises(ValueError, match=r"unknown hook name\(s\) \['tap'\]; expected .*'taps'"):
        switches.disabled_hooks({"EAGLE3_CAPTURE_DISABLE": "tap"})
    calls = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, path, fn, kind: calls.append((path, fn))))
    registered, skipped = dict(sglang_plugin.registered), dict(sglang_plugin.skipped)
    monkeypatch.setenv("EAGLE3_CAPTURE_DISABLE", "taps,capure")
    try:
        sglang_plugin.register()  # does not raise
        assert calls == [(sglang_plugin.LOAD_MODEL_PATH, sglang_plugin.load_model_hook)]
        with pytest.raises(RuntimeError) as e:
            sglang_plugin.load_model_hook(lambda self: pytest.fail("the model must not load"), None)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_DISABLE=")
        assert "['capure']" in msg and "EAGLE3_CAPTURE_DISABLE=all turns the plugin off" in msg
    finally:
        monkeypatch.delenv("EAGLE3_CAPTURE_DISABLE")
        switches.configure()
        sglang_plugin.registered.clear(), sglang_plugin.registered.update(registered)
        sglang_plugin.skipped.clear(), sglang_plugin.skipped.update(skipped)
    assert switches.disabled_hooks({"EAGLE3_CAPTURE_DISABLE": "all"}) == frozenset(switches.HOOKS)
    assert switches.disabled_hooks({}) == frozenset()
    # with the settings fixed, the same hook lets the model load
    assert sglang_plugin.load_model_hook(lambda self: "loaded", None) == "loaded"


@pytest.mark.parametrize("disable,dump", [("taps,capture", False), ("final_boundary", False),
                                          ("taps,capture,draft_fc,gather,selftest", True)])
def test_disable_switch_in_a_fresh_process(harness, tmp_path, disable, dump):
    """EAGLE3_CAPTURE_DISABLE leaves exactly the named hooks out of SGLang; the 61-layer ids then follow SGLang's
    own rule (taps off) or a declared final boundary fails at load (final_boundary off). With the dump on, its hooks
    (the model runner's forward, the graph runners' graph-or-eager decision, the model forward) are in place
    whatever is turned off."""
    import json

    out = tmp_path / "hooks.json"
    env = {"EAGLE3_CAPTURE_DISABLE": disable, "EAGLE3_CAPTURE_DUMP": str(tmp_path / "dump") if dump else ""}
    proc = run_script("hooks", out, env)
    rep = json.loads(out.read_text())
    from eagle3_capture.sglang.plugin import HOOKS

    off = set(disable.split(",")) | (set() if dump else {"dump"})
    on = {g for g in HOOKS if g not in off and not (g == "final_boundary" and "taps" in off)}
    assert rep["status"]["dump"] == ("on" if dump else "off (EAGLE3_CAPTURE_DUMP not set)"), rep["status"]
    for group, paths in rep["in_place"].items():
        if group == "draft_fc":
            continue
        for path, in_place in paths.items():
            # a path two groups share (the model forward, the draft-config read) stays while either is on
            want = any(path in [p for p, _ in HOOKS[g]] for g in on)
            assert in_place == want, (group, path, in_place)
    set_layers = rep["set_layers"]
    if "taps" in off:
        assert "taps hook off (EAGLE3_CAPTURE_DISABLE)" in proc.stderr
        # SGLang's own rule, as the installed release has it (0.5.23: -1 kept, never matches; 0.5.12: +1 on each)
        assert set_layers["[-1, 2, 30]"] == harness.stock_layers_to_capture([-1, 2, 30], 61)
    else:
        assert set_layers["[-1, 2, 30]"] == [0, 3, 31]
        err = set_layers["[-1, 2, 30, 60]"]
        assert "final boundary LayerOutput(60)" in err and "EAGLE3_CAPTURE_DISABLE" in err, err
