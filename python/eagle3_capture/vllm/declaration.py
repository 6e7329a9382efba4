"""The draft's tap declaration as the vLLM plugin reads it: from the key vLLM's active model runner reads, in the
convention the draft declares, checked against the target and the draft's fc. Pure Python (no torch, no vLLM):
the plugin calls it at the target's model load, the tests call it directly.

The rule (one place; the startup line and every refusal quote it):

* The ids are those the active runner reads (vllm_rules.read_aux_layer_ids: the top-level
  ``eagle_aux_hidden_state_layer_ids`` first on both runners; V1 then ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  V2 never). A draft whose ids sit only where the runner does not look (the nested key under V2) is refused: stock
  vLLM would silently capture its default layers, so the declaration the file carries is not what vLLM serves
  without the plugin either; the refusal names the top-level ids that say the same taps.
* Their meaning: ``eagle_config.eagle_aux_hidden_state_convention`` when the draft declares one (``draft_ids``,
  ``layer_inputs``, ``hf_hidden_states``; this project's key, see configs.py); else vLLM's own meaning, layer-input
  indices (0 = the embedding, L = the final output before the norm): what stock vLLM does with the same ids, and how
  speculators writes them. So undeclared ids are served as stock vLLM serves them, and where stock vLLM fails (0
  raises in DeepseekV2) the plugin serves what the id means. ``-1`` is no layer input: undeclared, it is refused
  (stock vLLM drops it silently), with the convention key that makes it the embedding.
* Ids vLLM derives with a +1 (``dflash_config.target_layer_ids``, ``dspark_target_layer_ids``, ``target_layer_ids``)
  are taken as vLLM computes them, layer inputs; the convention key does not apply to them.
* No ids: vLLM's default ``(2, L // 2, L - 3)`` layer inputs, served as stock vLLM serves them.
* The draft's fc must take the declared taps: vLLM sizes it from ``num_aux_hidden_states``, else the nested ids'
  count, else 3 (vllm_rules.draft_num_aux), for ``target_hidden_size`` (else ``hidden_size``) per tap.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from .. import vllm_rules as vr
from ..spec import CONVENTIONS, DRAFT_IDS, LAYER_INPUTS, TapError, TapSpec

CONVENTION_FIELD = "eagle_aux_hidden_state_convention"
CONVENTION_KEY = f"eagle_config.{CONVENTION_FIELD}"
_AS_GIVEN_KEYS = (vr.KEY_TOP_LEVEL, vr.KEY_NESTED)  # keys whose ids vLLM uses unchanged


class DeclarationError(ValueError):
    """A declaration the plugin cannot serve; the message is the one line the server stops with."""


@dataclass(frozen=True)
class Declaration:
    """What the plugin captures for one draft config: ``spec`` (the taps, in order), the ``ids`` read, the ``key``
    they came from, the ``convention`` they were read in and why (``convention_source``), the ``runner`` whose
    reading it follows, and ``stock`` (the ids stock vLLM would store: the same reading, or its default)."""

    spec: TapSpec
    ids: Optional[Tuple[int, ...]]
    key: str
    convention: str
    convention_source: str
    runner: str
    stock: Tuple[int, ...]

    @property
    def aux_layers(self) -> Tuple[int, ...]:
        """The layer-input indices vLLM's own loop captures for these taps (the embedding, index 0, is taken by the
        plugin before the loop): what the plugin stores in ``aux_hidden_state_layers``."""
        return tuple(i for i in self.spec.to_layer_inputs(allow_final_boundary=True) if i != 0)


def _convention(cfg: Mapping[str, Any]) -> Tuple[Optional[str], str]:
    ec = cfg.get("eagle_config")
    if isinstance(ec, Mapping) and CONVENTION_FIELD in ec:
        conv = ec[CONVENTION_FIELD]
        if not isinstance(conv, str) or conv not in CONVENTIONS:
            raise DeclarationError(f"{CONVENTION_KEY} is {conv!r}; expected one of {sorted(CONVENTIONS)}")
        return conv, f"declared by {CONVENTION_KEY}"
    return None, "vLLM's own meaning (no convention declared): layer-input indices"


def _spec(convention: str, ids, L: int, H: int) -> TapSpec:
    opts = {"allow_final_boundary": True} if convention == LAYER_INPUTS else {}
    if convention not in (LAYER_INPUTS, DRAFT_IDS):
        opts = {"final_is_prenorm": False}
    return TapSpec.from_convention(convention, list(ids), L, H, **opts)


def read_declaration(draft_config: Mapping[str, Any], runner: str, num_layers: int, hidden_size: int,
                     release: str = "") -> Declaration:
    """The taps the plugin captures for ``draft_config`` (a dict: the draft's config.json as vLLM holds it) under
    vLLM's model runner ``runner``, for a target of ``num_layers`` layers of width ``hidden_size``. Raises
    DeclarationError (one line) for a declaration it cannot serve."""
    who = f"vLLM {release} (model runner {runner})".replace("vLLM  ", "vLLM ")
    L, H = int(num_layers), int(hidden_size)
    try:
        reading = vr.read_aux_layer_ids(draft_config, runner)
    except TapError as e:
        raise DeclarationError(f"{who} cannot read the draft's ids: {e}") from None
    conv, conv_why = _convention(draft_config)
    ec = draft_config.get("eagle_config") if isinstance(draft_config.get("eagle_config"), Mapping) else {}
    nested = ec.get("eagle_aux_hidden_state_layer_ids")
    if reading.default and nested:
        raise DeclarationError(
            f"the draft config carries its ids {list(nested)} only in {vr.KEY_NESTED}, which {who} does not read: "
            f"stock vLLM would silently capture its default layer inputs {list(vr.default_aux_layers(L))}; "
            f"{_top_level_fix(nested, conv, L, H)}")
    if reading.default:
        ids, key, conv, conv_why = None, vr.KEY_DEFAULT, LAYER_INPUTS, "vLLM's default layer inputs"
        raw = vr.default_aux_layers(L)
    else:
        ids, key, raw = reading.ids, reading.key, reading.ids
        if key not in _AS_GIVEN_KEYS:
            conv, conv_why = LAYER_INPUTS, f"layer inputs as vLLM derives them from {key}"
        elif conv is None:
            conv = LAYER_INPUTS
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, int):
            raise DeclarationError(f"{who} reads {key} = {list(raw)}: {v!r} is not an integer layer index")
    try:
        spec = _spec(conv, raw, L, H)
    except TapError as e:
        hint = ""
        if conv == LAYER_INPUTS and -1 in raw and key in _AS_GIVEN_KEYS:
            hint = (f"; -1 is the embedding only as a draft id (SpecForge's meaning): if these are draft ids, "
                    f"declare {CONVENTION_KEY} = \"{DRAFT_IDS}\"; in vLLM's meaning the embedding is layer input 0")
        raise DeclarationError(f"{who} reads {key} = {list(raw)} ({conv_why}), which the plugin cannot capture on "
                               f"this {L}-layer target: {e}{hint}") from None
    k = vr.draft_num_aux(draft_config)
    width = draft_config.get("target_hidden_size") or draft_config.get("hidden_size")
    if k != spec.K or (isinstance(width, int) and width != H):
        raise DeclarationError(
            f"the draft's fc takes {k} taps of width {width} (vLLM sizes it from num_aux_hidden_states, else the "
            f"count of {vr.KEY_NESTED}, else 3; target_hidden_size else hidden_size) but {key} = {list(raw)} "
            f"declares {spec.K} taps of the target's width {H}: {list(spec.taps)}")
    stock = tuple(reading.ids) if reading.ids is not None else vr.default_aux_layers(L)
    return Declaration(spec, None if ids is None else tuple(ids), key, conv, conv_why, runner, tuple(stock))


def _top_level_fix(nested, conv: Optional[str], L: int, H: int) -> str:
    """What to write instead of nested-only ids: the same taps as top-level ids (layer inputs, or in the declared
    convention, which the plugin reads there too)."""
    if conv is None:
        return (f"move them to the top-level {vr.KEY_TOP_LEVEL} (read there as layer-input indices, vLLM's meaning, "
                f"unless {CONVENTION_KEY} says otherwise)")
    try:
        spec = _spec(conv, nested, L, H)
    except TapError as e:
        return f"and read as {conv} ({CONVENTION_KEY}) they are no valid taps either: {e}"
    return (f"read as {conv} ({CONVENTION_KEY}) they are {list(spec.taps)}: write top-level {vr.KEY_TOP_LEVEL} = "
            f"{spec.to_layer_inputs(allow_final_boundary=True)} without the convention key (layer inputs), or "
            f"{list(nested)} beside it")


def describe(decl: Declaration) -> str:
    """The taps part of the startup line: the taps in every convention, where they came from, what stock vLLM
    would have stored."""
    ids = "none" if decl.ids is None else list(decl.ids)
    stock = list(decl.stock)
    same = decl.aux_layers == tuple(stock) and not decl.spec.includes_embedding
    return (f"{decl.spec.describe()}; from {decl.key} {ids} read as {decl.convention} ({decl.convention_source}); "
            f"aux_hidden_state_layers {list(decl.aux_layers)}"
            + (" + the embedding taken before the first layer" if decl.spec.includes_embedding else "")
            + (f"; stock vLLM stores {stock}" + (" too" if same else "")))


__all__ = ["Declaration", "DeclarationError", "read_declaration", "describe", "CONVENTION_KEY"]
