"""``doctor check``: the taps a draft was trained on against what stock SGLang (the release assumed: given, else
the installed one, else the newest modelled; every release 0.5.8 - 0.5.23 is modelled in sglang_releases/) or
stock vLLM (``--engine vllm``, vllm_rules.py) and this project's plugin capture, what changes on other SGLang
releases, every inconsistency of the configs, the server-flag traps, and -- when both dumps are given -- the
fingerprint of what a server really captured.

Each :class:`~eagle3_capture.findings.Finding` carries its fix; the exit code is non-zero when any finding is an
error. The pieces come from the rest of the package: config reading (``configs``), tap conventions and SGLang's
capture model (``spec``), the flag rules (``doctor.sglang_model``) and the fingerprint (``doctor.fingerprint``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ... import configs
from ... import sglang_releases as releases
from ... import vllm_rules
from ...findings import Finding
from ...sglang_releases import NativeCapture, ReleaseSpan, SGLangRelease, compare_native_capture
from ...spec import DRAFT_IDS, HF_HIDDEN_STATES, LAYER_INPUTS, TapError, TapSpec, convention_limits
from ..common import DoctorError, read_json
from ..sglang_model.flag_rules import SpecResolution, parallel_findings, speculative_findings
from ..sglang_model.server_args import ServerFlags, parse_server_args

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

ENGINE_SGLANG = "sglang"
ENGINE_VLLM = "vllm"
ENGINES = (ENGINE_SGLANG, ENGINE_VLLM)


@dataclass
class CheckReport:
    target: configs.TargetConfig
    draft: configs.DraftConfig
    declared: Optional[TapSpec]
    native: Optional[NativeCapture]
    plugin_taps: Optional[List[object]]
    plugin_note: str
    flags: Optional[ServerFlags]
    speculative: Optional[SpecResolution]
    findings: List[Finding] = field(default_factory=list)
    fingerprint: Optional[object] = None  # FingerprintResult
    engine: str = ENGINE_SGLANG
    release: Optional[SGLangRelease] = None   # the SGLang release modelled (engine sglang)
    release_reason: str = ""
    outlook: List[ReleaseSpan] = field(default_factory=list)
    capture_only: List[str] = field(default_factory=list)   # report lines on the capture-only mode
    vllm: Optional[vllm_rules.VLLMCapture] = None
    vllm_reason: str = ""
    vllm_alternative: Optional[vllm_rules.VLLMCapture] = None  # the other runner of the same release, when it differs

    @property
    def errors(self) -> List[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_json(self) -> dict:
        d = self.declared
        return {
            "target": {"path": self.target.source_path, "num_layers": self.target.num_layers,
                       "hidden_size": self.target.hidden_size, "model_type": self.target.model_type},
            "draft": {"path": self.draft.source_path, "layer_ids": self.draft.layer_ids,
                      "layer_ids_source": self.draft.layer_ids_source, "convention": self.draft.convention,
                      "fc_in_features": self.draft.fc_in_features},
            "declared": None if d is None else {"taps": [repr(t) for t in d.taps], "describe": d.describe()},
            "engine": self.engine,
            "sglang": None if self.release is None else {
                "release": self.release.version, "why": self.release_reason, "id_rule": self.release.id_rule,
                "adapter": self.release.variant, "plugin_registry": self.release.plugin_registry,
                "capture_only_mode": self.release.capture_only_mode,
                "native": None if self.native is None else _native_json(self.native),
                "other_releases": [{"releases": list(sp.versions), **_native_json(sp.native)} for sp in self.outlook],
                "capture_only": self.capture_only},
            "vllm": None if self.vllm is None else {
                "release": self.vllm.release, "why": self.vllm_reason, **_vllm_json(self.vllm),
                "other_runner": None if self.vllm_alternative is None else _vllm_json(self.vllm_alternative)},
            "plugin": None if self.plugin_taps is None else [repr(t) for t in self.plugin_taps],
            "speculative": None if self.speculative is None else {
                "steps": self.speculative.steps, "topk": self.speculative.topk,
                "draft_tokens": self.speculative.draft_tokens, "error": self.speculative.error},
            "findings": [f.__dict__ for f in self.findings],
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_json(),
        }


def _native_json(n: NativeCapture) -> dict:
    return {"stored": list(n.stored), "captured": [repr(t) for t in n.captured_taps], "error": n.error,
            "error_at": n.error_at,
            "cuda_graph_replays": None if n.graph is None else {
                "stored": list(n.graph.stored), "captured": [repr(t) for t in n.graph.captured_taps],
                "error": n.graph.error}}


def _vllm_json(c: "vllm_rules.VLLMCapture") -> dict:
    return {"runner": c.reading.runner, "key": c.reading.key, "ids": None if c.reading.ids is None else
            list(c.reading.ids), "ignored_keys": list(c.reading.ignored), "stored": list(c.stored),
            "captured": [repr(t) for t in c.captured_taps], "draft_fc_taps": c.draft_k, "error": c.error}


def _read_config(reader, path):
    """A config reader's missing-file and malformed-config errors become DoctorError (exit 2, no traceback)."""
    try:
        return reader(path)
    except (FileNotFoundError, ValueError) as e:
        raise DoctorError(str(e)) from None


