"""What this project knows of each SGLang release: its pins, its id rule, how DeepseekV2 captures there (the plugin's
adapter), its count check, its capture-only mode, its plugin registry, the model families it serves -- as step
tables read in the wheels -- and what this project does with it: whether the plugin serves it, whether it runs on
the CPU machine (and why not), whether the doctor's serving model was read in it, which releases the test matrix
runs. :func:`release` / :func:`assumed_release` pick one; every other part of the project reads these rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

from ..release_table import span_text
from .hook_points import hook_point
from .versions import KNOWN_RANGE, KNOWN_VERSIONS, NEWEST, OLDEST, since, version_key

ID_RULE_PLUS_ONE_ALWAYS = "+1 on every id"
ID_RULE_PLUS_ONE_IF_FIRST_IS_1 = "+1 only if ids[0] == 1"

# The plugin's adapters, one per way DeepseekV2Model captures (the plugin's detection, sglang/installed/internals.py,
# names them with these).
VARIANT_LIST_IN_LOOP = "list-in-loop"
VARIANT_LIST_INTO_LAYER = "list-into-layer"
VARIANT_PACKER = "packer"
VARIANT_PACKER_LAYER_BOUNDARY = "packer+layer-boundary"
VARIANTS = (VARIANT_LIST_IN_LOOP, VARIANT_LIST_INTO_LAYER, VARIANT_PACKER, VARIANT_PACKER_LAYER_BOUNDARY)

# What stock DeepseekV2 does when it captures fewer slots than layers_to_capture has entries.
COUNT_CHECK_NONE = "none"        # a plain list: the draft's fc gets n*H features instead of K*H
COUNT_CHECK_ASSERT = "assert"    # AuxHiddenStatePacker.finalize: assert ..., "captured n of K aux hidden states"
COUNT_CHECK_RAISE = "raise"      # AuxHiddenStatePacker.finalize: raise RuntimeError("captured n of K ...")

FAMILY_DEEPSEEK_V2 = "deepseek_v2"
FAMILY_QWEN_MOE = "qwen_moe"
FAMILIES = (FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE)

# Where a release's target side reads the draft's ids (SGLangRelease.ids_key): the same key in every release.
IDS_KEY_EAGLE_CONFIG = "eagle_config.eagle_aux_hidden_state_layer_ids"

# When stock SGLang fails (NativeCapture.error_at).
ERROR_AT_LOAD = "model load"          # set_eagle3_layers_to_capture raises, or the model has none
ERROR_AT_FORWARD = "target forward"   # the first target forward: CUDA-graph capture at startup, else the 1st request
ERROR_AT_DRAFT_FC = "draft fc"        # the target runs; the draft's fc receives the wrong width


# ----------------------------------------------------------------------------------------------------------------
# the step tables: (first release with the value, value), each read where its comment says
# ----------------------------------------------------------------------------------------------------------------

# sglang-X.dist-info/METADATA: Requires-Dist torch==..., transformers==...
_TORCH = (("0.5.8", "2.9.1"), ("0.5.11", "2.11.0"), ("0.5.18", "2.13.0"), ("0.5.22", "2.14.1"))
_TRANSFORMERS = (("0.5.8", "4.57.1"), ("0.5.10", "5.3.0"), ("0.5.11", "5.6.0"), ("0.5.13", "5.8.1"),
                 ("0.5.15", "5.12.1"), ("0.5.22", "5.19.0"))
# models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture (one source 0.5.8 - 0.5.12.post1, one
# 0.5.13 - 0.5.23).
_ID_RULE = (("0.5.8", ID_RULE_PLUS_ONE_ALWAYS), ("0.5.13", ID_RULE_PLUS_ONE_IF_FIRST_IS_1))
# models/deepseek_v2.py DeepseekV2Model.forward (and DeepseekV2DecoderLayer.forward from 0.5.14).
_VARIANT = (("0.5.8", VARIANT_LIST_IN_LOOP), ("0.5.14", VARIANT_LIST_INTO_LAYER), ("0.5.17", VARIANT_PACKER),
            ("0.5.21", VARIANT_PACKER_LAYER_BOUNDARY))
# layers/aux_hidden_states.py AuxHiddenStatePacker.finalize (no packer before 0.5.17).
_COUNT_CHECK = (("0.5.8", COUNT_CHECK_NONE), ("0.5.17", COUNT_CHECK_ASSERT), ("0.5.20", COUNT_CHECK_RAISE))
# arg_groups/fields/exec_.py enable_return_aux_hidden_states, arg_groups/validation_hook.py
# handle_aux_hidden_state_capture, model_runner_components/spec_aux_hidden_state.py
# _resolve_capture_only_aux_hidden_state: only 0.5.23 (no release before it has the flag).
_CAPTURE_ONLY = (("0.5.8", False), ("0.5.23", True))
# plugins/__init__.py load_plugins + plugins/hook_registry.py HookRegistry: from 0.5.11 (hook_registry.py is the
# same file 0.5.11 - 0.5.19; 0.5.20 only reformats one line).
_PLUGIN_REGISTRY = (("0.5.8", False), ("0.5.11", True))
# model_executor/cuda_graph_runner.py CudaGraphRunner.__init__ `set_eagle3_layers_to_capture()` before its capture,
# and model_executor/model_runner.py ModelRunner.initialize setting the ids after init_device_graphs: 0.5.8 -
# 0.5.10.post1. 0.5.11 ModelRunner.initialize calls init_aux_hidden_state_capture() before the graphs.
_GRAPHS_CAPTURE_DEFAULT = (("0.5.8", True), ("0.5.11", False))
# speculative/spec_info.py: EAGLEWorker (v1, speculative/eagle_worker.py) when overlap scheduling is off, through
# 0.5.12.post1; 0.5.13 removed eagle_worker.py and always returns EAGLEWorkerV2.
_EAGLE_WORKER_V1 = (("0.5.8", True), ("0.5.13", False))

# ----------------------------------------------------------------------------------------------------------------
# what this project does with each release
# ----------------------------------------------------------------------------------------------------------------

# The releases the plugin (python/eagle3_capture/sglang/) serves: read against each one's source, its model-level
# tests run on each one's real classes (make test-sglang SGLANG=X). An older one is refused at model load; a newer
# one is served by the adapter its code matches, with a warning (sglang/installed/internals.py).
_PLUGIN_SUPPORTED = (("0.5.8", False), ("0.5.12", True))
# The release the doctor's serving model (doctor/sglang_model/: the server flags' rules, the speculative loop, the
# responses) was read in; any other release is predicted with the newest such model, and the report says so.
_SERVING_MODEL = (("0.5.8", False), ("0.5.23", True))
# Why a release cannot run on the CPU machine (this repository's torch, no sgl_kernel), one line each, checked by
# importing it there (tests/sglang_release_dirs.py sglang --importable X, with the test-only import stand-ins a GPU
# server does not need: sgl_kernel, and cutlass for 0.5.15's jit_kernel/dsa); a release not named runs there.
_SGL_KERNEL_IMPORT = ("its deepseek_v2.py imports reach mem_cache/memory_pool_host.py, which imports sgl_kernel "
                      "(CUDA-only) (checked on 0.5.8 and 0.5.10)")
_CPU_BLOCKERS = {
    "0.5.8": _SGL_KERNEL_IMPORT, "0.5.8.post1": _SGL_KERNEL_IMPORT, "0.5.9": _SGL_KERNEL_IMPORT,
    "0.5.10": _SGL_KERNEL_IMPORT, "0.5.10.post1": _SGL_KERNEL_IMPORT,
}
# The releases `make test-releases` runs besides the environment's own (make test): one of each adapter and id rule
# that runs on the CPU machine (0.5.21: the packer with the residual-norm final boundary, apart from 0.5.22-0.5.23's
# final-norm one); "smoke" adds SGLang's serving loop (the release smoke) to the model-level tests.
_MATRIX = {"0.5.12": "smoke", "0.5.16": "model", "0.5.20": "model", "0.5.21": "model"}
MATRIX_KINDS = ("smoke", "model")

# Target model types a release cannot serve with EAGLE-3 although the family's rule is modelled: model_type ->
# (first release that can, why the earlier ones cannot).
_MODEL_SUPPORT = {
    # models/qwen3_next.py: Qwen3NextForCausalLM has no set_eagle3_layers_to_capture in 0.5.8 / 0.5.8.post1, and
    # ModelRunner calls it unguarded.
    "qwen3_next": ("0.5.9", "AttributeError at model load: Qwen3NextForCausalLM has no set_eagle3_layers_to_capture "
                            "(models/qwen3_next.py) before 0.5.9"),
    # models/kimi_k25.py: absent in 0.5.8 / 0.5.8.post1; in 0.5.9 KimiK25ForConditionalGeneration has no
    # set_eagle3_layers_to_capture; 0.5.10 delegates it to its DeepseekV3 language_model.
    "kimi_k25": ("0.5.10", "KimiK25ForConditionalGeneration (models/kimi_k25.py) is absent before 0.5.9 and has no "
                           "set_eagle3_layers_to_capture in 0.5.9: AttributeError at model load"),
}



# ----------------------------------------------------------------------------------------------------------------
# the release record
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SGLangRelease:
    """One SGLang release as this project models it (build one with :func:`release`)."""

    version: str
    torch_pin: str
    transformers_pin: str
    id_rule: str                 # ID_RULE_*
    variant: str                 # VARIANT_*: the plugin adapter this release needs
    count_check: str             # COUNT_CHECK_*
    capture_only_mode: bool      # --enable-return-aux-hidden-states (+ --return-aux-hidden-state-layer-ids)
    plugin_registry: bool        # sglang.srt.plugins (HookRegistry, entry point group sglang.srt.plugins)
    graphs_capture_default_layers: bool
    eagle_worker_v1: bool        # speculative/eagle_worker.py EAGLEWorker, chosen when overlap scheduling is off
    plugin_supported: bool = False      # the plugin serves it (read against it, tested on it)
    serving_model: bool = False         # the doctor's serving model (doctor/sglang_model/) was read in it
    cpu_blocker: Optional[str] = None   # why it cannot run on the CPU machine (None: it runs there)
    matrix: Optional[str] = None        # MATRIX_KINDS: what make test-releases runs on it (None: nothing)

    @property
    def ids_key(self) -> str:
        """Where the target side of this release reads a draft's ids: ``eagle_config.eagle_aux_hidden_state_layer_ids``
        in every modelled release (any exception -> None -> the default layers; :meth:`cite` "read-ids")."""
        return IDS_KEY_EAGLE_CONFIG

    def hook_path(self, name: str) -> Optional[str]:
        """The dotted path (``sglang.srt.`` + ...) of hook point ``name`` in this release, or None if it has none."""
        path = hook_point(name).path_in(self.version)
        return None if path is None else "sglang.srt." + path

    def hook_note(self, name: str) -> str:
        return hook_point(name).note_in(self.version)

    def cite(self, topic: str) -> str:
        """Where the rule ``topic`` ("id-rule", "capture", "count-check", "read-ids", "capture-only",
        "default-layers") was read for this release: release, file and function."""
        first = _first_of(topic, self.version)
        where = {
            "id-rule": "models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
            "default-layers": "models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
            "capture": {
                VARIANT_LIST_IN_LOOP: "models/deepseek_v2.py DeepseekV2Model.forward",
                VARIANT_LIST_INTO_LAYER: "layers/communicator.py "
                                         "LayerCommunicator.prepare_attn_and_capture_last_layer_outputs",
                VARIANT_PACKER: "layers/aux_hidden_states.py AuxHiddenStatePacker",
                VARIANT_PACKER_LAYER_BOUNDARY: "layers/layer_boundary/stage.py StageBoundary._prepare_attention",
            }[self.variant],
            "count-check": ("layers/logits_processor.py LogitsProcessor._get_hidden_states_to_store (torch.cat "
                            "of the list, no count check)"
                            if self.count_check == COUNT_CHECK_NONE
                            else "layers/aux_hidden_states.py AuxHiddenStatePacker.finalize"),
            "read-ids": ("model_executor/model_runner.py ModelRunner.__init__"
                         if version_key(self.version) < version_key("0.5.16") else
                         "model_executor/model_runner_components/spec_aux_hidden_state.py "
                         "_resolve_eagle_aux_hidden_state"),
            "capture-only": ("model_executor/model_runner_components/spec_aux_hidden_state.py "
                             "_resolve_capture_only_aux_hidden_state, arg_groups/validation_hook.py "
                             "handle_aux_hidden_state_capture, layers/logits_processor.py "
                             "LogitsProcessor._check_aux_hidden_states"
                             if self.capture_only_mode else "arg_groups (no enable_return_aux_hidden_states field)"),
        }.get(topic)
        if where is None:
            raise ValueError(f"unknown topic {topic!r}; known: id-rule, default-layers, capture, count-check, "
                             "read-ids, capture-only")
        return f"SGLang {first} {where}" + ("" if first == self.version else f" (same in {self.version})")


# For cite(): the first release of the range whose source a rule was read in.
_TOPIC_TABLES = {"id-rule": _ID_RULE, "default-layers": (("0.5.8", 0),), "capture": _VARIANT,
                 "count-check": _COUNT_CHECK, "read-ids": (("0.5.8", 0), ("0.5.16", 1)),
                 "capture-only": _CAPTURE_ONLY}


def _first_of(topic: str, version: str) -> str:
    """The first release of the step of ``topic``'s table that ``version`` falls in."""
    steps = _TOPIC_TABLES.get(topic, (("0.5.8", 0),))
    return since([(first, first) for first, _ in steps], version) or OLDEST


