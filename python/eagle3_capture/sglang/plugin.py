"""SGLang 0.5.23 general plugin: entry point ``eagle3_capture = "eagle3_capture.sglang.plugin:register"`` in group
``sglang.srt.plugins``. ``sglang.srt.plugins.load_plugins()`` (called by launch_server, the engine and every
scheduler process) runs :func:`register`, which registers AROUND hooks in SGLang's HookRegistry; SGLang applies
them right after. Nothing is patched outside the registry.

SGLang only *logs* a hook it could not apply, so the plugin checks its own hooks when it reports
(:func:`hook_status`, through hook_chain.py), and the model-load log line (written by target.py, with the status
text register() hands it) says which are really in place.

register() never raises (SGLang's load_plugins() would log a traceback and serve stock SGLang without the plugin):
the settings are validated first (switches.py); a malformed one is either ignored with one ERROR line, the rest of
the plugin staying on, or makes the plugin refuse to serve: then the only hook registered is one on
``ModelRunner.load_model`` that raises that one line, which stops the server at model load.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from . import capture, draft, served, switches, target
from .hook_chain import hook_path_in_place
from .switches import logger

# the hook group of the capture dump (EAGLE3_CAPTURE_DUMP; not a name of EAGLE3_CAPTURE_DISABLE)
DUMP = "dump"
LOAD_MODEL_PATH = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


_internal_refusal: Optional[str] = None  # register() itself failed


def load_model_hook(original, self, *args, **kwargs):
    """AROUND ``ModelRunner.load_model``, registered only when the plugin refuses to serve (a setting, or its own
    registration failing): stop the server at model load with the one line that says why (SGLang surfaces an
    exception raised there: the scheduler reports it and the server exits)."""
    refusal = _internal_refusal or switches.current().refusal
    if refusal:
        raise RuntimeError(refusal)
    return original(self, *args, **kwargs)

# hook group (the EAGLE3_CAPTURE_DISABLE name) -> [(dotted target, hook function)]
HOOKS: Dict[str, List[Tuple[str, Callable]]] = {
    switches.TAPS: [
        (target.RESOLVE_AUX_IDS_PATH, target.resolve_eagle_aux_hidden_state_hook),
        (target.SET_LAYERS_TO_CAPTURE_PATH, target.set_eagle3_layers_to_capture_hook),
    ],
    switches.FINAL_BOUNDARY: [
        (target.MODEL_FORWARD_PATH, target.model_forward_hook),
        (target.PACKER_INIT_PATH, target.packer_init_hook),
        (target.FINAL_NORM_PATH, target.final_norm_hook),
        (target.COMPLETE_OUTPUT_PATH, target.complete_output_hook),
    ],
    switches.CAPTURE: [
        (capture.PACKER_APPEND_PATH, capture.packer_append_hook),
    ],
    switches.DRAFT_FC: draft.HOOKS,
    # the column-shard gather at TP > 1 runs inside the draft fc hooks; its error poll is AROUND the draft extend
    switches.GATHER: draft.GATHER_HOOKS,
    # the declaration (also read with the taps hook off) and the served forward whose output it checks
    switches.SELFTEST: [
        (target.RESOLVE_AUX_IDS_PATH, target.resolve_eagle_aux_hidden_state_hook),
        (served.RUNNER_FORWARD_PATH, served.runner_forward_hook),
    ],
    # served forwards, the doctor's stream (the model forward, with the final boundary's hooks), eager doctor
    # forwards (the graph runners' decision), the declaration (recorded with the taps hook off too)
    DUMP: [
        (target.RESOLVE_AUX_IDS_PATH, target.resolve_eagle_aux_hidden_state_hook),
        (served.RUNNER_FORWARD_PATH, served.runner_forward_hook),
        (target.MODEL_FORWARD_PATH, target.model_forward_hook),
        (target.PACKER_INIT_PATH, target.packer_init_hook),
        (target.FINAL_NORM_PATH, target.final_norm_hook),
        (target.COMPLETE_OUTPUT_PATH, target.complete_output_hook),
        (served.DECODE_GRAPH_PATH, served.graph_gate_hook),
        (served.PREFILL_GRAPH_PATH, served.graph_gate_hook),
        (served.CPU_GRAPH_PATH, served.graph_gate_hook),
    ],
}

# Filled by register(): what was registered, and why a group was not.
registered: Dict[str, List[str]] = {}
skipped: Dict[str, str] = {}


def _group_unavailable(group: str) -> Optional[str]:
    """Why a group cannot be installed in this environment (None if it can)."""
    if group == switches.CAPTURE:
        try:
            capture.load_ops()
        except Exception as e:
            return f"the capture op does not load: {e}"
    if group == switches.DRAFT_FC:
        return draft.unavailable()
    if group == switches.GATHER:
        if switches.DRAFT_FC in switches.current().disabled:
            return "used only by the draft_fc hooks, which are off"
        return draft.unavailable() or draft.gather_unavailable()
    return None


def plan(settings: switches.Settings) -> Dict[str, List[Tuple[str, Callable]]]:
    """The hook groups register() installs for these settings (without touching SGLang)."""
    out = {}
    for group, hooks in HOOKS.items():
        if group == DUMP:
            if settings.dump is not None:
                out[group] = hooks
            continue
        if group in settings.disabled:
            continue
        if group == switches.FINAL_BOUNDARY and switches.TAPS in settings.disabled:
            continue  # stock SGLang never asks for the final boundary (the dump's group brings its own hooks)
        out[group] = hooks
    return out


def register() -> None:
    """Entry point called by SGLang's load_plugins(): validate the settings, register the hooks they leave on.
    Does not raise for any setting; should registering itself fail, the plugin refuses to serve instead of letting
    SGLang serve without it."""
    global _internal_refusal
    try:
        _register()
    except Exception as e:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        _internal_refusal = (f"eagle3_capture: refusing to serve: the plugin failed to register "
                             f"({type(e).__name__}: {e})")
        switches.announce("error", _internal_refusal)
        HookRegistry.register(LOAD_MODEL_PATH, load_model_hook, HookType.AROUND)


def _register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered.clear()
    skipped.clear()
    target.report_hook_status_with(_status_text)  # the startup line at model load says which hooks are in place
    settings = switches.configure()
    for line in settings.errors:
        switches.announce("error", line)
    if settings.refusal is not None:
        switches.announce("error", settings.refusal)
        HookRegistry.register(LOAD_MODEL_PATH, load_model_hook, HookType.AROUND)
        registered["refusal"] = [LOAD_MODEL_PATH]
        for group in HOOKS:
            skipped[group] = "the plugin refuses to serve (see the ERROR line)"
        return
    disabled = settings.disabled
    for group in switches.HOOKS:
        if group in disabled:
            skipped[group] = f"turned off by {switches.ENV_DISABLE}"
    if settings.dump is None:
        skipped[DUMP] = f"{switches.ENV_DUMP} not set" if not settings.source.get(switches.ENV_DUMP, "").strip() \
            else "a setting of the dump is malformed (see the ERROR line)"
    done = set()  # a hook two groups share (the model forward, the draft-config read) is registered once
    for group, hooks in plan(settings).items():
        why = _group_unavailable(group)
        if why is not None:
            skipped[group] = why
            switches.announce("warning", f"eagle3_capture: hook '{group}' not installed: {why}")
            continue
        for path, fn in hooks:
            if (path, fn) not in done:
                HookRegistry.register(path, fn, HookType.AROUND)
                done.add((path, fn))
        registered[group] = [path for path, _ in hooks]
    if switches.TAPS in disabled:
        # No model-load line comes from the taps hook: this is the startup line.
        switches.announce("info", f"eagle3_capture: taps hook off ({switches.ENV_DISABLE}): SGLang's own layer-id "
                                  f"rule applies; {_status_text(pending=True)}")
    else:
        logger.debug("eagle3_capture: registered %s", registered)


# ----------------------------------------------------------------------------------------------------------------
# Is a hook really in place?
# ----------------------------------------------------------------------------------------------------------------

def hook_status() -> Dict[str, str]:
    """Per hook group: 'on' (every target hooked), 'off (<why>)', or 'NOT APPLIED (<targets>)'."""
    out = {}
    for group, hooks in HOOKS.items():
        if group not in registered:
            out[group] = f"off ({skipped.get(group, 'not registered')})"
            continue
        missing = [p for p, fn in hooks if not hook_path_in_place(p, fn)]
        out[group] = "on" if not missing else f"NOT APPLIED ({', '.join(missing)}; see SGLang's hook log)"
    return out


def _status_text(pending: bool = False) -> str:
    if pending:  # before SGLang applied the hooks: say what is registered
        parts = [f"{g}={'registered' if g in registered else 'off'}" for g in HOOKS]
    else:
        parts = [f"{g}={s}" for g, s in hook_status().items()]
    return "hooks: " + " ".join(parts) + f" (turn off with {switches.ENV_DISABLE}=<names>)"


__all__ = ["register", "HOOKS", "DUMP", "LOAD_MODEL_PATH", "load_model_hook", "registered", "skipped", "plan",
           "hook_status"]
