"""What stock SGLang does with an EAGLE-3 draft's ids on a given release: the layer-input indices it stores, what
DeepseekV2 (or Qwen-MoE) then captures and what it raises, the capture-only mode, the ids that would give the
declared taps, and the findings of the doctor's comparison (one release, or every release at once)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

from ..findings import Finding, compare_taps, wanted_capture
from ..spec import EMBEDDING, LayerOutput, Tap, TapError, TapSpec, as_index, positive_int, tap_error
from .catalogue import (COUNT_CHECK_ASSERT, COUNT_CHECK_RAISE, ERROR_AT_DRAFT_FC, ERROR_AT_FORWARD, ERROR_AT_LOAD,
                        FAMILIES, FAMILY_DEEPSEEK_V2, FAMILY_QWEN_MOE, ID_RULE_PLUS_ONE_ALWAYS,
                        ID_RULE_PLUS_ONE_IF_FIRST_IS_1, RELEASES, VARIANT_LIST_IN_LOOP, SGLangRelease,
                        release)
from .versions import NEWEST


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise TapError(f"unknown SGLang model family {family!r}; known: {list(FAMILIES)}")



# ----------------------------------------------------------------------------------------------------------------
# the rules
# ----------------------------------------------------------------------------------------------------------------

def default_layers_to_capture(num_layers: int) -> List[int]:
    """What every modelled release stores when the draft config has no ids: ``[2, L // 2, L - 3]`` as LAYER-INPUT
    indices (= outputs of layers 1, L//2 - 1, L - 4). The same literal in models/deepseek_v2.py, qwen2_moe.py,
    qwen3_moe.py and qwen3_next.py ``set_eagle3_layers_to_capture`` of 0.5.8 through 0.5.23."""
    L = positive_int(num_layers, "num_layers")
    return [2, L // 2, L - 3]


def _conv(rel: SGLangRelease) -> str:
    return f"SGLang {rel.version} set_eagle3_layers_to_capture(ids) -> model.layers_to_capture"


def layers_to_capture(ids: Optional[Sequence[int]], num_layers: int, rel: Union[str, SGLangRelease] = NEWEST,
                      family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """What release ``rel``'s ``set_eagle3_layers_to_capture(ids)`` stores in ``model.layers_to_capture``.

    * deepseek_v2 (``models/deepseek_v2.py DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``): None ->
      ``[2, L//2, L-3]``; 0.5.8 - 0.5.12.post1 ``[val + 1 for val in layer_ids]``; 0.5.13 - 0.5.23 ``[v + 1 for v
      in layer_ids]`` only ``if layer_ids and layer_ids[0] == 1``, else ``list(layer_ids)``.
    * qwen_moe (``qwen2_moe.py Qwen2MoeForCausalLM`` / ``qwen3_moe.py`` / ``qwen3_next.py``, 0.5.8 - 0.5.23): None
      -> ``[2, L//2, L-3]`` (no +1); otherwise ``[val + 1 for val in layer_ids]``.
    No validation: the point is to reproduce SGLang, mistakes included.
    """
    r = release(rel)
    _check_family(family)
    if ids is None:
        return default_layers_to_capture(num_layers)
    ids = [as_index(v, "draft id", _conv(r)) for v in ids]
    if family == FAMILY_DEEPSEEK_V2 and r.id_rule == ID_RULE_PLUS_ONE_IF_FIRST_IS_1:
        if ids and ids[0] == 1:
            return [v + 1 for v in ids]
        return list(ids)
    return [v + 1 for v in ids]


@dataclass(frozen=True)
class NativeCapture:
    """What stock SGLang captures for a draft's ids.

    ``stored``: ``model.layers_to_capture``; ``captured_inputs``: layer-input indices actually captured, in slot
    order (= layer order); ``dropped``: stored entries that never produce a capture (all of them when the model
    fails before capturing); ``error``: what SGLang then raises, if anything (None when the capture completes,
    even if it is the wrong one), and ``error_at`` when (ERROR_AT_*). ``graph``: on releases whose CUDA graphs were
    captured with the default layers (0.5.8 - 0.5.10.post1), what forwards replayed from those graphs capture
    when it differs from the eager forwards described here (None otherwise).
    """

    family: str
    ids: Optional[Tuple[int, ...]]
    num_layers: int
    hidden_size: int
    stored: Tuple[int, ...]
    captured_inputs: Tuple[int, ...]
    dropped: Tuple[int, ...]
    error: Optional[str]
    release: str = NEWEST
    error_at: Optional[str] = None
    graph: Optional["NativeCapture"] = None

    @property
    def captured_taps(self) -> Tuple[Tap, ...]:
        return tuple(EMBEDDING if i == 0 else LayerOutput(i - 1) for i in self.captured_inputs)

    @property
    def declared_count(self) -> int:
        """How many slots SGLang expects (its packer's K)."""
        return len(self.stored)

    @property
    def captured_features(self) -> int:
        return len(self.captured_inputs) * self.hidden_size

    def outcome(self) -> Tuple:
        """What a user of the server sees (for comparing releases): stored, captured, the error's kind and when,
        and the same of the graph-replayed forwards."""
        kind = None if self.error is None else self.error.split(":")[0]
        return (self.stored, self.captured_inputs, kind, self.error_at,
                None if self.graph is None else self.graph.outcome())


# The exact exception of `hidden_states + residual` with residual None (torch.Tensor.__add__), checked with torch.
_TYPE_ERROR_LAYER0 = "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'"


def native_capture(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                   rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2, *,
                   cuda_graphs: bool = True) -> NativeCapture:
    """What stock SGLang release ``rel`` stores, captures and raises for draft ids ``ids`` (pp=1, no two-batch
    overlap, whose layers from ``first_k_dense_replace`` on capture nothing in any release).

    This is the function the plugin and the doctor call: ``native_capture(ids, L, H, "0.5.12")``.

    deepseek_v2: ``DeepseekV2Model.forward`` loops ``i in range(L)`` and captures the input of layer i when
    ``i in self.layers_to_capture``; entries outside 0..L-1 never match and a repeated entry matches once.
    * list-in-loop (0.5.8 - 0.5.13.post1, ``DeepseekV2Model.forward``): ``aux_hidden_states.append(hidden_states +
      residual)`` before the layer runs; at i = 0 the residual is None: ``TypeError`` on the first forward. A short
      list goes on to ``LogitsProcessor`` (``torch.cat``): the draft's fc receives n*H features instead of K*H.
    * list-into-layer (0.5.14 - 0.5.16, ``LayerCommunicator.prepare_attn_and_capture_last_layer_outputs``): the
      residual after the input norm's fused add; at i = 0 ``prepare_attn`` sets ``residual = hidden_states``, the
      embedding. No count check.
    * packer (0.5.17 - 0.5.20) and packer+layer-boundary (0.5.21 - 0.5.23): the same slots into an
      ``AuxHiddenStatePacker(len(layers_to_capture))`` whose ``finalize()`` fails "captured n of K aux hidden
      states" when 0 < n < K (AssertionError 0.5.17 - 0.5.19, RuntimeError 0.5.20 on).
    With n = 0 every release returns the bare hidden states, which ``DeepseekV2ForCausalLM.forward`` then unpacks
    as (hidden_states, aux). ``cuda_graphs`` (the GPU default): on 0.5.8 - 0.5.10.post1 the graph-replayed
    forwards capture the default layers (``graph``).

    qwen_moe: ``Qwen2MoeModel.set_eagle3_layers_to_capture`` flags ``self.layers[i]`` for each stored i (and never
    clears a flag), so an entry outside -L..L-1 raises IndexError at model load and a negative one wraps to layer
    L+i; captures go to a plain list (no count check). On 0.5.8 - 0.5.10.post1 with CUDA graphs the default call
    comes first, so the eager forwards capture the default layers and the ids' layers together.
    """
    r = release(rel)
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    stored = layers_to_capture(ids, L, r, family)
    ids_t = None if ids is None else tuple(as_index(v, "draft id", _conv(r)) for v in ids)
    graph, extra = None, ()
    if cuda_graphs and r.graphs_capture_default_layers and ids is not None:
        # the graphs were captured after set_eagle3_layers_to_capture() with no ids; Qwen's layer flags from that
        # call stay set when the ids' flags are added
        graph = _capture(None, default_layers_to_capture(L), L, H, r, family, flagged_extra=())
        if family == FAMILY_QWEN_MOE:
            extra = tuple(default_layers_to_capture(L))
    out = _capture(ids_t, stored, L, H, r, family, flagged_extra=extra)
    if graph is not None and graph.outcome() == out.outcome():
        graph = None
    return NativeCapture(out.family, out.ids, L, H, out.stored, out.captured_inputs, out.dropped, out.error,
                         r.version, out.error_at, graph)


def _capture(ids_t, stored, L: int, H: int, r: SGLangRelease, family: str, *, flagged_extra) -> NativeCapture:
    stored = tuple(stored)
    if family == FAMILY_QWEN_MOE:
        bad = [i for i in stored if not -L <= i < L]
        if bad:
            return NativeCapture(family, ids_t, L, H, stored, (), stored,
                                 f"IndexError at model load: Qwen2MoeModel.set_eagle3_layers_to_capture indexes "
                                 f"self.layers[{bad[0]}] of a {L}-layer model", r.version, ERROR_AT_LOAD)
        flagged = {i % L for i in stored + tuple(flagged_extra)}
        captured = tuple(i for i in range(L) if i in flagged)
    else:
        if r.variant == VARIANT_LIST_IN_LOOP and 0 in stored:
            return NativeCapture(family, ids_t, L, H, stored, (), stored,
                                 f"{_TYPE_ERROR_LAYER0} (DeepseekV2Model.forward appends hidden_states + residual "
                                 "at layer input 0, where residual is still None)", r.version, ERROR_AT_FORWARD)
        captured = tuple(i for i in range(L) if i in stored)
    remaining = list(stored)
    for i in captured:
        if i in remaining:
            remaining.remove(i)
        elif i - L in remaining:
            remaining.remove(i - L)  # qwen: a wrapped negative entry was consumed
    n, k = len(captured), len(stored)
    error, at = None, None
    if family == FAMILY_DEEPSEEK_V2 and n == 0:
        error, at = ("no aux hidden states captured: DeepseekV2Model.forward returns bare hidden_states and "
                     "DeepseekV2ForCausalLM.forward unpacks them as (hidden_states, aux)"), ERROR_AT_FORWARD
    elif n != k:
        if family == FAMILY_DEEPSEEK_V2 and r.count_check == COUNT_CHECK_ASSERT:
            error, at = f"AssertionError: captured {n} of {k} aux hidden states", ERROR_AT_FORWARD
        elif family == FAMILY_DEEPSEEK_V2 and r.count_check == COUNT_CHECK_RAISE:
            error, at = f"RuntimeError: captured {n} of {k} aux hidden states", ERROR_AT_FORWARD
        else:
            error, at = (f"{n} of {k} aux hidden states captured: the draft fc receives {n}*{H} = {n * H} features "
                         f"instead of {k * H}"), ERROR_AT_DRAFT_FC
    return NativeCapture(family, ids_t, L, H, stored, captured, tuple(remaining), error, r.version, at)


def capture_only(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                 rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2) -> NativeCapture:
    """What ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3`` (+
    ``--return-aux-hidden-state-layer-ids ids``; None: the flag left out) captures on release ``rel``: requests
    with return_hidden_states receive the captured slots concatenated. Raises ValueError when the release has no
    such mode (all but 0.5.23).

    0.5.23: ``arg_groups/validation_hook.py handle_aux_hidden_state_capture`` rejects an empty, negative or
    repeated id list (ValueError at startup, pp_size must be 1); ``spec_aux_hidden_state.py
    _check_capture_layer_ids_in_range`` rejects ids >= num_hidden_layers; then the model's own
    ``set_eagle3_layers_to_capture(ids)`` applies (for DeepseekV2: +1 only if ids[0] == 1, so ``[1, ...]`` is shifted
    again), and ``LogitsProcessor._check_aux_hidden_states`` fails the first forward when the count differs
    (after the packer's own check).
    """
    r = release(rel)
    if not r.capture_only_mode:
        raise ValueError(f"SGLang {r.version} has no capture-only mode (--enable-return-aux-hidden-states is in "
                         f"{_first_with_capture_only()} on)")
    _check_family(family)
    L = positive_int(num_layers, "num_layers")
    H = positive_int(hidden_size, "hidden_size")
    if ids is not None:
        ids_t = tuple(as_index(v, "--return-aux-hidden-state-layer-ids", _conv(r)) for v in ids)
        why = None
        if not ids_t:
            why = "--return-aux-hidden-state-layer-ids must not be empty"
        elif any(i < 0 for i in ids_t):
            why = f"--return-aux-hidden-state-layer-ids must be non-negative, got {list(ids_t)}"
        elif len(set(ids_t)) != len(ids_t):
            why = f"--return-aux-hidden-state-layer-ids must not repeat a layer, got {list(ids_t)}"
        elif any(i >= L for i in ids_t):
            why = (f"--return-aux-hidden-state-layer-ids {[i for i in ids_t if i >= L]} out of range for a target "
                   f"with {L} layers")
        if why is not None:
            return NativeCapture(family, ids_t, L, H, (), (), (), f"ValueError at startup: {why}", r.version,
                                 ERROR_AT_LOAD)
    out = native_capture(ids, L, H, r, family, cuda_graphs=False)
    if ids is not None and (out.error_at == ERROR_AT_DRAFT_FC or out.error is None) \
            and len(out.captured_inputs) != len(ids):
        # LogitsProcessor._check_aux_hidden_states: the count named by the flag, at the first forward (there is no
        # draft whose fc could fail)
        return NativeCapture(family, out.ids, L, H, out.stored, out.captured_inputs, out.dropped,
                             f"ValueError: The model captured {len(out.captured_inputs)} aux hidden states, but "
                             f"--return-aux-hidden-state-layer-ids names {len(ids)} layers", r.version,
                             ERROR_AT_FORWARD)
    return out


def _first_with_capture_only() -> str:
    return next(r.version for r in RELEASES if r.capture_only_mode)


def ids_for(spec: TapSpec, rel: Union[str, SGLangRelease] = NEWEST, family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """Ids to write in the draft config (``eagle_config.eagle_aux_hidden_state_layer_ids``) so that stock release
    ``rel`` captures exactly ``spec`` (without this project's plugin). Raises TapError when no id list can: the
    final boundary (layer input L, which the capture loop 0..L-1 never reaches); on DeepseekV2, the embedding on
    0.5.8 - 0.5.13.post1 (layer input 0 raises) and, from 0.5.13 on, LayerOutput(0) as first tap (layer input 1
    needs ids[0] == 1, which becomes 2). On 0.5.8 - 0.5.10.post1 the ids hold for eager forwards only: graph-
    replayed ones capture the default layers (see :func:`native_capture`).

    For deepseek_v2 from 0.5.13 on the ids returned are layer-input indices, not SpecForge ids: the draft side of
    SGLang only uses their count, but other tools reading the config would misread them.
    """
    r = release(rel)
    _check_family(family)
    L = spec.num_layers
    conv = _conv(r)
    if spec.includes_final_boundary:
        raise tap_error(f"the final boundary LayerOutput({L - 1}) would be layer-input index {L}, which SGLang "
                        f"{r.version}'s capture loop (0..{L - 1}) never reaches: no id list captures it", conv)
    inputs = spec.to_layer_inputs()
    if family == FAMILY_QWEN_MOE or r.id_rule == ID_RULE_PLUS_ONE_ALWAYS:
        ids = [i - 1 for i in inputs]
    elif inputs[0] == 1:
        raise tap_error(f"{spec.taps[0]!r} as first tap needs layers_to_capture to start with 1, but SGLang "
                        f"{r.version}'s DeepseekV2 shifts any ids starting with 1 to start with 2: no id list "
                        "captures it", conv)
    else:
        ids = list(inputs)
    if family == FAMILY_DEEPSEEK_V2 and r.variant == VARIANT_LIST_IN_LOOP and inputs[0] == 0:
        raise tap_error(f"the Embedding is layer-input index 0, where SGLang {r.version}'s DeepseekV2Model.forward "
                        f"raises ({_TYPE_ERROR_LAYER0}): no id list captures it", conv)
    got = native_capture(ids, L, spec.hidden_size, r, family, cuda_graphs=False)
    assert got.captured_taps == spec.taps and got.error is None, (ids, got)
    return ids


def capture_only_ids_for(spec: TapSpec, rel: Union[str, SGLangRelease] = NEWEST,
                         family: str = FAMILY_DEEPSEEK_V2) -> List[int]:
    """``--return-aux-hidden-state-layer-ids`` that make release ``rel``'s capture-only mode capture exactly
    ``spec``. TapError when none can (the final boundary: ids must be < num_hidden_layers; on DeepseekV2,
    LayerOutput(0) first: 1 is shifted to 2; on Qwen MoE the Embedding: it would need -1, which is rejected);
    ValueError when the release has no capture-only mode."""
    r = release(rel)
    if not r.capture_only_mode:
        raise ValueError(f"SGLang {r.version} has no capture-only mode (--enable-return-aux-hidden-states is in "
                         f"{_first_with_capture_only()} on)")
    conv = f"SGLang {r.version} --return-aux-hidden-state-layer-ids"
    ids = ids_for(spec, r, family)
    if any(i < 0 for i in ids):
        raise tap_error(f"{spec.taps[0]!r} needs id {min(ids)}, and the flag takes non-negative ids only", conv)
    got = capture_only(ids, spec.num_layers, spec.hidden_size, r, family)
    assert got.captured_taps == spec.taps and got.error is None, (ids, got)
    return ids


# ----------------------------------------------------------------------------------------------------------------
# findings
# ----------------------------------------------------------------------------------------------------------------

def compare_native_capture(declared: TapSpec, native: NativeCapture, *, fix: Optional[str] = None) -> List[Finding]:
    """:func:`~eagle3_capture.findings.compare_taps` for what stock SGLang captures: first the stored entries it
    drops and the error it then raises, then the slot-by-slot differences, then (0.5.8 - 0.5.10.post1) the same for
    the forwards replayed from CUDA graphs. The default fix says which ids stock SGLang would need, or why none
    can."""
    if fix is None:
        fix = _stock_fix(declared, native)
    out = _compare(declared, native, fix, "")
    if native.graph is not None:
        gfix = (f"{fix}; on SGLang {native.release} the CUDA graphs were captured with the default layers: serve "
                "with --disable-cuda-graph or upgrade to 0.5.11 or later")
        out += [Finding(f.severity, "graph-" + f.code,
                        "forwards replayed from CUDA graphs (decode / target verify) capture the default layers "
                        f"{list(native.graph.stored)} instead: {f.message}", gfix)
                for f in _compare(declared, native.graph, gfix, "")]
    return out


def _compare(declared: TapSpec, native: NativeCapture, fix: str, prefix: str) -> List[Finding]:
    out: List[Finding] = []
    L = native.num_layers
    qwen = native.family == FAMILY_QWEN_MOE
    failed_first = native.error is not None and not native.captured_inputs and native.error_at != ERROR_AT_DRAFT_FC \
        and bool(native.dropped) and native.dropped == native.stored
    who = f"SGLang {native.release} ({native.family})"
    for i in native.dropped:
        if failed_first and -L <= i < L:
            continue  # in range, but nothing runs: the error below says it
        what = (f"{who} stores layer-input index {i} in layers_to_capture "
                f"(draft ids {list(native.ids) if native.ids is not None else 'absent: default'})")
        if qwen and not -L <= i < L:
            why = "out of range of self.layers: IndexError at model load"
        elif qwen or 0 <= i < L:
            why = "repeats an index already captured, which matches once"
        else:
            why = f"never matches a layer (capture loop runs over 0..{L - 1})"
        if i == L:
            out.append(Finding("error", "final-boundary-dropped",
                               f"{what}: it is the final boundary LayerOutput({L - 1}), which a capture at "
                               f"layer inputs (loop 0..{L - 1}) never reaches: {why}; dropped", fix))
        else:
            out.append(Finding("error", "dropped-tap", f"{what}: {why}; dropped", fix))
    if native.error:
        code = {ERROR_AT_LOAD: "startup-error", ERROR_AT_FORWARD: "capture-error"}.get(native.error_at,
                                                                                       "capture-error")
        out.append(Finding("error", code, f"{who} then fails ({native.error_at}): {native.error}", fix))
    if failed_first:
        return out  # nothing reaches the draft: slot-by-slot differences would only repeat the error
    return out + compare_taps(declared, native.captured_taps, fix=fix)


def _stock_fix(declared: TapSpec, native: NativeCapture) -> str:
    want = wanted_capture(declared)
    plugin = "use this project's SGLang plugin, which captures the declared taps exactly"
    try:
        ids = ids_for(declared, native.release, native.family)
    except TapError as e:
        return f"{want}: {plugin} (stock SGLang {native.release} cannot: {e})"
    return (f"{want}: {plugin}, or with stock SGLang {native.release} ({native.family}) set "
            f"eagle_config.eagle_aux_hidden_state_layer_ids to {ids}")


def check_release(declared: TapSpec, ids: Optional[Sequence[int]], rel: Union[str, SGLangRelease] = NEWEST,
                  family: str = FAMILY_DEEPSEEK_V2, *, cuda_graphs: bool = True) -> List[Finding]:
    """Findings for serving a draft trained on ``declared`` with stock release ``rel`` given draft-config ``ids``."""
    native = native_capture(ids, declared.num_layers, declared.hidden_size, rel, family, cuda_graphs=cuda_graphs)
    return compare_native_capture(declared, native)


# ----------------------------------------------------------------------------------------------------------------
# across releases
# ----------------------------------------------------------------------------------------------------------------
