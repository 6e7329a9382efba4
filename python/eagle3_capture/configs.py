"""Read target and EAGLE-3 draft config.json files into the facts that decide which taps a draft needs.

Pure Python + json, so a config can be checked before anything heavy is installed. Every key is read where
SGLang 0.5.23 reads it (noted beside each), because a draft config that *looks* right but puts its ids where the
server does not look is one of the ways a served capture silently differs from the trained one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple, Union

from . import sglang_releases as releases
from .findings import Finding
from .spec import CONVENTIONS, DRAFT_IDS, HF_HIDDEN_STATES, LAYER_INPUTS, TapError, TapSpec

__all__ = [
    "TargetConfig", "DraftConfig", "read_target_config", "read_draft_config", "draft_taps", "target_ids",
    "check_sglang_serving", "SRC_EAGLE_CONFIG", "SRC_TOP_LEVEL", "SRC_DEFAULT", "DEFAULT_NUM_AUX",
]

SRC_EAGLE_CONFIG = releases.IDS_KEY_EAGLE_CONFIG
SRC_TOP_LEVEL = "eagle_aux_hidden_state_layer_ids"
SRC_DEFAULT = "default (absent)"
CONVENTION_KEY = "eagle_config.eagle_aux_hidden_state_convention"
# SGLang 0.5.23 sizes a draft fc for 3 taps when it finds no ids (llama_eagle3.py, kimi_k25_eagle3.py,
# speculative/eagle_utils.py: `len(layer_ids) if layer_ids else 3`).
DEFAULT_NUM_AUX = 3

PathOrDict = Union[str, "os.PathLike[str]", Mapping[str, Any]]


# ----------------------------------------------------------------------------------------------------------------
# loading helpers
# ----------------------------------------------------------------------------------------------------------------

def _load(path_or_dict: PathOrDict, what: str) -> Tuple[Mapping[str, Any], str, Optional[str]]:
    """Return (config dict, label for messages, source path or None). A directory means its config.json."""
    if isinstance(path_or_dict, Mapping):
        return path_or_dict, f"{what} config <dict>", None
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    label = f"{what} config {path}"
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{label}: no such file") from None
    except UnicodeDecodeError as e:  # a ValueError whose message names no file
        raise ValueError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # a directory without config.json is FileNotFoundError above; this is e.g. permissions
        raise ValueError(f"{label}: cannot be read ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{label}: malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{label}: expected a JSON object at top level, got {type(data).__name__}")
    return data, label, path


def _int(value: Any, label: str, key: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label}: '{key}' must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{label}: '{key}' must be >= {minimum}, got {value}")
    return value


def _opt_int(cfg: Mapping[str, Any], key: str, label: str, prefix: str = "") -> Optional[int]:
    v = cfg.get(key)
    return None if v is None else _int(v, label, prefix + key)


def _architectures(cfg: Mapping[str, Any], label: str) -> Tuple[str, ...]:
    a = cfg.get("architectures") or ()
    if not isinstance(a, (list, tuple)) or not all(isinstance(x, str) for x in a):
        raise ValueError(f"{label}: 'architectures' must be a list of strings, got {a!r}")
    return tuple(a)


def _opt_bool(cfg: Mapping[str, Any], key: str, label: str, prefix: str = "") -> Optional[bool]:
    """A JSON true/false (null or absent: None). A string such as "false" would be truthy in Python: refused."""
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise ValueError(f"{label}: '{prefix}{key}' must be true or false, got {v!r}")
    return v


def _opt_str(cfg: Mapping[str, Any], key: str, label: str, prefix: str = "") -> Optional[str]:
    v = cfg.get(key)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{label}: '{prefix}{key}' must be a string, got {v!r}")
    return v


# ----------------------------------------------------------------------------------------------------------------
# target
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetConfig:
    """The target model facts the taps depend on: L decoder layers of width H."""

    num_layers: int
    hidden_size: int
    model_type: Optional[str]
    architectures: Tuple[str, ...]
    source_path: Optional[str]
    text_config_key: Optional[str] = None  # where the language model config was found, e.g. "text_config"
    top_model_type: Optional[str] = None   # model_type of the outer (e.g. multimodal) config

    @property
    def sglang_family(self) -> Optional[str]:
        """SGLang's capture family ("deepseek_v2", "qwen_moe", the same in every modelled release) or None if not
        modelled."""
        return releases.sglang_family(self.model_type) or releases.sglang_family(self.top_model_type)


# SGLang 0.5.23 utils/hf_transformers/common.py get_hf_text_config: priority
# thinker_config (its text_config if any) > llm_config > language_config > text_config.
_SUB_CONFIG_KEYS = ("thinker_config", "llm_config", "language_config", "text_config")


def read_target_config(path_or_dict: PathOrDict) -> TargetConfig:
    """Read ``num_hidden_layers`` and ``hidden_size`` of the language model.

    Multimodal wrappers nest it (Kimi-K2.5: ``text_config`` holds the DeepseekV3 config); like SGLang's
    ``get_hf_text_config`` the nested config wins, and top-level keys are the fallback.
    """
    cfg, label, path = _load(path_or_dict, "target")
    sub, sub_key = None, None
    for key in _SUB_CONFIG_KEYS:
        if isinstance(cfg.get(key), Mapping):
            sub, sub_key = cfg[key], key
            if key == "thinker_config" and isinstance(sub.get("text_config"), Mapping):
                sub, sub_key = sub["text_config"], "thinker_config.text_config"
            break

    def get(key: str) -> int:
        if sub is not None and sub.get(key) is not None:
            return _int(sub[key], label, f"{sub_key}.{key}")
        if cfg.get(key) is not None:
            return _int(cfg[key], label, key)
        where = f"'{key}' (looked in '{sub_key}.{key}' and at top level)" if sub is not None else f"'{key}'"
        raise ValueError(f"{label}: missing {where}")

    num_layers, hidden = get("num_hidden_layers"), get("hidden_size")
    top_mt = _opt_str(cfg, "model_type", label)
    mt = (_opt_str(sub, "model_type", label, f"{sub_key}.") if sub is not None else None) or top_mt
    return TargetConfig(num_layers, hidden, mt, _architectures(cfg, label), path, sub_key, top_mt)


# ----------------------------------------------------------------------------------------------------------------
# draft
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftConfig:
    """An EAGLE-3 draft config as SGLang 0.5.23 reads it.

    ``layer_ids`` are read as the draft side does (``eagle_config`` first, then top level); ``convention`` says how
    to read them (default: SpecForge draft ids). ``eagle_config_ids`` and ``top_level_ids`` are the ids as written
    at each key (None: absent); what the *target* side of a release receives is :func:`target_ids`.
    """

    layer_ids: Optional[List[int]]
    layer_ids_source: str
    convention: str
    hidden_size: int
    target_hidden_size: Optional[int]
    fc_norm: bool
    norm_before_fc: bool
    architectures: Tuple[str, ...]
    num_hidden_layers: Optional[int]
    fc_in_features: Optional[int]
    num_aux_hidden_states: Optional[int] = None
    use_aux_hidden_state: bool = True
    eagle_config_ids: Optional[List[int]] = None
    top_level_ids: Optional[List[int]] = None
    model_type: Optional[str] = None
    source_path: Optional[str] = None
    warnings: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def K(self) -> int:
        """Taps the draft fc is sized for, as SGLang 0.5.23 sizes it."""
        if self.num_aux_hidden_states is not None:
            return self.num_aux_hidden_states
        return len(self.layer_ids) if self.layer_ids else DEFAULT_NUM_AUX

    def ids_at(self, key: str) -> Optional[List[int]]:
        """The ids written at ``key`` (SRC_EAGLE_CONFIG or SRC_TOP_LEVEL), None when absent."""
        by_key = {SRC_EAGLE_CONFIG: self.eagle_config_ids, SRC_TOP_LEVEL: self.top_level_ids}
        if key not in by_key:
            raise ValueError(f"expected one of {', '.join(by_key)}, got {key!r}")
        return by_key[key]


def target_ids(draft: DraftConfig, rel: Union[str, "releases.SGLangRelease"]) -> Optional[List[int]]:
    """The ids the target side of SGLang ``rel`` receives from this draft config (None -> its default capture):
    what is written at the key that release reads (``SGLangRelease.ids_key``)."""
    return draft.ids_at(releases.release(rel).ids_key)


def _ids(value: Any, label: str, key: str) -> Optional[List[int]]:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{label}: '{key}' must be a list of integers, got {value!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{label}: '{key}' must be a list of integers, got element {v!r} in {value!r}")
    if not value:
        raise ValueError(f"{label}: '{key}' is empty: SGLang (read in 0.5.23) would capture nothing while sizing the "
                         f"draft fc for {DEFAULT_NUM_AUX} taps; list the taps or remove the key")
    return list(value)


def read_draft_config(path_or_dict: PathOrDict) -> DraftConfig:
    """Read an EAGLE-3 draft config.json (a file, its directory, or a dict).

    Where SGLang 0.5.23 reads each key:

    * ids, target side: ``model_runner_components/spec_aux_hidden_state.py: _resolve_eagle_aux_hidden_state`` takes
      ``eagle_config["eagle_aux_hidden_state_layer_ids"]`` only (any exception -> None -> default capture);
    * ids / K, draft side: ``llama_eagle3.py``, ``kimi_k25_eagle3.py``, ``speculative/eagle_utils.py`` read
      ``eagle_config`` then the top level (``num_aux_hidden_states`` overrides the count in llama_eagle3 and
      eagle_utils), and use 3 taps when none is found;
    * ``fc_norm`` (or legacy ``use_aux_norm``): top level; ``norm_before_fc``: ``eagle_config`` then top level;
      fc width: ``target_hidden_size`` or else ``hidden_size``.
    ``eagle_config.eagle_aux_hidden_state_convention`` is this project's explicit declaration of how the ids are
    meant (``draft_ids`` | ``layer_inputs`` | ``hf_hidden_states``); SGLang ignores it.
    """
    cfg, label, path = _load(path_or_dict, "draft")
    ec = cfg.get("eagle_config")
    if ec is not None and not isinstance(ec, Mapping):
        raise ValueError(f"{label}: 'eagle_config' must be a JSON object, got {ec!r}")
    ec = ec or {}
    warnings: List[str] = []

    ec_ids = _ids(ec.get("eagle_aux_hidden_state_layer_ids"), label, SRC_EAGLE_CONFIG)
    top_ids = _ids(cfg.get("eagle_aux_hidden_state_layer_ids"), label, SRC_TOP_LEVEL)
    if ec_ids is not None:
        ids, source = ec_ids, SRC_EAGLE_CONFIG
        if top_ids is not None and top_ids != ec_ids:
            warnings.append(f"{SRC_EAGLE_CONFIG} {ec_ids} and top-level {SRC_TOP_LEVEL} {top_ids} differ; "
                            f"SGLang uses {SRC_EAGLE_CONFIG}")
    elif top_ids is not None:
        ids, source = top_ids, SRC_TOP_LEVEL
        warnings.append(f"ids only at top level ({SRC_TOP_LEVEL} {top_ids}): SGLang (read in 0.5.23) sizes the draft "
                        f"fc from them, but its target reads only {SRC_EAGLE_CONFIG} and so captures its default "
                        "[2, L//2, L-3] layer inputs; move them into eagle_config")
    else:
        ids, source = None, SRC_DEFAULT

    convention = ec.get("eagle_aux_hidden_state_convention", DRAFT_IDS)
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        raise ValueError(f"{label}: '{CONVENTION_KEY}' is {convention!r}; expected one of {sorted(CONVENTIONS)}")
    if ids is None and "eagle_aux_hidden_state_convention" in ec:
        warnings.append(f"{CONVENTION_KEY} is set but there are no ids to interpret")

    hidden = cfg.get("hidden_size")
    if hidden is None:
        raise ValueError(f"{label}: missing 'hidden_size'")
    hidden = _int(hidden, label, "hidden_size")
    target_hidden = _opt_int(cfg, "target_hidden_size", label)
    num_aux = _opt_int(cfg, "num_aux_hidden_states", label)
    if num_aux is not None and ids is not None and num_aux != len(ids):
        warnings.append(f"num_aux_hidden_states={num_aux} but {source} lists {len(ids)} ids {ids}: "
                        "SGLang's llama_eagle3 sizes fc by num_aux_hidden_states, kimi_k25_eagle3 by the ids")
    use_aux = _opt_bool(ec, "use_aux_hidden_state", label, "eagle_config.")
    use_aux = True if use_aux is None else use_aux
    if use_aux is False:
        warnings.append("eagle_config.use_aux_hidden_state is false: SGLang (read in 0.5.23) captures no aux hidden "
                        "states")

    K = num_aux if num_aux is not None else (len(ids) if ids else DEFAULT_NUM_AUX)
    width = target_hidden or hidden
    return DraftConfig(
        layer_ids=ids, layer_ids_source=source, convention=convention, hidden_size=hidden,
        target_hidden_size=target_hidden,
        fc_norm=bool(_opt_bool(cfg, "fc_norm", label) or _opt_bool(cfg, "use_aux_norm", label)),
        norm_before_fc=bool(_norm_before_fc(cfg, ec, label)),
        architectures=_architectures(cfg, label), num_hidden_layers=_opt_int(cfg, "num_hidden_layers", label),
        fc_in_features=K * width, num_aux_hidden_states=num_aux, use_aux_hidden_state=bool(use_aux),
        eagle_config_ids=ec_ids, top_level_ids=top_ids, model_type=_opt_str(cfg, "model_type", label), source_path=path,
        warnings=tuple(warnings),
    )


def _norm_before_fc(cfg: Mapping[str, Any], ec: Mapping[str, Any], label: str) -> Optional[bool]:
    """eagle_config first, then the top level, as SGLang reads it (a key present in eagle_config wins, even false)."""
    top = _opt_bool(cfg, "norm_before_fc", label)
    if "norm_before_fc" in ec:
        return _opt_bool(ec, "norm_before_fc", label, "eagle_config.")
    return top


# ----------------------------------------------------------------------------------------------------------------
# draft + target -> taps
# ----------------------------------------------------------------------------------------------------------------

def _where(c) -> str:
    return c.source_path or "<dict>"


def draft_taps(draft: DraftConfig, target: TargetConfig, *, final_is_prenorm: bool = False) -> TapSpec:
    """The canonical taps the draft was trained on, for this target.

    The ids are read in the draft's declared convention (default: SpecForge draft ids, -1 = Embedding). A
    ``layer_inputs`` declaration may name the final boundary (index L): it describes training, not a capture.
    When the config has no ids, SGLang 0.5.23's default is assumed: ``set_eagle3_layers_to_capture(None)`` stores
    layer-input indices ``[2, L // 2, L - 3]`` (models/deepseek_v2.py DeepseekV2ForCausalLM, and the same literal
    in qwen2_moe.py / qwen3_moe.py), i.e. outputs of layers 1, L//2 - 1, L - 4 -- which is also what SpecForge's
    default draft ids [1, L//2 - 1, L - 4] mean. Also checks widths: the draft's ``target_hidden_size`` must be
    the target's H, and the draft fc must be K*H wide.
    """
    L, H = target.num_layers, target.hidden_size
    width = draft.target_hidden_size or draft.hidden_size
    if width != H:
        key = "target_hidden_size" if draft.target_hidden_size else "hidden_size (no target_hidden_size)"
        raise ValueError(f"draft config {_where(draft)}: {key} is {width} but the target {_where(target)} has "
                         f"hidden_size {H}: this draft was not trained on this target")
    try:
        if draft.layer_ids is None:
            spec = TapSpec.from_layer_inputs(releases.default_layers_to_capture(L), L, H)
        else:
            opts = {}
            if draft.convention == LAYER_INPUTS:
                opts["allow_final_boundary"] = True
            elif draft.convention == HF_HIDDEN_STATES:
                opts["final_is_prenorm"] = final_is_prenorm
            spec = TapSpec.from_convention(draft.convention, draft.layer_ids, L, H, **opts)
        if draft.fc_in_features is not None:
            spec.check_fc_in_features(draft.fc_in_features)
    except TapError as e:
        ids = draft.layer_ids if draft.layer_ids is not None else \
            f"SGLang default layer inputs {releases.default_layers_to_capture(L)}"
        raise TapError(f"draft config {_where(draft)} ({draft.layer_ids_source} = {ids}, read as {draft.convention}) "
                       f"for target {_where(target)} ({L} layers, H={H}): {e}") from e
    return spec


def check_sglang_serving(draft: DraftConfig, target: TargetConfig,
                         rel: Union[str, "releases.SGLangRelease"]) -> List[Finding]:
    """What goes wrong when stock SGLang ``rel`` serves this pair: config warnings plus every tap mismatch."""
    rel = releases.release(rel)
    out = [Finding("warning", "config", w) for w in draft.warnings]
    declared = draft_taps(draft, target)
    family = target.sglang_family
    if family is None:
        out.append(Finding("info", "unmodelled-family",
                           f"target model_type {target.model_type!r}: this module does not model its SGLang capture"))
        return out
    if not draft.use_aux_hidden_state:
        out.append(Finding("error", "no-capture", "eagle_config.use_aux_hidden_state is false: nothing is captured",
                           "remove use_aux_hidden_state=false"))
        return out
    return out + releases.check_release(declared, target_ids(draft, rel), rel, family)