def _read_target(path) -> configs.TargetConfig:
    return _read_config(configs.read_target_config, path)


def _read_draft(path) -> configs.DraftConfig:
    return _read_config(configs.read_draft_config, path)


def _raw_target(path) -> dict:
    import os

    p = os.path.join(path, "config.json") if os.path.isdir(path) else path
    d = read_json(p, "target config")
    for key in ("thinker_config", "llm_config", "language_config", "text_config"):
        if isinstance(d.get(key), dict):
            sub = d[key]
            if key == "thinker_config" and isinstance(sub.get("text_config"), dict):
                sub = sub["text_config"]
            return {**d, **sub}
    return d


def _first_k_dense(raw_target: dict, target: configs.TargetConfig) -> Optional[int]:
    """The target config's first_k_dense_replace (which layers two-batch overlap skips), checked."""
    v = raw_target.get("first_k_dense_replace")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise DoctorError(f"target config {target.source_path or '<dict>'}: 'first_k_dense_replace' must be a "
                          f"non-negative integer, got {v!r}")
    return v


def config_findings(draft: configs.DraftConfig, target: configs.TargetConfig, raw_draft: dict
                    ) -> List[Finding]:
    """Inconsistencies inside and between the two configs (independent of any server)."""
    out = [Finding("warning", "config", w) for w in draft.warnings]
    if draft.fc_norm and draft.norm_before_fc:
        out.append(Finding(
            "error", "fc-norm-and-norm-before-fc",
            "the draft config sets both fc_norm (an RMSNorm per tap, EAGLE-3.1) and norm_before_fc (one RMSNorm over "
            "the concatenated K*H taps); SGLang 0.5.23's llama_eagle3 applies both, one after the other, while a "
            "draft is trained with one of them",
            "keep the one the draft was trained with (its checkpoint has fc_norm.{k}.weight for fc_norm, "
            "input_norm.weight for norm_before_fc) and remove the other"))
    if draft.layer_ids is None:
        out.append(Finding(
            "warning", "no-declared-taps",
            f"the draft config names no taps ({configs.SRC_EAGLE_CONFIG} absent): SGLang (every release 0.5.8 - "
            f"0.5.23) captures its default layer inputs [2, L//2, L-3] = "
            f"{[2, target.num_layers // 2, target.num_layers - 3]} and sizes the fc for {configs.DEFAULT_NUM_AUX} "
            "taps; whether that is what the draft was trained on is unknown",
            "write the trained taps in eagle_config.eagle_aux_hidden_state_layer_ids (SpecForge draft ids, -1 = "
            "embedding)"))
    L = target.num_layers
    if draft.layer_ids is not None and draft.convention == DRAFT_IDS:
        ids = draft.layer_ids
        if -1 not in ids and ids and ids[0] == 0:
            out.append(Finding(
                "warning", "maybe-hf-indices",
                f"draft ids {ids} start with 0 and have no -1: in the draft-id convention 0 is LayerOutput(0), not "
                "the embedding; if the training pipeline used HF hidden_states indices (0 = embedding), these are "
                "off by one",
                f"declare eagle_config.eagle_aux_hidden_state_convention = \"{HF_HIDDEN_STATES}\", or rewrite them "
                f"as draft ids {[i - 1 for i in ids]}"))
    out += pipeline_findings(draft, target, raw_draft)
    arch_layers = raw_draft.get("num_hidden_layers")
    if isinstance(arch_layers, int) and arch_layers != 1 and "Eagle3" in " ".join(draft.architectures):
        out.append(Finding("error", "draft-layers",
                           f"the draft config has num_hidden_layers {arch_layers}; SGLang's EAGLE-3 drafts support 1",
                           "use a one-layer EAGLE-3 draft"))
    return out


