"""``doctor check``'s run: the request (the command's flags, each a field of :class:`CheckRequest`) -> the configs
read, every engine's reading of them, the server flags' traps, the optional fingerprint -> :class:`~.report.
CheckReport`, findings sorted by severity."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ... import configs
from ... import sglang_releases as releases
from ...findings import Finding
from ...spec import TapError
from .. import arg_types as at
from .. import options
from ..common import DoctorError, read_json
from ..options import flag
from ..sglang_model.flag_rules import parallel_findings, speculative_findings
from ..sglang_model.release import model_for
from ..sglang_model.server_args import parse_server_args
from .config_findings import checkpoint_findings, config_findings, first_k_dense, raw_target, read_draft, read_target
from .engines import (ENGINE_SGLANG, ENGINE_VLLM, ENGINES, plugin_view, sglang_reading, sglang_release, vllm_draft,
                      vllm_plugin_view, vllm_reading, vllm_release)
from .report import SEVERITY_ORDER, CheckReport


@dataclass(frozen=True)
class CheckRequest:
    """What ``doctor check`` reads, each field its flag. ``with_plugin``: the server runs this project's plugin, so
    stock SGLang's capture problems are reported as info (the plugin's own limits stay errors). ``sglang_version``:
    the SGLang release to model (default: the installed one, else the newest modelled). ``engine`` "vllm": stock
    vLLM's reading of the configs instead (``vllm_version``: default the installed one, else the newest modelled)."""

    target_config: str = flag("--target-config", required=True, metavar="PATH",
                              help="target config.json (or its directory)")
    draft_config: str = flag("--draft-config", required=True, metavar="PATH",
                             help="EAGLE-3 draft config.json (or its directory)")
    server_args: Optional[str] = options.server_args()
    reference: Optional[str] = flag("--reference", metavar="REF.safetensors",
                                    help="reference hidden states (doctor dump-reference)")
    captured: Optional[str] = flag("--captured", metavar="CAP",
                                   help="what the server captured: the plugin's EAGLE3_CAPTURE_DUMP directory or file, "
                                        "or a safetensors capture")
    with_plugin: bool = flag("--with-plugin", action="store_true",
                             help="the server runs this project's SGLang plugin: stock SGLang's capture problems "
                                  "become info")
    engine: str = flag("--engine", type=at.engine, default=ENGINE_SGLANG, metavar="{sglang,vllm}",
                       help="the serving engine whose reading of the configs to model (default sglang)")
    sglang_version: Optional[str] = flag("--sglang-version", type=at.sglang_version, metavar="X",
                                         help=f"the SGLang release the server runs, {releases.KNOWN_RANGE} (.post "
                                              "releases included); default: the installed SGLang, else the newest "
                                              "modelled")
    vllm_version: Optional[str] = flag("--vllm-version", type=at.vllm_version, metavar="X",
                                       help="with --engine vllm: the vLLM release (0.33.0, 0.34.0); default: the "
                                            "installed vLLM, else the newest modelled")
    json: Optional[str] = options.json_out("also write the report as JSON")


def run_check(request: CheckRequest) -> CheckReport:
    """The report of ``request`` (a DoctorError on bad input: flags that do not go together, configs that cannot be
    read)."""
    target_config, draft_config, server_args = request.target_config, request.draft_config, request.server_args
    reference, captured, with_plugin, engine = request.reference, request.captured, request.with_plugin, request.engine
    sglang_version, vllm_version = request.sglang_version, request.vllm_version
    if engine not in ENGINES:
        raise DoctorError(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == ENGINE_VLLM:
        for given, name in ((with_plugin, "--with-plugin"), (server_args is not None, "--server-args"),
                            (sglang_version is not None, "--sglang-version")):
            if given:
                raise DoctorError(f"{name} is about SGLang; it does not go with --engine vllm")
    elif vllm_version is not None:
        raise DoctorError("--vllm-version goes with --engine vllm")
    if (reference is None) != (captured is None):
        raise DoctorError("--reference and --captured go together (the fingerprint needs both)")
    rel, rel_why, rel_warn = sglang_release(sglang_version) if engine == ENGINE_SGLANG else (None, "", None)
    vrel, vrel_why, vrel_warn = vllm_release(vllm_version) if engine == ENGINE_VLLM else (None, "", None)
    target = read_target(target_config)
    draft = read_draft(draft_config)
    raw_draft = read_json(draft.source_path, "draft config") if draft.source_path else {}
    raw_tgt = raw_target(target_config)
    flags = parse_server_args(server_args) if server_args is not None else None
    findings = config_findings(draft, target, raw_draft)
    for warn, code in ((rel_warn, "sglang-release-assumed"), (vrel_warn, "vllm-release-assumed")):
        if warn:
            findings.append(Finding("warning", code, warn, ""))

    if engine == ENGINE_VLLM:
        draft, found = vllm_draft(draft, raw_draft, target, vrel)
        findings += found
    findings += checkpoint_findings(draft_config, draft, target)
    declared = None
    try:
        declared = configs.draft_taps(draft, target)
    except (TapError, ValueError) as e:
        findings.append(Finding("error", "declared-taps-invalid", str(e),
                                "fix eagle_config.eagle_aux_hidden_state_layer_ids (draft ids: -1 = embedding, d = "
                                f"output of layer d, 0..{target.num_layers - 1}) or the draft's widths"))
    native, outlook, capture_only, vcap, valt = None, [], [], None, None
    fam = releases.sglang_family(target.model_type) or releases.sglang_family(target.top_model_type)
    plugin_serves = (with_plugin and fam == releases.FAMILY_DEEPSEEK_V2 and rel is not None
                     and rel.plugin_registry)
    if with_plugin and rel is not None and not rel.plugin_registry:
        findings.append(Finding("error", "plugin-unavailable",
                                f"--with-plugin, but SGLang {rel.version} has no plugin registry (sglang.srt.plugins "
                                "is in 0.5.11 on): the plugin cannot load there",
                                "upgrade SGLang to 0.5.11 or later to serve with the plugin"))
    if declared is not None and engine == ENGINE_SGLANG:
        native, outlook, capture_only, found = sglang_reading(declared, draft, target, rel, fam, flags, plugin_serves)
        findings += found
    if declared is not None and engine == ENGINE_VLLM:
        vcap, valt, found = vllm_reading(declared, draft, raw_draft, target, vrel)
        findings += found
    plugin_taps, plugin_note = (None, "")
    if engine == ENGINE_VLLM:
        plugin_taps, plugin_note = vllm_plugin_view(raw_draft, target, vrel)
    elif declared is not None:
        plugin_taps, plugin_note = plugin_view(declared, flags, engine, fam, rel, target)

    spec_res, serving = None, None
    if flags is not None:
        serving = model_for(rel)  # the flags' rules: those read in rel when the table has them, else the newest
        arch = target.architectures[0] if target.architectures else None
        spec_res, sf = speculative_findings(flags, arch)
        findings += sf
        if declared is not None:
            findings += parallel_findings(flags, declared, first_k_dense(raw_tgt, target),
                                          plugin=plugin_taps is not None)

    fp = None
    if reference is not None:
        from ..fingerprint.reference import fingerprint

        fp = fingerprint(reference, captured, declared=declared,
                         declared_source="the draft config" if declared is not None else "")
        findings += fp.findings

    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    return CheckReport(target, draft, declared, native, plugin_taps, plugin_note, flags, spec_res, findings, fp,
                       engine, rel, rel_why, outlook, capture_only, vcap, vrel_why, valt, serving)


__all__ = ["CheckRequest", "run_check"]
