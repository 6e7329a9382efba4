"""What the configs say without any server: the target and draft config.json read (a missing or malformed one is bad
input, exit 2), the inconsistencies inside and between them, the training pipelines' disagreement over the ids, and
the draft checkpoint's fc against K*H."""
from __future__ import annotations

from typing import List, Optional

from ... import configs
from ... import sglang_releases as releases
from ...findings import Finding
from ...spec import DRAFT_IDS, HF_HIDDEN_STATES
from ..common import DoctorError, read_json


def read_config(reader, path):
    """A config reader's missing-file and malformed-config errors become DoctorError (exit 2, no traceback)."""
    try:
        return reader(path)
    except (FileNotFoundError, ValueError) as e:
        raise DoctorError(str(e)) from None


def read_target(path) -> configs.TargetConfig:
    return read_config(configs.read_target_config, path)


def read_draft(path) -> configs.DraftConfig:
    return read_config(configs.read_draft_config, path)


def raw_target(path) -> dict:
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


def first_k_dense(raw: dict, target: configs.TargetConfig) -> Optional[int]:
    """The target config's first_k_dense_replace (which layers two-batch overlap skips), checked."""
    v = raw.get("first_k_dense_replace")
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
            "the concatenated K*H taps); SGLang's llama_eagle3 (read in 0.5.23) applies both, one after the other, "
            "while a draft is trained with one of them",
            "keep the one the draft was trained with (its checkpoint has fc_norm.{k}.weight for fc_norm, "
            "input_norm.weight for norm_before_fc) and remove the other"))
    if draft.layer_ids is None:
        out.append(Finding(
            "warning", "no-declared-taps",
            f"the draft config names no taps ({configs.SRC_EAGLE_CONFIG} absent): SGLang (every release "
            f"{releases.OLDEST} - {releases.NEWEST}) captures its default layer inputs [2, L//2, L-3] = "
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


__all__ = ["read_config", "read_target", "read_draft", "raw_target", "first_k_dense", "config_findings",
           "FINGERPRINT_TRAINING", "pipeline_findings", "checkpoint_findings"]
