"""The plugin's adapter is chosen by what the installed SGLang has (internals.py), and an SGLang it does not
recognise -- internals patched or moved, a release outside the range -- is one line at load, never a partial
plugin. Runs against whichever release is installed (make test-sglang SGLANG=X)."""
import json
import pkgutil
import subprocess
import sys

import pytest

from sglang_fixtures import require_sglang  # noqa: F401  (fixture)

pytestmark = pytest.mark.sglang


def _release():
    from eagle3_capture.sglang.installed import internals

    return internals.detect()


def test_the_installed_release_gets_an_adapter_and_every_hook_path_resolves():
    import sglang

    from eagle3_capture.sglang.installed import internals
    from eagle3_capture.sglang import plugin

    i = _release()
    assert i.version == sglang.__version__ and i.in_range, i
    assert i.adapter in internals.ADAPTERS and i.declaration_path is not None and not i.missing, i
    table, why = plugin.hook_table(i)
    assert set(table) | set(why) == set(plugin.GROUPS) and not set(table) & set(why), (table, why)
    for group, hooks in table.items():
        for path, fn in hooks:
            obj_path, attr = path.rsplit(".", 1)
            assert callable(getattr(pkgutil.resolve_name(obj_path), attr)), (group, path)
            assert callable(fn)
    for group, reason in why.items():  # what this release cannot have says which release and why
        assert reason and "\n" not in reason, (group, reason)
    # the taps always come with the place the release reads the draft config, and SGLang's id hook
    assert [p for p, _ in table["taps"]][:2] == [i.declaration_path, internals.SET_LAYERS_TO_CAPTURE_PATH]


def test_the_adapter_follows_what_deepseek_v2_does():
    """Each adapter's defining feature, read from the installed code by another route than internals.py's."""
    import inspect

    from sglang.srt.models import deepseek_v2

    from eagle3_capture.sglang.installed import internals

    i = _release()
    layer_params = inspect.signature(deepseek_v2.DeepseekV2DecoderLayer.forward.__wrapped__
                                     if hasattr(deepseek_v2.DeepseekV2DecoderLayer.forward, "__wrapped__")
                                     else deepseek_v2.DeepseekV2DecoderLayer.forward).parameters
    has_packer = hasattr(deepseek_v2, "AuxHiddenStatePacker")
    expected = {internals.LIST_IN_LOOP: ("captured_last_layer_outputs" not in layer_params and not has_packer),
                internals.LIST_INTO_LAYER: ("captured_last_layer_outputs" in layer_params and not has_packer),
                internals.PACKER: has_packer and "residual" in layer_params,
                internals.PACKER_LAYER_BOUNDARY: has_packer and "residual" not in layer_params}
    assert expected[i.adapter], (i.adapter, list(layer_params), has_packer)
    if i.final_boundary == internals.FINAL_NORM:
        assert "capture" in inspect.signature(deepseek_v2.residual_batch.final_norm).parameters
    elif i.final_boundary == internals.RESIDUAL_NORM:
        assert "capture_output" in inspect.signature(deepseek_v2.residual_batch.norm).parameters
    else:
        assert i.final_boundary == internals.LAST_LAYER and "residual" in layer_params


def test_patched_internals_refuse_with_one_line(monkeypatch):
    """A DeepseekV2 whose capture code matches no adapter (here: its forward and its layers' forward replaced by
    ones that capture nothing) is refused: one line naming the release and what is missing."""
    from sglang.srt.models import deepseek_v2

    from eagle3_capture.sglang import plugin

    def layer_forward(self, positions, hidden_states, forward_batch):
        return hidden_states

    def model_forward(self, input_ids, positions, forward_batch):
        return input_ids

    monkeypatch.setattr(deepseek_v2.DeepseekV2DecoderLayer, "forward", layer_forward)
    monkeypatch.setattr(deepseek_v2.DeepseekV2Model, "forward", model_forward)
    i = _release()
    assert i.adapter is None and "capture" in i.missing, i
    line = plugin._release_problem(i)
    assert line is not None and "\n" not in line
    assert line.startswith(f"eagle3_capture: refusing to serve on SGLang {i.version} (adapter none)"), line
    assert "EAGLE3_CAPTURE_DISABLE=all" in line


def test_a_release_outside_the_range(monkeypatch):
    """Older than 0.5.12: refused with one line. Newer than 0.5.23 with internals an adapter matches: served, with
    one WARNING line (a hook that then does not attach stops the server at model load)."""
    import dataclasses

    from eagle3_capture.sglang import plugin

    i = _release()
    old = dataclasses.replace(i, version="0.5.11")
    line = plugin._release_problem(old)
    assert line is not None and "older than the oldest release" in line and "0.5.11" in line and "\n" not in line
    new = dataclasses.replace(i, version="0.5.24")
    assert plugin._release_problem(new) is None and not new.in_range


def test_a_hook_that_did_not_attach_stops_the_server_at_model_load(monkeypatch):
    """SGLang's HookRegistry only logs a hook it could not apply: the model-load hook checks every registered hook
    and raises one line naming the release, the group and the path."""
    from eagle3_capture.sglang import plugin
    from eagle3_capture.sglang.settings import switches

    switches.configure({})
    monkeypatch.setattr(plugin, "_release", _release())
    monkeypatch.setattr(plugin, "_refusal", None)

    def never_applied(original, *a, **k):
        return original(*a, **k)

    path = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
    monkeypatch.setitem(plugin.HOOKS, "taps", [(path, never_applied)])
    monkeypatch.setitem(plugin.registered, "taps", [path])
    with pytest.raises(RuntimeError) as e:
        plugin.load_model_hook(lambda self: pytest.fail("the model must not load"), None)
    msg = str(e.value)
    assert "\n" not in msg and f"on SGLang {plugin._release.version}" in msg and f"'taps' hook on {path}" in msg
    monkeypatch.setitem(plugin.registered, "taps", [])
    assert plugin.load_model_hook(lambda self: "loaded", None) == "loaded"


def test_info_names_the_release_and_the_adapter():
    out = subprocess.run([sys.executable, "-m", "eagle3_capture", "info"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout)["sglang"]
    i = _release()
    assert info["installed"] and info["version"] == i.version and info["adapter"] == i.adapter, info
    assert info["refusal"] is None and set(info["groups"]) >= {"taps", "final_boundary", "capture", "dump"}


def test_the_documented_row_is_what_the_plugin_does_here():
    """docs/sglang_releases.md's "The plugin on each release" row for the installed release is the plugin's own
    summary, printed the way scripts/plugin_releases_table.py prints it (regenerate the table when this fails)."""
    import importlib.util
    import os
    import sysconfig

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("plugin_releases_table",
                                                  os.path.join(repo, "scripts", "plugin_releases_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    import sglang

    # the release as the table script reads it: `eagle3-capture info` in a process of its own, with sgl_kernel
    # importable as on every GPU server (the summary in this process depends on what earlier tests imported)
    folder = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
    folder = "" if folder in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]) else folder
    want = "| " + " | ".join(table.row(table.summary(_release().version, folder))) + " |"
    doc = open(os.path.join(repo, "docs", "sglang_releases.md")).read()
    section = doc.split("## The plugin on each release", 1)[1].split("\n## ", 1)[0]
    version = _release().version
    rows = [line for line in section.splitlines() if line.startswith(f"| {version} |")]
    assert rows == [want], f"docs/sglang_releases.md's row for SGLang {version} differs from the plugin's"
