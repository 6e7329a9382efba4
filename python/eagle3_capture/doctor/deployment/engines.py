"""What each serving engine makes of the draft's ids: stock SGLang on the release modelled (and on every other
release), its capture-only mode, stock vLLM, and this project's plugin. Each engine's part of ``doctor check``'s
findings is one function here (:func:`sglang_reading`, :func:`vllm_reading`, :func:`plugin_view`); the release
models are the package's engine-free ``sglang_releases`` and ``vllm_rules``."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from ... import configs
from ... import sglang_releases as releases
from ... import vllm_rules
from ...findings import Finding
from ...sglang_releases import NativeCapture, ReleaseSpan, SGLangRelease, compare_native_capture
from ...spec import DRAFT_IDS, LAYER_INPUTS, TapError, TapSpec
from ..common import DoctorError
from ..sglang_model.server_args import ServerFlags

ENGINE_SGLANG = "sglang"
ENGINE_VLLM = "vllm"
ENGINES = (ENGINE_SGLANG, ENGINE_VLLM)


def plugin_capture(declared: TapSpec, flags: Optional[ServerFlags]) -> Tuple[List[object], str]:
    """What this project's SGLang plugin captures: exactly the declared taps (the final boundary included, from the
    final norm), in declared order."""
    note = "exactly the declared taps"
    if declared.includes_final_boundary:
        note += f" (the final boundary {declared.final_boundary!r} from the final norm's fused add)"
    return list(declared.taps), note



def sglang_release(sglang_version: Optional[str]) -> Tuple[SGLangRelease, str, Optional[str]]:
    try:
        return releases.assumed_release(sglang_version)
    except ValueError as e:  # argparse checks the flag first; a caller of run_check may pass anything
        raise DoctorError(f"--sglang-version: {e}") from None


def stock_sglang(declared: TapSpec, draft: configs.DraftConfig, target: configs.TargetConfig,
                 rel: SGLangRelease, fam: str, cuda_graphs: bool, plugin_serves: bool
                 ) -> Tuple[NativeCapture, List[Finding]]:
    """What stock SGLang ``rel`` captures for the draft's ids, as findings prefixed "sglang-" (info instead of
    error when the plugin serves the model instead)."""
    ids = configs.target_ids(draft, rel)  # what the target side of this release reads
    native = releases.native_capture(ids, target.num_layers, target.hidden_size, rel, fam, cuda_graphs=cuda_graphs)
    stock = compare_native_capture(declared, native)
    v = rel.version
    if stock and fam == releases.FAMILY_DEEPSEEK_V2 and ids and draft.convention == DRAFT_IDS:
        cite = rel.cite("id-rule")
        if rel.id_rule == releases.ID_RULE_PLUS_ONE_IF_FIRST_IS_1 and ids[0] != 1:
            stock.insert(0, Finding(
                "error", "plus-one-rule",
                f"SGLang {v}'s DeepseekV2 turns draft ids into layer inputs (+1) only when ids[0] == 1 ({cite}); "
                f"here ids[0] = {ids[0]}, so {ids} are used as layer-input indices unchanged: each draft id d is "
                "read as LayerOutput(d-1)" + (", and -1 matches no layer" if -1 in ids else ""), stock[0].fix))
        elif rel.id_rule == releases.ID_RULE_PLUS_ONE_ALWAYS and -1 in ids:
            stock.insert(0, Finding(
                "error", "plus-one-rule",
                f"SGLang {v}'s DeepseekV2 adds 1 to every draft id ({cite}): -1 becomes layer input 0, the "
                f"embedding, which {v}'s DeepseekV2Model.forward cannot capture (it adds the residual, still None "
                "there)", stock[0].fix))
    out = []
    for f in stock:
        severity = "info" if plugin_serves else f.severity
        code = f.code if f.code.startswith("plus") else "sglang-" + f.code
        out.append(Finding(severity, code, f"stock SGLang {v}: " + f.message
                           + (" (not with the plugin, which captures the declared taps)" if plugin_serves else ""),
                           f.fix))
    return native, out


def release_findings(declared: TapSpec, rel: SGLangRelease, outlook: List[ReleaseSpan]) -> List[Finding]:
    """An info finding naming the releases on which stock SGLang captures the declared taps from these ids, when
    the modelled one does not (what an upgrade or a downgrade would change)."""
    good = [sp for sp in outlook if sp.native.error is None and sp.native.captured_taps == declared.taps
            and sp.native.graph is None]
    here = next((sp for sp in outlook if sp.contains(rel.version)), None)
    if here is None or here in good or len(outlook) < 2:
        return []
    if good:
        where = ", ".join(sp.label() for sp in good)
        return [Finding("info", "sglang-other-releases",
                        f"stock SGLang {where} would capture the declared taps from these ids ({rel.version} does "
                        "not): see 'stock SGLang on other releases' above", "")]
    return [Finding("info", "sglang-other-releases",
                    f"no stock SGLang release from {releases.OLDEST} to {releases.NEWEST} captures the declared "
                    "taps from these ids (see 'stock SGLang on other releases' above)", "")]


def capture_only_lines(declared: TapSpec, draft: configs.DraftConfig, rel: SGLangRelease, fam: str) -> List[str]:
    """The capture-only mode of ``rel`` (--enable-return-aux-hidden-states): what the draft's ids capture there,
    and which ids capture the trained taps."""
    v = rel.version
    if not rel.capture_only_mode:
        first = next(r.version for r in releases.RELEASES if r.capture_only_mode)
        return [f"capture-only mode (--enable-return-aux-hidden-states): not in SGLang {v} (from {first} on)"]
    flag = "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3"
    L, H = declared.num_layers, declared.hidden_size
    lines = [f"capture-only mode on SGLang {v} ({flag}, pp 1; {rel.cite('capture-only')}):"]
    ids = draft.layer_ids if draft.convention == DRAFT_IDS else None
    if ids is not None:
        c = releases.capture_only(ids, L, H, rel, fam)
        got = f"captures {list(c.captured_taps)}" if not c.error else f"fails: {c.error}"
        lines.append(f"  --return-aux-hidden-state-layer-ids {' '.join(map(str, ids))} (the draft's ids) {got}")
    try:
        want = releases.capture_only_ids_for(declared, rel, fam)
        lines.append(f"  the trained taps {list(declared.taps)}: --return-aux-hidden-state-layer-ids "
                     f"{' '.join(map(str, want))}")
    except (TapError, ValueError) as e:
        lines.append(f"  the trained taps {list(declared.taps)}: no ids capture them ({e})")
    return lines


def stock_vllm(declared: TapSpec, raw_draft: dict, target: configs.TargetConfig, vfam: str,
               vrel: vllm_rules.VLLMRelease):
    cap = vllm_rules.vllm_capture(raw_draft, target.num_layers, target.hidden_size, vfam, vrel)
    out = [Finding(f.severity, "vllm-" + f.code, f.message, f.fix)
           for f in vllm_rules.compare_vllm_capture(declared, cap)]
    alt = None
    for runner in vrel.runners:
        if runner == cap.reading.runner:
            continue
        other = vllm_rules.vllm_capture(raw_draft, target.num_layers, target.hidden_size, vfam, vrel, runner)
        if (other.stored, other.captured_inputs, other.error) != (cap.stored, cap.captured_inputs, cap.error):
            alt = other
            out.append(Finding(
                "info", "vllm-runner-dependent",
                f"vLLM {vrel.version} with runner {runner} (VLLM_USE_V2_MODEL_RUNNER=0) reads {other.reading.key} and "
                f"captures {list(other.captured_taps)}" + (f", then fails: {other.error}" if other.error else "")
                + f"; the default runner {cap.reading.runner} captures {list(cap.captured_taps)}", ""))
    return cap, alt, out


def vllm_release(vllm_version: Optional[str]) -> Tuple[vllm_rules.VLLMRelease, str, Optional[str]]:
    try:
        return vllm_rules.assumed_vllm_release(vllm_version)
    except ValueError as e:
        raise DoctorError(f"--vllm-version: {e}") from None


def sglang_reading(declared: TapSpec, draft: configs.DraftConfig, target: configs.TargetConfig, rel: SGLangRelease,
                   fam: Optional[str], flags: Optional[ServerFlags], plugin_serves: bool
                   ) -> Tuple[Optional[NativeCapture], List[ReleaseSpan], List[str], List[Finding]]:
    """Stock SGLang's reading of the draft on ``rel`` and on every other release: (native capture, the other
    releases' outlook, the capture-only mode's lines, findings)."""
    findings: List[Finding] = []
    native, outlook, capture_only = None, [], []
    model_types = (target.model_type, target.top_model_type)
    unsupported = None if fam is None else releases.model_support_error(rel, model_types)
    if fam is None:
        findings.append(Finding("info", "unmodelled-family",
                                f"target model_type {target.model_type!r}: stock SGLang's capture for it is not "
                                "modelled here; only the plugin's (DeepseekV2 family) is"))
    elif unsupported:
        findings.append(Finding("error", "sglang-model-unsupported", f"stock SGLang {rel.version}: {unsupported}",
                                "upgrade SGLang"))
    elif not draft.use_aux_hidden_state:
        findings.append(Finding("error", "no-capture",
                                "eagle_config.use_aux_hidden_state is false: SGLang captures nothing",
                                "remove use_aux_hidden_state=false"))
    else:
        # server_args.py does not model the flag; it keeps the names it skips
        cuda_graphs = not (flags is not None and any(n.replace("_", "-") == "--disable-cuda-graph"
                                                     for n in flags.ignored))
        native, stock = stock_sglang(declared, draft, target, rel, fam, cuda_graphs, plugin_serves)
        findings += stock
        # every modelled release reads its ids at the same key (SGLangRelease.ids_key): one list for all of them
        outlook = releases.release_outlook(configs.target_ids(draft, rel), target.num_layers, target.hidden_size,
                                           fam, model_types, cuda_graphs=cuda_graphs)
        findings += release_findings(declared, rel, outlook)
        capture_only = capture_only_lines(declared, draft, rel, fam)
    return native, outlook, capture_only, findings


def vllm_reading(declared: TapSpec, draft: configs.DraftConfig, raw_draft: dict, target: configs.TargetConfig,
                 vrel: vllm_rules.VLLMRelease):
    """Stock vLLM's reading of the draft on ``vrel``: (capture, the other runner's when it differs, findings)."""
    findings: List[Finding] = []
    vcap, valt = None, None
    vfam = vllm_rules.vllm_family(target.model_type) or vllm_rules.vllm_family(target.top_model_type)
    if vfam is None:
        findings.append(Finding("info", "unmodelled-family",
                                f"target model_type {target.model_type!r}: vLLM's capture for it is not modelled "
                                "here"))
    elif not draft.use_aux_hidden_state:
        findings.append(Finding("error", "no-capture",
                                "eagle_config.use_aux_hidden_state is false: vLLM captures nothing "
                                "(eagle3_utils.py requires_aux_hidden_states)", "remove use_aux_hidden_state=false"))
    else:
        try:
            vcap, valt, vf = stock_vllm(declared, raw_draft, target, vfam, vrel)
            findings += vf
        except TapError as e:
            findings.append(Finding("error", "vllm-ids-invalid", str(e), "fix the draft config's ids"))
    return vcap, valt, findings


def vllm_draft(draft: configs.DraftConfig, raw_draft: dict, target: configs.TargetConfig,
               vrel: vllm_rules.VLLMRelease) -> Tuple[configs.DraftConfig, List[Finding]]:
    """The draft as a vLLM deployment reads it. Ids without a declared convention mean what vLLM makes of them,
    layer inputs (0 = the embedding), at the key vLLM's default runner reads: how stock vLLM and this project's vLLM
    plugin (eagle3_capture/vllm/declaration.py) serve them, and how speculators writes them. A declared convention
    or no ids at all: the draft as read. Where the draft also carries other ids that, read as SpecForge's draft ids,
    name other taps, a warning says the file is ambiguous."""
    ec = raw_draft.get("eagle_config") if isinstance(raw_draft.get("eagle_config"), dict) else {}
    if "eagle_aux_hidden_state_convention" in ec:
        return draft, []
    try:
        reading = vllm_rules.read_aux_layer_ids(raw_draft, vrel.default_runner)
    except TapError:
        return draft, []  # stock_vllm reports the ids vLLM cannot read
    if reading.default or reading.ids is None:
        return draft, []
    read = dataclasses.replace(draft, layer_ids=list(reading.ids), layer_ids_source=reading.key,
                               convention=LAYER_INPUTS)
    note = Finding("info", "vllm-ids-read-as-layer-inputs",
                   f"{reading.key} {list(reading.ids)} declare no convention ({configs.CONVENTION_KEY}): read as "
                   f"vLLM {vrel.version} (runner {vrel.default_runner}) reads them, layer inputs (0 = the embedding), "
                   "as stock vLLM and the eagle3-capture vLLM plugin serve them; SpecForge writes draft ids (d = the "
                   "output of layer d) instead",
                   f"if the draft was trained on draft ids, declare {configs.CONVENTION_KEY} = \"{DRAFT_IDS}\"")
    if draft.layer_ids is not None and draft.layer_ids_source != reading.key:
        try:
            as_draft_ids, as_vllm = configs.draft_taps(draft, target).taps, configs.draft_taps(read, target).taps
        except (TapError, ValueError):
            as_draft_ids, as_vllm = None, None
        if as_draft_ids is not None and as_draft_ids != as_vllm:
            note = Finding("warning", "vllm-ids-ambiguous",
                           f"vLLM {vrel.version} (runner {vrel.default_runner}) reads {reading.key} "
                           f"{list(reading.ids)} as layer inputs, {list(as_vllm)}, and so does the eagle3-capture vLLM "
                           f"plugin; {draft.layer_ids_source} {draft.layer_ids}, read as SpecForge's draft ids, are "
                           f"{list(as_draft_ids)}; no convention is declared, so which the draft was trained on is not "
                           "in the file",
                           f"declare {configs.CONVENTION_KEY} (\"{DRAFT_IDS}\" or \"{LAYER_INPUTS}\") and write the "
                           "top-level ids in it")
    return read, [note]


def vllm_plugin_view(raw_draft: dict, target: configs.TargetConfig, vrel: vllm_rules.VLLMRelease
                     ) -> Tuple[Optional[List[object]], str]:
    """What this project's vLLM plugin captures on ``vrel``'s default runner, or the line it refuses with."""
    from ...vllm.declaration import DeclarationError, describe, read_declaration

    try:
        decl = read_declaration(raw_draft, vrel.default_runner, target.num_layers, target.hidden_size,
                                vrel.version)
    except DeclarationError as e:
        return None, f"the eagle3-capture vLLM plugin refuses this draft at load: {e}"
    return list(decl.spec.taps), (f"vLLM plugin on vLLM {vrel.version}, runner {vrel.default_runner}: "
                                  f"{describe(decl)}")


def plugin_view(declared: TapSpec, flags: Optional[ServerFlags], engine: str, fam: Optional[str],
                rel: Optional[SGLangRelease], target: configs.TargetConfig) -> Tuple[Optional[List[object]], str]:
    """What this project's SGLang plugin captures for the deployment, or why it does not serve it: (taps or None,
    note). vLLM's: :func:`vllm_plugin_view`."""
    plugin_taps, plugin_note = plugin_capture(declared, flags)
    if fam is not None and fam != releases.FAMILY_DEEPSEEK_V2:
        return None, (f"the plugin hooks the DeepseekV2 family only; {target.model_type} is served by stock SGLang's "
                      "rule")
    if not rel.plugin_registry:
        return None, (f"SGLang {rel.version} has no plugin registry (sglang.srt.plugins, in 0.5.11 on): the plugin "
                      "cannot load there")
    return plugin_taps, plugin_note + f"; adapter {rel.variant} on SGLang {rel.version}"


__all__ = ["ENGINE_SGLANG", "ENGINE_VLLM", "ENGINES", "plugin_capture", "sglang_release", "vllm_release",
           "stock_sglang", "release_findings", "capture_only_lines", "stock_vllm", "sglang_reading", "vllm_reading",
           "vllm_draft", "vllm_plugin_view",
           "plugin_view"]
