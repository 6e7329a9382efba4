"""SGLang general plugin: entry point ``eagle3_capture = "eagle3_capture.sglang.plugin:register"`` in group
``sglang.srt.plugins`` (the same registry on every release from 0.5.12 through 0.5.23).
``sglang.srt.plugins.load_plugins()`` (called by launch_server, the engine and every scheduler process) runs
:func:`register`, which registers AROUND hooks in SGLang's HookRegistry; SGLang applies them right after. Nothing is
patched outside the registry.

Which hooks: the installed release's, found by installed/internals.py (feature detection: one adapter per shape of
SGLang's capture code). A hook group the release cannot have is left out with its reason, which the startup line at
model load repeats (e.g. ``capture`` on a release whose captures are a Python list).

SGLang only *logs* a hook it could not apply, so the plugin checks its own: at every ``ModelRunner.load_model``
(:func:`load_model_hook`) every registered hook must be in place, else the server stops there with one line naming
the release and the hook -- a partial plugin never serves silently. The model-load log line (written by taps/target.py,
with the status text register() hands it) says which hooks are in place.

register() never raises (SGLang's load_plugins() would log a traceback and serve stock SGLang without the plugin):
the settings are validated first (settings/switches.py); a malformed one is either ignored with one ERROR line, the
rest of the plugin staying on, or makes the plugin refuse to serve: then the only hook registered is the one on
``ModelRunner.load_model``, which raises that one line and so stops the server at model load. So do SGLang
internals the plugin does not recognise, and a failure of registration itself.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from . import draft, served
from .installed import internals
from .installed.hook_chain import hook_path_in_place
from .monitor import admission, exporter, histogram, live, selftest
from .settings import switches
from .settings.switches import logger
from .taps import capture, model_forward, target

# the hook group of the capture dump (EAGLE3_CAPTURE_DUMP; not a name of EAGLE3_CAPTURE_DISABLE)
DUMP = "dump"
LOAD_MODEL_PATH = internals.LOAD_MODEL_PATH
GROUPS = switches.HOOKS + (DUMP,)

Hooks = List[Tuple[str, Callable]]

# Filled by register(): the hook table of the installed release, what was registered, and why a group was not.
HOOKS: Dict[str, Hooks] = {}
unavailable: Dict[str, str] = {}   # groups the installed release cannot have, and why
registered: Dict[str, List[str]] = {}
skipped: Dict[str, str] = {}
_refusal: Optional[str] = None     # why the plugin refuses to serve (settings, internals, its own registration)
_release: Optional[internals.Internals] = None


def load_model_hook(original, self, *args, **kwargs):
    """AROUND ``ModelRunner.load_model``: stop the server at model load with one line when the plugin refuses to
    serve, or when a hook it registered is not in place (SGLang surfaces an exception raised there: the scheduler
    reports it and the server exits)."""
    refusal = _refusal or switches.current().refusal or _not_in_place()
    if refusal:
        raise RuntimeError(refusal)
    if self is not None and not getattr(self, "is_draft_worker", False):
        refusal = _at_target_load(self)
        if refusal:
            raise RuntimeError(refusal)
    return original(self, *args, **kwargs)


def _at_target_load(runner) -> Optional[str]:
    """The target's server args are known: configure the export, start counting acceptance (group
    ``acceptance``). Returns a refusal line (EAGLE3_CAPTURE_PROFILE_REQUIRED=1 without a usable profile); anything
    else that goes wrong is one ERROR line, never an exception into SGLang."""
    server_args = getattr(runner, "server_args", None)
    if server_args is None:
        return None
    alarm = switches.current().alarm
    try:
        server_args = histogram.resolved(server_args)
        tp = getattr(runner, "tp_rank", None)  # 0.5.12-0.5.15; later releases keep it in their parallel context
        exporter.configure(server_args, tp if tp is not None else histogram.tp_rank())
        if switches.ACCEPTANCE in registered:
            return live.at_model_load(server_args, alarm)
    except Exception as e:
        line = f"setting up the acceptance counts failed ({type(e).__name__}: {e})"
        histogram.stop()
        if alarm.required:
            return f"eagle3_capture: refusing to serve: {switches.ENV_PROFILE_REQUIRED}=1 and {line}"
        switches.announce("error", f"eagle3_capture: {line}; counting and the alarm are off in this process")
        return None
    if alarm.required:
        return (f"eagle3_capture: refusing to serve: {switches.ENV_PROFILE_REQUIRED}=1 and the acceptance hook is "
                f"off ({skipped.get(switches.ACCEPTANCE, 'not registered')})")
    return None


def _not_in_place() -> Optional[str]:
    for group, paths in registered.items():
        for path, fn in HOOKS.get(group, ()):
            if path in paths and not hook_path_in_place(path, fn):
                where = _release.describe() if _release is not None else "this SGLang"
                return (f"eagle3_capture: refusing to serve on {where}: the '{group}' hook on {path} did not attach "
                        "(SGLang's HookRegistry logged why; its internals may have been patched or moved); "
                        f"{switches.ENV_DISABLE}={group} leaves that hook out")
    return None


def hook_table(i: internals.Internals) -> Tuple[Dict[str, Hooks], Dict[str, str]]:
    """(group -> [(dotted path, hook)], group -> why the release `i` cannot have it) for every hook group."""
    table: Dict[str, Hooks] = {}
    why: Dict[str, str] = {}
    declaration = {internals.RESOLVE_AUX_IDS_PATH: target.resolve_eagle_aux_hidden_state_hook,
                   internals.BUILD_MODEL_CONFIG_PATH: target.build_model_config_hook,
                   internals.FROM_SERVER_ARGS_PATH: target.from_server_args_hook}
    decl = [(i.declaration_path, declaration[i.declaration_path])] if i.declaration_path in declaration else []
    first = model_forward.first_layer_hooks(i)
    final = model_forward.final_boundary_hooks(i)
    table[switches.TAPS] = decl + [(internals.SET_LAYERS_TO_CAPTURE_PATH, target.set_eagle3_layers_to_capture_hook)]
    table[switches.TAPS] += first
    if final is not None:
        table[switches.FINAL_BOUNDARY] = final
    else:
        why[switches.FINAL_BOUNDARY] = i.missing.get("final_boundary", "no source of the final boundary found")
    if i.packer_slot:
        table[switches.CAPTURE] = [(internals.PACKER_APPEND_PATH, capture.packer_append_hook)]
    elif i.uses_packer:
        why[switches.CAPTURE] = (f"SGLang {i.version}'s AuxHiddenStatePacker has no slot(): its append allocates and "
                                 "copies by itself (that copy stays; the taps are exact)")
    else:
        why[switches.CAPTURE] = (f"SGLang {i.version} keeps the captures in a Python list that its logits processor "
                                 "concatenates: no packed buffer to write into (SGLang's own captures stay; the "
                                 "taps are exact)")
    table[switches.DRAFT_FC] = list(draft.HOOKS)
    if not i.mla_fc_sharded:
        why[switches.GATHER] = (f"the MLA draft's fc is a replicated nn.Linear in SGLang {i.version}: no column "
                                "shards to gather")
    elif not i.draft_extend_paths:
        why[switches.GATHER] = "no EagleDraftWorker draft extend to poll the gather's errors around"
    else:
        table[switches.GATHER] = draft.gather_hooks(i)
    runner = [(served.RUNNER_FORWARD_PATH, served.runner_forward_hook)]
    # the self-test: the declaration, served forwards, re-arming after each weight update, refusing requests
    # (raise mode) after one that failed while serving
    table[switches.SELFTEST] = (decl + runner + [(p, selftest.weight_update_hook) for p in i.weight_update_paths]
                                + ([(i.admission_path, admission.add_request_hook)] if i.admission_path else []))
    if i.acceptance_path is not None:
        table[switches.ACCEPTANCE] = [(i.acceptance_path, histogram.update_histogram_hook)]
    else:
        why[switches.ACCEPTANCE] = i.missing.get("acceptance", "no place where SGLang counts correct drafts")
    # the dump: served forwards, the doctor's stream (the model forward with what it needs on this release), eager
    # doctor forwards (the graph runners' decisions), the declaration (recorded with the taps hook off too)
    stream_hooks = (final if final is not None else [(internals.MODEL_FORWARD_PATH, model_forward.model_forward_hook)])
    table[DUMP] = _unique(decl + runner + stream_hooks + first + served.graph_gate_hooks(i))
    return table, why


def _unique(hooks: Hooks) -> Hooks:
    out: Hooks = []
    for h in hooks:
        if h not in out:
            out.append(h)
    return out


def _release_problem(i: internals.Internals) -> Optional[str]:
    """Why the plugin cannot serve on the installed SGLang at all (None: it can)."""
    essentials = [k for k in i.missing if k not in ("final_boundary", "capture_mode", "acceptance", "admission")]
    if i.adapter is None or i.declaration_path is None or essentials:
        found = "; ".join(f"{v}" for k, v in i.missing.items())
        return (f"eagle3_capture: refusing to serve on {i.describe()}: its internals match none of the plugin's "
                f"adapters ({found}); the plugin was read against SGLang {internals.range_text()} "
                f"({switches.ENV_DISABLE}=all serves stock SGLang)")
    v = internals.version_tuple(i.version)
    if v is not None and v[:3] < internals.OLDEST:
        return (f"eagle3_capture: refusing to serve on SGLang {i.version}: older than the oldest release the plugin "
                f"supports ({internals.range_text()}) ({switches.ENV_DISABLE}=all serves stock SGLang)")
    return None


def release_summary() -> dict:
    """What the plugin does on the installed SGLang, for ``eagle3-capture info``: the release, the adapter, where
    the final boundary comes from, and per hook group the hooks or why that release cannot have it."""
    if internals.installed_version() is None:
        return {"installed": False}
    i = internals.current()
    table, why = hook_table(i)
    problem = _release_problem(i)
    return {"installed": True, "version": i.version, "adapter": i.adapter, "final_boundary": i.final_boundary,
            "in_range": i.in_range, "supported": f"{internals.range_text()}", "refusal": problem,
            "groups": {g: ({"hooks": [p for p, _ in table[g]]} if g in table else {"unavailable": why.get(g)})
                       for g in GROUPS}}


def plan(settings: switches.Settings) -> Dict[str, Hooks]:
    """The hook groups register() installs for these settings (from the hook table of the installed release)."""
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


def register() -> None:
    """Entry point called by SGLang's load_plugins(): validate the settings, look at the installed SGLang, register
    the hooks they leave on. Does not raise for any setting or release; should registering itself fail, the plugin
    refuses to serve instead of letting SGLang serve without it."""
    global _refusal
    try:
        _register()
    except Exception as e:
        _refuse(f"eagle3_capture: refusing to serve: the plugin failed to register ({type(e).__name__}: {e})")


def _refuse(line: str, *, from_settings: bool = False) -> None:
    """Register only the model-load hook, which raises `line`. A refusal that comes from the settings is read from
    them at model load (switches.current().refusal), not kept here."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    global _refusal
    _refusal = None if from_settings else line
    switches.announce("error", line)
    HookRegistry.register(LOAD_MODEL_PATH, load_model_hook, HookType.AROUND)
    registered.clear()
    registered["refusal"] = [LOAD_MODEL_PATH]
    for group in GROUPS:
        skipped[group] = "the plugin refuses to serve (see the ERROR line)"


