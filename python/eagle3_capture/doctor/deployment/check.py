"""``doctor check``: the taps a draft was trained on against what SGLang 0.5.23 and this project's plugin capture,
every inconsistency of the configs, the server-flag traps, and -- when both dumps are given -- the fingerprint of
what a server really captured.

Each :class:`~eagle3_capture.findings.Finding` carries its fix; the exit code is non-zero when any finding is an
error. The pieces come from the rest of the package: config reading (``configs``), tap conventions and SGLang's
capture model (``spec``), the flag rules (``doctor.sglang_model``) and the fingerprint (``doctor.fingerprint``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ... import configs
from ...sglang_rules import NativeCapture, compare_native_capture, sglang_0523_native_capture
from ...findings import Finding
from ...spec import DRAFT_IDS, HF_HIDDEN_STATES, LAYER_INPUTS, TapError, TapSpec, convention_limits
from ..common import DoctorError, read_json
from ..sglang_model.flag_rules import SpecResolution, parallel_findings, speculative_findings
from ..sglang_model.server_args import ServerFlags, parse_server_args

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


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
            "sglang_0523_native": None if self.native is None else {
                "stored": list(self.native.stored), "captured": [repr(t) for t in self.native.captured_taps],
                "error": self.native.error},
            "plugin": None if self.plugin_taps is None else [repr(t) for t in self.plugin_taps],
            "speculative": None if self.speculative is None else {
                "steps": self.speculative.steps, "topk": self.speculative.topk,
                "draft_tokens": self.speculative.draft_tokens, "error": self.speculative.error},
            "findings": [f.__dict__ for f in self.findings],
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_json(),
        }


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
            f"the draft config names no taps ({configs.SRC_EAGLE_CONFIG} absent): SGLang 0.5.23 captures its "
            f"default layer inputs [2, L//2, L-3] = {[2, target.num_layers // 2, target.num_layers - 3]} and sizes "
            f"the fc for {configs.DEFAULT_NUM_AUX} taps; whether that is what the draft was trained on is unknown",
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
    fam = target.sglang_0523_family
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


def run_check(target_config: str, draft_config: str, server_args: Optional[str] = None,
              reference: Optional[str] = None, captured: Optional[str] = None,
              family: Optional[str] = None, with_plugin: bool = False) -> CheckReport:
    """with_plugin: the server runs this project's plugin, so stock SGLang's capture problems are reported as
    info (the plugin's own limits stay errors)."""
    if (reference is None) != (captured is None):
        raise DoctorError("--reference and --captured go together (the fingerprint needs both)")
    target = _read_target(target_config)
    draft = _read_draft(draft_config)
    raw_draft = read_json(draft.source_path, "draft config") if draft.source_path else {}
    raw_target = _raw_target(target_config)
    flags = parse_server_args(server_args) if server_args is not None else None
    findings = config_findings(draft, target, raw_draft)

    findings += checkpoint_findings(draft_config, draft, target)
    declared = None
    try:
        declared = configs.draft_taps(draft, target)
    except (TapError, ValueError) as e:
        findings.append(Finding("error", "declared-taps-invalid", str(e),
                                "fix eagle_config.eagle_aux_hidden_state_layer_ids (draft ids: -1 = embedding, d = "
                                f"output of layer d, 0..{target.num_layers - 1}) or the draft's widths"))
    native = None
    fam = family or target.sglang_0523_family
    if declared is not None:
        if fam is None:
            findings.append(Finding("info", "unmodelled-family",
                                    f"target model_type {target.model_type!r}: SGLang 0.5.23's capture for it is not "
                                    "modelled here; only the plugin's (DeepseekV2 family) is"))
        elif not draft.use_aux_hidden_state:
            findings.append(Finding("error", "no-capture",
                                    "eagle_config.use_aux_hidden_state is false: SGLang 0.5.23 captures nothing",
                                    "remove use_aux_hidden_state=false"))
        else:
            native = sglang_0523_native_capture(draft.sglang_0523_target_ids, target.num_layers,
                                                target.hidden_size, fam)
            stock = compare_native_capture(declared, native)
            ids = draft.sglang_0523_target_ids
            if stock and fam == "deepseek_v2" and ids and ids[0] != 1 and draft.convention == DRAFT_IDS:
                stock.insert(0, Finding(
                    "error", "plus-one-rule",
                    f"SGLang 0.5.23's DeepseekV2 turns draft ids into layer inputs (+1) only when ids[0] == 1; here "
                    f"ids[0] = {ids[0]}, so {ids} are used as layer-input indices unchanged: each draft id d is read "
                    "as LayerOutput(d-1)" + (", and -1 matches no layer" if -1 in ids else ""),
                    stock[0].fix))
            severity = "info" if with_plugin and fam == "deepseek_v2" else None
            for f in stock:
                findings.append(Finding(severity or f.severity, "sglang-" + f.code if not f.code.startswith("plus")
                                        else f.code,
                                        "stock SGLang 0.5.23: " + f.message
                                        + (" (not with the plugin, which captures the declared taps)" if severity
                                           else ""), f.fix))
    plugin_taps, plugin_note = (None, "")
    if declared is not None:
        plugin_taps, plugin_note = plugin_capture(declared, flags)
        if fam is not None and fam != "deepseek_v2":
            plugin_note = (f"the plugin hooks the DeepseekV2 family only; {target.model_type} is served by stock "
                           "SGLang's rule")
            plugin_taps = None

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
    return CheckReport(target, draft, declared, native, plugin_taps, plugin_note, flags, spec_res, findings, fp)


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
    if rep.native is not None:
        n = rep.native
        lines.append(f"stock SGLang 0.5.23 ({n.family}): layers_to_capture {list(n.stored)} -> captures "
                     f"{list(n.captured_taps)}" + (f", then {n.error}" if n.error else ""))
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


__all__ = ["CheckReport", "run_check", "render", "config_findings", "plugin_capture"]