FINGERPRINT_TRAINING = ("eagle3-capture doctor fingerprint --training-data <SpecForge hidden-states dir> --server "
                        "<URL of the server, started with EAGLE3_CAPTURE_DUMP=<dir> EAGLE3_CAPTURE_DUMP_STREAM=all> "
                        "--captured <that dir> --draft-config <draft> --target-config <target>")


def pipeline_findings(draft: configs.DraftConfig, target: configs.TargetConfig, raw_draft: dict) -> List[Finding]:
    """A warning when the config states no convention and the common training pipelines would read its ids as
    different taps (eagle3_capture/pipelines.py): which one trained the draft decides what the server must capture."""
    ec = raw_draft.get("eagle_config") if isinstance(raw_draft.get("eagle_config"), dict) else {}
    fam = releases.sglang_family(target.model_type) or releases.sglang_family(target.top_model_type)
    if draft.layer_ids is None or "eagle_aux_hidden_state_convention" in ec or fam is None:
        return []
    from ...pipelines import HF_READING, SGLANG_READING, Readings, readings_of

    r = readings_of(draft.layer_ids, target.num_layers, target.hidden_size, fam)
    if r.hf is None or r.sglang is None or not r.differ:
        return []  # one reading cannot have trained it (e.g. SGLang fails on -1): no doubt which one did
    hf, sg = Readings.taps(r.hf), Readings.taps(r.sglang)
    return [Finding(
        "warning", "ids-convention-unknown",
        f"the draft config does not say how its ids {draft.layer_ids} are meant, and the training pipelines read them "
        f"as different taps: {HF_READING}: {hf}; {SGLANG_READING}: {sg}. This project's plugin reads them the first "
        "way; if the draft was trained the second way, every slot is one layer off",
        f"settle it with the training data: {FINGERPRINT_TRAINING}; then write eagle_config."
        "eagle_aux_hidden_state_convention: \"draft_ids\" (the first reading) or \"layer_inputs\" (the second)")]


def checkpoint_findings(draft_path: str, draft: configs.DraftConfig, target: configs.TargetConfig
                        ) -> List[Finding]:
    """When the draft path is a checkpoint directory: its fc.weight against K*H (read from the header only)."""
    import glob
    import os

    d = draft_path if os.path.isdir(draft_path) else os.path.dirname(draft_path)
    files = sorted(glob.glob(os.path.join(d, "*.safetensors"))) if d else []
    if not files:
        return []
    from safetensors import safe_open

    shape = None
    try:
        for f in files:
            with safe_open(f, framework="pt") as h:
                for key in h.keys():
                    if key in ("fc.weight", "model.fc.weight"):
                        shape = tuple(h.get_slice(key).get_shape())
    except Exception as e:  # a corrupt checkpoint is a finding, not a crash
        return [Finding("error", "checkpoint-unreadable", f"draft checkpoint {d}: {e}", "re-export the draft")]
    if shape is None:
        return [Finding("warning", "checkpoint-no-fc", f"draft checkpoint {d}: no fc.weight in {len(files)} file(s)")]
    K, H = draft.K, target.hidden_size
    if len(shape) != 2 or shape[1] != K * H:
        got = shape[1] if len(shape) == 2 else shape
        hint = (f"{got} = {got // H}*{H}: the checkpoint was trained on {got // H} taps"
                if isinstance(got, int) and got % H == 0 else f"{got} is not a multiple of H={H}")
        return [Finding("error", "fc-in-features",
                        f"draft checkpoint {d}: fc.weight is {list(shape)} but the config declares K={K} taps of "
                        f"H={H} (in_features {K * H}); {hint}",
                        "make eagle_config.eagle_aux_hidden_state_layer_ids list the taps the checkpoint was "
                        "trained on")]
    return []