def _register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    global _refusal, _release
    registered.clear()
    skipped.clear()
    _refusal = None
    target.report_hook_status_with(_status_text)  # the startup line at model load says which hooks are in place
    settings = switches.configure()
    for line in settings.errors:
        switches.announce("error", line)
    if settings.refusal is not None:
        _refuse(settings.refusal, from_settings=True)
        return
    disabled = settings.disabled
    if settings.all_off or (disabled >= frozenset(switches.HOOKS) and settings.dump is None):
        # EAGLE3_CAPTURE_DISABLE=all (or every hook named, no dump): nothing of the plugin, not even a look at
        # SGLang's internals; this is the startup line. `all` leaves the dump off too, and says so when it was set.
        dump_dir = (settings.source.get(switches.ENV_DUMP) or "").strip()
        dropped = settings.all_off and bool(dump_dir)
        for group in GROUPS:
            skipped[group] = (f"turned off by {switches.ENV_DISABLE}" if group != DUMP else
                              f"turned off by {switches.ENV_DISABLE}=all" if dropped else
                              f"{switches.ENV_DUMP} not set")
        line = (f"eagle3_capture: taps hook off ({switches.ENV_DISABLE}): SGLang's own layer-id rule applies; every "
                f"hook off ({switches.ENV_DISABLE}=all): stock SGLang serves")
        if dropped:
            line += (f"; {switches.ENV_DUMP}={dump_dir!r} is not used either: {switches.ENV_DISABLE}=all turns the "
                     f"whole plugin off, the dump included (to dump a stock deployment, name the hooks: "
                     f"{switches.ENV_DISABLE}={','.join(switches.HOOKS)})")
        switches.announce("warning" if dropped else "info", line)
        return
    _release = internals.current()
    table, why_not = hook_table(_release)
    HOOKS.clear()
    HOOKS.update(table)
    unavailable.clear()
    unavailable.update(why_not)
    problem = _release_problem(_release)
    if problem is not None:
        _refuse(problem)
        return
    if not _release.in_range:
        switches.announce("warning", f"eagle3_capture: {_release.describe()} is outside the releases the plugin was "
                                     f"read against ({internals.range_text()}); its internals match that adapter, "
                                     "so the plugin serves with it and stops the server at model load if a hook "
                                     "does not attach")
    for group in switches.HOOKS:
        if group in disabled:
            skipped[group] = f"turned off by {switches.ENV_DISABLE}"
        elif group in why_not:
            skipped[group] = f"not on {_release.describe()}: {why_not[group]}"
    if settings.dump is None:
        skipped[DUMP] = f"{switches.ENV_DUMP} not set" if not settings.source.get(switches.ENV_DUMP, "").strip() \
            else "a setting of the dump is malformed (see the ERROR line)"
    done = set()  # a hook two groups share (the model forward, the draft-config read) is registered once
    HookRegistry.register(LOAD_MODEL_PATH, load_model_hook, HookType.AROUND)
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
        switches.announce("info", f"eagle3_capture: {_release.describe()}: taps hook off ({switches.ENV_DISABLE}): "
                                  f"SGLang's own layer-id rule applies; {_status_text(pending=True)}")
    else:
        logger.debug("eagle3_capture: registered %s", registered)