def _make(version: str) -> SGLangRelease:
    return SGLangRelease(
        version=version, torch_pin=since(_TORCH, version), transformers_pin=since(_TRANSFORMERS, version),
        id_rule=since(_ID_RULE, version), variant=since(_VARIANT, version),
        count_check=since(_COUNT_CHECK, version), capture_only_mode=since(_CAPTURE_ONLY, version),
        plugin_registry=since(_PLUGIN_REGISTRY, version),
        graphs_capture_default_layers=since(_GRAPHS_CAPTURE_DEFAULT, version),
        eagle_worker_v1=since(_EAGLE_WORKER_V1, version), plugin_supported=since(_PLUGIN_SUPPORTED, version),
        serving_model=since(_SERVING_MODEL, version), cpu_blocker=_CPU_BLOCKERS.get(version),
        matrix=_MATRIX.get(version))


RELEASES: Tuple[SGLangRelease, ...] = tuple(_make(v) for v in KNOWN_VERSIONS)
_BY_VERSION: Dict[str, SGLangRelease] = {r.version: r for r in RELEASES}


def supported() -> Tuple[str, ...]:
    """The releases the plugin serves, oldest first (consecutive)."""
    return tuple(r.version for r in RELEASES if r.plugin_supported)


SUPPORTED_RANGE = span_text(supported())   # "0.5.12 through 0.5.23": how messages and documents state it


