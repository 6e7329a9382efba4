"""``doctor check``'s report: what was read and modelled, every finding with its fix; as text (:func:`render`) and
as JSON (``CheckReport.to_json``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ... import configs
from ... import vllm_rules
from ...findings import Finding
from ...sglang_releases import NativeCapture, ReleaseSpan, SGLangRelease
from ...spec import DRAFT_IDS, HF_HIDDEN_STATES, LAYER_INPUTS, TapSpec, convention_limits
from ..sglang_model.flag_rules import SpecResolution
from ..sglang_model.release import ServingModel, model_for
from ..sglang_model.server_args import ServerFlags
from .engines import ENGINE_SGLANG

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
    engine: str = ENGINE_SGLANG
    release: Optional[SGLangRelease] = None   # the SGLang release modelled (engine sglang)
    release_reason: str = ""
    outlook: List[ReleaseSpan] = field(default_factory=list)
    capture_only: List[str] = field(default_factory=list)   # report lines on the capture-only mode
    vllm: Optional[vllm_rules.VLLMCapture] = None
    vllm_reason: str = ""
    vllm_alternative: Optional[vllm_rules.VLLMCapture] = None  # the other runner of the same release, when it differs
    serving: Optional[ServingModel] = None  # the doctor's serving model the flags were resolved with

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
                "draft_tokens": self.speculative.draft_tokens, "error": self.speculative.error,
                "rules_read_in": (self.serving or model_for(self.release)).release},
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
        m = rep.serving or model_for(rep.release)
        if s.error:
            lines.append(f"speculative flags: {m.refuses()} ({s.error.split(':')[0]})")
        else:
            lines.append(f"speculative flags {m.resolves()}: num-steps {s.steps}, eagle-topk {s.topk}, "
                         f"num-draft-tokens {s.draft_tokens}")
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


__all__ = ["SEVERITY_ORDER", "CheckReport", "render"]