# ----------------------------------------------------------------------------------------------------------------
# Is a hook really in place?
# ----------------------------------------------------------------------------------------------------------------

def hook_status() -> Dict[str, str]:
    """Per hook group: 'on' (every target hooked), 'off (<why>)', or 'NOT APPLIED (<targets>)'."""
    out = {}
    for group in GROUPS:
        if group not in registered:
            out[group] = f"off ({skipped.get(group) or unavailable.get(group) or 'not registered'})"
            continue
        missing = [p for p, fn in HOOKS[group] if not hook_path_in_place(p, fn)]
        out[group] = "on" if not missing else f"NOT APPLIED ({', '.join(missing)}; see SGLang's hook log)"
    return out


def _status_text(pending: bool = False) -> str:
    if pending:  # before SGLang applied the hooks: say what is registered
        parts = [f"{g}={'registered' if g in registered else 'off'}" for g in GROUPS]
    else:
        parts = [f"{g}={s}" for g, s in hook_status().items()]
    return "hooks: " + " ".join(parts) + f" (turn off with {switches.ENV_DISABLE}=<names>)"


__all__ = ["register", "HOOKS", "GROUPS", "DUMP", "LOAD_MODEL_PATH", "load_model_hook", "registered", "skipped",
           "unavailable", "plan", "hook_table", "hook_status", "release_summary"]