def plugin_capture(declared: TapSpec, flags: Optional[ServerFlags]) -> Tuple[List[object], str]:
    """What this project's SGLang plugin captures: exactly the declared taps (the final boundary included, from the
    final norm), in declared order."""
    note = "exactly the declared taps"
    if declared.includes_final_boundary:
        note += f" (the final boundary {declared.final_boundary!r} from the final norm's fused add)"
    return list(declared.taps), note


def _sglang_release(sglang_version: Optional[str]) -> Tuple[SGLangRelease, str, Optional[str]]:
    try:
        return releases.assumed_release(sglang_version)
    except ValueError as e:  # argparse checks the flag first; a caller of run_check may pass anything
        raise DoctorError(f"--sglang-version: {e}") from None


def _stock_sglang(declared: TapSpec, draft: configs.DraftConfig, target: configs.TargetConfig,
                  rel: SGLangRelease, fam: str, cuda_graphs: bool, plugin_serves: bool
                  ) -> Tuple[NativeCapture, List[Finding]]:
    """What stock SGLang ``rel`` captures for the draft's ids, as findings prefixed "sglang-" (info instead of
    error when the plugin serves the model instead)."""
    ids = draft.sglang_0523_target_ids  # eagle_config's ids: what the target side of every release reads
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


def _release_findings(declared: TapSpec, rel: SGLangRelease, outlook: List[ReleaseSpan]) -> List[Finding]:
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


def _capture_only_lines(declared: TapSpec, draft: configs.DraftConfig, rel: SGLangRelease, fam: str) -> List[str]:
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


