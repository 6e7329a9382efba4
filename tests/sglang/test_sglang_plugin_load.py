"""The plugin loads through SGLang's own load_plugins() from the installed entry point, and every hook is really in
place on SGLang's classes and functions (SGLang only logs a hook it could not apply)."""
import pkgutil

import pytest

from eagle3_capture.sglang.hook_chain import hook_in_place
from scenarios import run_script
from sglang_fixtures import harness, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang


def _resolve(path):
    obj_path, attr = path.rsplit(".", 1)
    return pkgutil.resolve_name(obj_path), attr


def _expected_groups(plugin):
    from eagle3_capture.sglang import draft, switches

    groups = [switches.TAPS, switches.FINAL_BOUNDARY, switches.CAPTURE]
    if draft.unavailable() is None:
        groups += [switches.DRAFT_FC, switches.GATHER]  # gather: its error poll around the draft extend
    return groups


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
    from sglang.srt.layers import aux_hidden_states
    from sglang.srt.models import deepseek_v2
    from eagle3_capture.sglang import capture, target

    plugin = sglang_plugin
    for cls in (deepseek_v2.DeepseekV2ForCausalLM, deepseek_v2.DeepseekV3ForCausalLM,
                deepseek_v2.DeepseekV32ForCausalLM):
        assert hook_in_place(cls, "set_eagle3_layers_to_capture", target.set_eagle3_layers_to_capture_hook)
    assert hook_in_place(deepseek_v2.DeepseekV2Model, "forward", target.model_forward_hook)
    # DeepseekV2Model.forward calls residual_batch.final_norm / .complete_output and AuxHiddenStatePacker(...)
    assert hook_in_place(deepseek_v2.residual_batch, "final_norm", target.final_norm_hook)
    assert hook_in_place(deepseek_v2.residual_batch, "complete_output", target.complete_output_hook)
    assert deepseek_v2.AuxHiddenStatePacker is aux_hidden_states.AuxHiddenStatePacker
    assert hook_in_place(deepseek_v2.AuxHiddenStatePacker, "__init__", target.packer_init_hook)
    assert hook_in_place(deepseek_v2.AuxHiddenStatePacker, "append", capture.packer_append_hook)
    # Kimi-K2.5 delegates to its DeepseekV3ForCausalLM language model
    from sglang.srt.models import kimi_k25
    assert kimi_k25.DeepseekV3ForCausalLM is deepseek_v2.DeepseekV3ForCausalLM


def test_unknown_switch_name_registers_nothing(sglang_plugin, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from eagle3_capture.sglang import switches

    with pytest.raises(ValueError, match=r"unknown hook name\(s\) \['tap'\]; expected .*'taps'"):
        switches.disabled_hooks({"EAGLE3_CAPTURE_DISABLE": "tap"})
    before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    registered = dict(sglang_plugin.registered)
    skipped = dict(sglang_plugin.skipped)
    monkeypatch.setenv("EAGLE3_CAPTURE_DISABLE", "taps,capure")
    try:
        with pytest.raises(ValueError, match="capure"):
            sglang_plugin.register()
        assert {k: list(v) for k, v in HookRegistry._hooks.items()} == before
    finally:
        sglang_plugin.registered.update(registered)
        sglang_plugin.skipped.update(skipped)
    assert switches.disabled_hooks({"EAGLE3_CAPTURE_DISABLE": "all"}) == frozenset(switches.HOOKS)
    assert switches.disabled_hooks({}) == frozenset()


@pytest.mark.parametrize("disable", ["taps,capture", "final_boundary"])
def test_disable_switch_in_a_fresh_process(harness, tmp_path, disable):
    """EAGLE3_CAPTURE_DISABLE leaves exactly the named hooks out of SGLang; the 61-layer ids then follow SGLang's
    own rule (taps off) or a declared final boundary fails at load (final_boundary off)."""
    import json

    out = tmp_path / "hooks.json"
    proc = run_script("hooks", out, {"EAGLE3_CAPTURE_DISABLE": disable})
    rep = json.loads(out.read_text())
    from eagle3_capture.sglang.plugin import HOOKS

    off = set(disable.split(","))
    on = {g for g in HOOKS if g not in off and not (g == "final_boundary" and "taps" in off)}
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
        assert set_layers["[-1, 2, 30]"] == [-1, 2, 30]  # SGLang 0.5.23's rule: -1 kept, never matches
    else:
        assert set_layers["[-1, 2, 30]"] == [0, 3, 31]
        err = set_layers["[-1, 2, 30, 60]"]
        assert "final boundary LayerOutput(60)" in err and "EAGLE3_CAPTURE_DISABLE" in err, err