def serving_model_release() -> SGLangRelease:
    """The newest release the doctor's serving model was read in (what a prediction for any release uses)."""
    return [r for r in RELEASES if r.serving_model][-1]


def matrix(kind: str) -> Tuple[str, ...]:
    """The releases ``make test-releases`` runs with ``kind`` ("smoke": model-level tests and the serving loop;
    "model": the model-level tests), oldest first."""
    if kind not in MATRIX_KINDS:
        raise ValueError(f"expected one of {', '.join(MATRIX_KINDS)}, got {kind!r}")
    return tuple(r.version for r in RELEASES if r.matrix == kind)


def release(version: Union[str, SGLangRelease]) -> SGLangRelease:
    """The modelled release ``version`` ("0.5.12", "0.5.12.post1"). Anything else -- not a version, a version older
    or newer than the modelled range, or one inside it that was never released -- is a ValueError with one line
    naming the range."""
    if isinstance(version, SGLangRelease):
        return version
    text = version.strip() if isinstance(version, str) else version
    if not isinstance(text, str) or version_key(text) is None:
        raise ValueError(f"expected an SGLang release version like 0.5.12 or 0.5.12.post1 (modelled: {KNOWN_RANGE}), "
                         f"got {version!r}")
    if text in _BY_VERSION:
        return _BY_VERSION[text]
    key = version_key(text)
    if key < version_key(OLDEST):
        raise ValueError(f"SGLang {text} is older than the releases modelled here ({KNOWN_RANGE}); "
                         f"known: {', '.join(KNOWN_VERSIONS)}")
    if key > version_key(NEWEST):
        raise ValueError(f"SGLang {text} is newer than the releases modelled here ({KNOWN_RANGE}): its internals "
                         f"were not read; known: {', '.join(KNOWN_VERSIONS)}")
    raise ValueError(f"SGLang {text} is not a release on the registry; releases modelled ({KNOWN_RANGE}): "
                     f"{', '.join(KNOWN_VERSIONS)}")