def _stock_vllm(declared: TapSpec, raw_draft: dict, target: configs.TargetConfig, vfam: str,
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


def run_check(target_config: str, draft_config: str, server_args: Optional[str] = None,
              reference: Optional[str] = None, captured: Optional[str] = None,
              family: Optional[str] = None, with_plugin: bool = False, sglang_version: Optional[str] = None,
              engine: str = ENGINE_SGLANG, vllm_version: Optional[str] = None) -> CheckReport:
    """with_plugin: the server runs this project's plugin, so stock SGLang's capture problems are reported as
    info (the plugin's own limits stay errors). sglang_version: the SGLang release to model (default: the
    installed one, else the newest modelled). engine "vllm": stock vLLM's reading of the configs instead
    (vllm_version: default the installed one, else the newest modelled)."""
    if engine not in ENGINES:
        raise DoctorError(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == ENGINE_VLLM:
        for given, flag in ((with_plugin, "--with-plugin"), (server_args is not None, "--server-args"),
                            (sglang_version is not None, "--sglang-version")):
            if given:
                raise DoctorError(f"{flag} is about SGLang; it does not go with --engine vllm")
    elif vllm_version is not None:
        raise DoctorError("--vllm-version goes with --engine vllm")
    if (reference is None) != (captured is None):
        raise DoctorError("--reference and --captured go together (the fingerprint needs both)")
    rel, rel_why, rel_warn = _sglang_release(sglang_version) if engine == ENGINE_SGLANG else (None, "", None)
    vrel, vrel_why, vrel_warn = None, "", None
    if engine == ENGINE_VLLM:
        try:
            vrel, vrel_why, vrel_warn = vllm_rules.assumed_vllm_release(vllm_version)
        except ValueError as e:
            raise DoctorError(f"--vllm-version: {e}") from None
    target = _read_target(target_config)
    draft = _read_draft(draft_config)
    raw_draft = read_json(draft.source_path, "draft config") if draft.source_path else {}
    raw_target = _raw_target(target_config)
    flags = parse_server_args(server_args) if server_args is not None else None
    findings = config_findings(draft, target, raw_draft)
    for warn, code in ((rel_warn, "sglang-release-assumed"), (vrel_warn, "vllm-release-assumed")):
        if warn:
            findings.append(Finding("warning", code, warn, ""))

    findings += checkpoint_findings(draft_config, draft, target)
    declared = None
    try:
        declared = configs.draft_taps(draft, target)
    except (TapError, ValueError) as e:
        findings.append(Finding("error", "declared-taps-invalid", str(e),
                                "fix eagle_config.eagle_aux_hidden_state_layer_ids (draft ids: -1 = embedding, d = "
                                f"output of layer d, 0..{target.num_layers - 1}) or the draft's widths"))
    model_types = (target.model_type, target.top_model_type)
    native, outlook, capture_only, vcap, valt = None, [], [], None, None
    fam = family or releases.sglang_family(target.model_type) or releases.sglang_family(target.top_model_type)
    deepseek = fam == releases.FAMILY_DEEPSEEK_V2
    plugin_serves = with_plugin and deepseek and rel is not None and rel.plugin_registry
    if with_plugin and rel is not None and not rel.plugin_registry:
        findings.append(Finding("error", "plugin-unavailable",
                                f"--with-plugin, but SGLang {rel.version} has no plugin registry (sglang.srt.plugins "
                                "is in 0.5.11 on): the plugin cannot load there",
                                "upgrade SGLang to 0.5.11 or later to serve with the plugin"))
    if declared is not None and engine == ENGINE_SGLANG:
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
            native, stock = _stock_sglang(declared, draft, target, rel, fam, cuda_graphs, plugin_serves)
            findings += stock
            outlook = releases.release_outlook(draft.sglang_0523_target_ids, target.num_layers, target.hidden_size,
                                               fam, model_types, cuda_graphs=cuda_graphs)
            findings += _release_findings(declared, rel, outlook)
            capture_only = _capture_only_lines(declared, draft, rel, fam)
    if declared is not None and engine == ENGINE_VLLM:
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
                vcap, valt, vf = _stock_vllm(declared, raw_draft, target, vfam, vrel)
                findings += vf
            except TapError as e:
                findings.append(Finding("error", "vllm-ids-invalid", str(e), "fix the draft config's ids"))
    plugin_taps, plugin_note = (None, "")
    if declared is not None:
        plugin_taps, plugin_note = plugin_capture(declared, flags)
        if engine == ENGINE_VLLM:
            plugin_taps, plugin_note = None, ("this project's plugin is an SGLang plugin; vLLM captures by its own "
                                              "rule (above)")
        elif fam is not None and not deepseek:
            plugin_note = (f"the plugin hooks the DeepseekV2 family only; {target.model_type} is served by stock "
                           "SGLang's rule")
            plugin_taps = None
        elif not rel.plugin_registry:
            plugin_taps, plugin_note = None, (f"SGLang {rel.version} has no plugin registry (sglang.srt.plugins, in "
                                              "0.5.11 on): the plugin cannot load there")
        else:
            plugin_note += f"; adapter {rel.variant} on SGLang {rel.version}"

    spec_res = None
    if flags is not None:
        arch = target.architectures[0] if target.architectures else None
        spec_res, sf = speculative_findings(flags, arch)
        findings += sf
        if declared is not None:
            findings += parallel_findings(flags, declared, _first_k_dense(raw_target, target),
                                          plugin=plugin_taps is not None)

    fp = None
    if reference is not None:
        from ..fingerprint.reference import fingerprint

        fp = fingerprint(reference, captured, declared=declared,
                         declared_source="the draft config" if declared is not None else "")
        findings += fp.findings

    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    return CheckReport(target, draft, declared, native, plugin_taps, plugin_note, flags, spec_res, findings, fp,
                       engine, rel, rel_why, outlook, capture_only, vcap, vrel_why, valt)


def _native_line(n: NativeCapture) -> str:
    txt = f"layers_to_capture {list(n.stored)} -> "
    if n.error and not n.captured_inputs:
        txt += f"fails ({n.error_at}): {n.error}"
    else:
        txt += f"captures {list(n.captured_taps)}" + (f", then fails ({n.error_at}): {n.error}" if n.error else "")
    if n.graph is not None:
        txt += f"; forwards replayed from CUDA graphs: {_native_line(n.graph)}"
    return txt


def _vllm_line(c: "vllm_rules.VLLMCapture") -> str:
    read = (f"reads {c.reading.key} = {list(c.reading.ids)}" if c.reading.ids is not None else
            f"finds no ids ({c.reading.key})")
    ign = f" (ignores {', '.join(c.reading.ignored)})" if c.reading.ignored else ""
    txt = f"{read}{ign} -> aux_hidden_state_layers {list(c.stored)} -> "
    if c.error and not c.captured_inputs:
        return txt + f"fails ({c.error_at}): {c.error}"
    return (txt + f"captures {list(c.captured_taps)}; draft fc sized for {c.draft_k} taps"
            + (f", then fails ({c.error_at}): {c.error}" if c.error else ""))


def render(rep: CheckReport) -> str:
    t, d = rep.target, rep.draft
    lines = [f"target: {t.source_path}: {t.model_type or '?'} L={t.num_layers} H={t.hidden_size}"
             + (f" (language model in '{t.text_config_key}')" if t.text_config_key else ""),
             f"draft:  {d.source_path}: ids {d.layer_ids} from {d.layer_ids_source}, read as {d.convention}; "
             f"fc in_features {d.fc_in_features}"
             + ("; fc_norm" if d.fc_norm else "") + ("; norm_before_fc" if d.norm_before_fc else "")]
    if rep.declared is not None:
        lim = convention_limits(rep.declared)
        lines.append(f"trained taps (declared): {list(rep.declared.taps)}")
        for key, label in ((DRAFT_IDS, "draft ids (SpecForge)"), (LAYER_INPUTS, "layer inputs (SGLang/vLLM)"),
                           (HF_HIDDEN_STATES, "HF hidden_states")):
            c = lim[key]
            lines.append(f"  {label:28s} {list(c.indices) if c.ok else 'n/a: ' + (c.short_reason or '')}")
    if rep.release is not None:
        r = rep.release
        lines.append(f"SGLang release modelled: {r.version} ({rep.release_reason}): id rule \"{r.id_rule}\" "
                     f"[{r.cite('id-rule')}], capture variant {r.variant} (the plugin's adapter)")
    if rep.native is not None:
        n = rep.native
        lines.append(f"stock SGLang {n.release} ({n.family}): {_native_line(n)}")
    if len(rep.outlook) > 1:
        lines.append("stock SGLang on other releases, same ids:")
        for sp in rep.outlook:
            here = " (modelled above)" if rep.release is not None and sp.contains(rep.release.version) else ""
            detail = (_native_line(sp.native) if sp.native.stored or not sp.native.error
                      else f"fails ({sp.native.error_at}): {sp.native.error}")
            lines.append(f"  {sp.label()}{here}: {detail}")
    lines += rep.capture_only
    if rep.vllm is not None:
        c = rep.vllm
        lines.append(f"vLLM release modelled: {c.release} ({rep.vllm_reason}); runner {c.reading.runner}")
        lines.append(f"stock vLLM {c.release} (runner {c.reading.runner}, {c.family}): {_vllm_line(c)}")
        if rep.vllm_alternative is not None:
            a = rep.vllm_alternative
            lines.append(f"  with runner {a.reading.runner} (VLLM_USE_V2_MODEL_RUNNER=0): {_vllm_line(a)}")
    if rep.plugin_taps is not None:
        lines.append(f"with the eagle3-capture plugin: captures {rep.plugin_taps} ({rep.plugin_note})")
    elif rep.plugin_note:
        lines.append(f"plugin: {rep.plugin_note}")
    if rep.speculative is not None:
        s = rep.speculative
        if s.error:
            lines.append(f"speculative flags: SGLang 0.5.23 refuses them ({s.error.split(':')[0]})")
        else:
            lines.append(f"speculative flags as SGLang 0.5.23 resolves them: num-steps {s.steps}, eagle-topk {s.topk},"
                         f" num-draft-tokens {s.draft_tokens}")
    if rep.fingerprint is not None:
        from ..fingerprint.reference import render as render_fp  # here: without a fingerprint, check loads no torch

        lines.append("")
        lines.append(render_fp(rep.fingerprint))
    lines.append("")
    if not rep.findings:
        lines.append("findings: none -- the served capture equals the trained one")
    else:
        n_err = len(rep.errors)
        lines.append(f"findings: {n_err} error(s), {len(rep.findings) - n_err} other")
        last_fix = None
        for f in rep.findings:
            lines.append(f"  [{f.severity}] {f.code}: {f.message}")
            if f.fix:
                lines.append("      fix: " + ("as above" if f.fix == last_fix else f.fix))
            last_fix = f.fix
    return "\n".join(lines)


__all__ = ["CheckReport", "run_check", "render", "config_findings", "plugin_capture", "ENGINES", "ENGINE_SGLANG",
           "ENGINE_VLLM"]