def installed_sglang_version() -> Optional[str]:
    """The installed SGLang's version from its distribution metadata (never imports sglang), or None."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


_LOOK_UP = object()  # assumed_release's default: read the installed version


def assumed_release(version: Optional[str] = None, installed=_LOOK_UP) -> Tuple[SGLangRelease, str, Optional[str]]:
    """The release to model and why: ``version`` when given (ValueError if it is not a modelled release), else the
    installed SGLang when it is one, else the newest. Returns (release, reason, warning); ``warning`` is set when an
    installed SGLang is not a modelled release (e.g. a newer one), which then falls back to the newest.
    ``installed`` overrides the lookup (tests)."""
    if version is not None:
        return release(version), "given", None
    inst = installed_sglang_version() if installed is _LOOK_UP else installed
    if inst is None:
        return release(NEWEST), "no SGLang installed here: the newest modelled", None
    local = inst.split("+", 1)[0]
    try:
        r = release(local)
    except ValueError as e:
        return (release(NEWEST), f"the installed SGLang {inst} is not modelled: the newest modelled",
                f"the installed SGLang {inst} is not modelled ({e}); the report assumes {NEWEST}: pass "
                "--sglang-version for the release the server runs")
    why = "installed here" + (f" as {inst}" if local != inst else "")
    return r, why, None


# ----------------------------------------------------------------------------------------------------------------
# model families
# ----------------------------------------------------------------------------------------------------------------

# model_type -> family, the same in every modelled release. models/deepseek_v2.py serves DeepseekV2/V3/V32ForCausalLM
# (EntryClass, 0.5.8 - 0.5.23; kimi_k2 is a DeepseekV3ForCausalLM); models/kimi_k25.py
# KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture delegates to its DeepseekV3 language_model
# (0.5.10 on). qwen2_moe.py Qwen2MoeForCausalLM, qwen3_moe.py Qwen3MoeForCausalLM and qwen3_next.py
# Qwen3NextForCausalLM add +1 to every id (the same source 0.5.8 - 0.5.23; qwen3_next from 0.5.9).
_FAMILY_BY_MODEL_TYPE = {
    "deepseek_v2": FAMILY_DEEPSEEK_V2, "deepseek_v3": FAMILY_DEEPSEEK_V2, "deepseek_v32": FAMILY_DEEPSEEK_V2,
    "kimi_k2": FAMILY_DEEPSEEK_V2, "kimi_k25": FAMILY_DEEPSEEK_V2,
    "qwen2_moe": FAMILY_QWEN_MOE, "qwen3_moe": FAMILY_QWEN_MOE, "qwen3_next": FAMILY_QWEN_MOE,
}


def sglang_family(model_type: Optional[str]) -> Optional[str]:
    """The capture family of a target model_type ("deepseek_v2", "qwen_moe"), or None if not modelled."""
    return _FAMILY_BY_MODEL_TYPE.get(model_type or "")


def model_support_error(rel: Union[str, SGLangRelease], model_types: Sequence[Optional[str]]) -> Optional[str]:
    """Why release ``rel`` cannot serve EAGLE-3 for a target of these model types (its own and an outer
    multimodal one), or None."""
    r = release(rel)
    for mt in model_types:
        if mt in _MODEL_SUPPORT:
            first, why = _MODEL_SUPPORT[mt]
            if version_key(r.version) < version_key(first):
                return f"{why}; SGLang {first} and later can"
    return None
