"""Draft-side hooks: the EAGLE-3 drafts' fc (per-tap RMSNorm, concat, projection) through ``ops.draft_fc``.

Hook points (switch ``draft_fc``), AROUND the draft models' forward:

* ``kimi_k25_eagle3.Eagle3MLAModel.forward`` (Kimi-K2.5 / DeepseekV2-architecture drafts): ``fc_norm`` (a
  ModuleList of RMSNorm, EAGLE-3.1) + ``ColumnParallelLinear`` fc + ``_fc_gatherer`` (all-gather of the column
  shards; the identity at tp=1);
* ``llama_eagle3.LlamaModel.forward`` (the model of ``LlamaForCausalLMEagle3``): plain ``nn.Linear`` fc, optional
  ``fc_norm``, optional ``input_norm`` (one RMSNorm over the whole K*H row, ``norm_before_fc``).

In 0.5.23 both forwards run the fc inline, only when ``forward_batch.spec_info.hidden_states`` is wider than the
draft (the target's packed K*H capture; the draft's own decode steps feed H-wide states and skip it). The hook
computes the fc output with one ``ops.draft_fc`` call from the packed buffer (norms applied on the fly, no concat,
no normalised copy), hands it to SGLang's forward in ``spec_info.hidden_states`` -- which then takes its own
"already projected" path -- and puts the packed buffer back afterwards. Nothing else in the forward changes.

What the op does not take falls back to SGLang's own code, said once in the log: a quantized fc, norms other than
plain weighted RMSNorm with one eps, a dtype other than float32/float16/bfloat16 or differing between activations
and weights, H not a multiple of 8, a device the extension was not built for. ``norm_before_fc`` together with
``fc_norm`` applies SGLang's ``input_norm`` module first, then the fused fc with the per-tap norms.

At TP > 1 the fc's column shards ([T, N/tp] per rank) are gathered by the project's ``tp.PackedGatherer``
(layout "columns", its peer-to-peer kernel) where every GPU pair has peer access and its probe passes, instead of
SGLang's ``_fc_gatherer`` (NVLink multicast, else NCCL); elsewhere SGLang's own gather stays (switch ``gather``
turns the project's off everywhere). The gatherer is built at the first eager draft extend (SGLang's warm-up), so
every draft-extend CUDA graph records its kernel; ``gather_poll_hook`` (AROUND the EAGLE worker's draft extend)
turns a gather timeout into a GatherTimeout in SGLang's loop.

CUDA graphs bake in pointers: the fc weight, bias and input_norm weight are the parameters themselves, and the
fc_norm stack the op needs is made the storage of the fc_norm parameters (``_norm_stack``), so an in-place weight
update of the draft (RL weight sync) reaches every replay.

The fc hook runs at every draft extend, so its per-call work is kept small: whether the op can take the draft's
modules is decided once per set of modules (``_FcPlan``, rebuilt when a module, K or an eps changes; the flags SGLang
sets when it builds a module -- RMSNorm's has_weight, var_hidden_size and dtype casts, the fc's quant method -- are
read then), the hidden states and weights are checked at every call, and with grad mode off the op is called
directly. (Over 400 lines: the two draft models' hooks share these checks, the plan, the norm stack and the gather.)
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch

from .. import draft_layouts
from .installed.internals import LLAMA_DRAFT_FORWARD_PATH, MLA_DRAFT_FORWARD_PATH
from .settings import switches
from .settings.switches import logger

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_fallback_logged = set()
_CACHE_ATTR = "_eagle3_capture_fc_norm_stack"
_ROWS_ATTR = "_eagle3_capture_fc_norm_rows"  # (the stack, its rows' data pointers, a row's shape)
_PLAN_ATTR = "_eagle3_capture_fc_plan"
_modules = {}  # lazily imported modules: "ops", "tp", "RMSNorm"
_draft_fc_op = None  # torch.ops.eagle3_capture.draft_fc.default, once the extension is loaded


def _ops():
    ops = _modules.get("ops")
    if ops is None:
        from .. import ops

        _modules["ops"] = ops
    return ops


def _tp():
    tp = _modules.get("tp")
    if tp is None:
        from .. import tp

        _modules["tp"] = tp
    return tp


def _import_problem(load: Callable[[], object], what: str) -> Optional[str]:
    """None when ``load()`` (a module's lazy import) succeeds, else ``"<what>: <its error>"``."""
    try:
        load()
    except Exception as e:
        return f"{what}: {e}"
    return None


def unavailable() -> Optional[str]:
    """Why the draft fc hooks cannot be installed here (None if they can)."""
    problem = _import_problem(_ops, "the extension does not load")
    if problem is None and not hasattr(_ops(), "draft_fc"):
        return "this build of eagle3_capture has no ops.draft_fc"
    return problem


_backend_list = None


def _backends():
    """The device types the extension was built for (read once: a process's build does not change)."""
    global _backend_list
    if _backend_list is None:
        from .. import native

        _backend_list = list(native.build_info()["backends"])
    return _backend_list


# ----------------------------------------------------------------------------------------------------------------
# What the op can take
# ----------------------------------------------------------------------------------------------------------------

def _rmsnorm_problem(norm) -> Optional[str]:
    RMSNorm = _modules.get("RMSNorm")
    if RMSNorm is None:
        from sglang.srt.layers.layernorm import RMSNorm

        _modules["RMSNorm"] = RMSNorm
    if not isinstance(norm, RMSNorm):
        return f"a {type(norm).__name__}, not SGLang's RMSNorm"
    if not getattr(norm, "has_weight", True):
        return "an RMSNorm without weight"
    if getattr(norm, "variance_size_override", None) is not None:
        return "an RMSNorm with var_hidden_size"
    if getattr(norm, "cast_x_before_out_mul", False):
        return "an RMSNorm with cast_x_before_out_mul"
    if getattr(norm, "override_orig_dtype", None) is not None:
        return "an RMSNorm with override_orig_dtype"
    return None


def _norms_problem(norms) -> Optional[str]:
    for n in norms:
        why = _rmsnorm_problem(n)
        if why is not None:
            return why
    eps = {float(n.variance_epsilon) for n in norms}
    if len(eps) > 1:
        return f"fc_norm eps differ across taps {sorted(eps)}"
    return None


def _weight_problem(weight) -> Optional[str]:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return "an fc without a 2-D weight"
    return None


def _quant_problem(fc) -> Optional[str]:
    qm = getattr(fc, "quant_method", None)
    if qm is not None and type(qm).__name__ != "UnquantizedLinearMethod":
        return f"a quantized fc ({type(qm).__name__})"
    return None


def _tensor_problem(x, weight, what_h: int) -> Optional[str]:
    if x.dim() != 2:
        return f"{x.dim()}-D hidden states"
    if x.dtype not in _DTYPES:
        return f"dtype {x.dtype}"
    if weight.dtype != x.dtype:
        return f"fc weight {weight.dtype} != hidden states {x.dtype}"
    if x.shape[1] > 0 and x.stride(1) != 1:
        return "hidden states with a last stride other than 1"
    if x.device.type not in _backends():
        return f"device {x.device.type} (extension built for {_backends()})"
    if what_h < 8 or what_h % 8:
        return f"tap width {what_h} not a multiple of 8"
    if weight.shape[1] != x.shape[1]:
        return f"fc in_features {weight.shape[1]} != hidden states width {x.shape[1]}"
    return None


def _norm_stack(model, norms, dtype) -> torch.Tensor:
    """The per-tap fc_norm weights as one [K, H] tensor for the op, whose pointer CUDA graphs bake in.

    Where the weights allow it (already `dtype`, one device, [H] each), the stack is built once, outside any capture,
    and each norm's weight is made a view of its row of it: the parameters keep their names, values and weight
    loaders, and an in-place update of a weight (SGLang's update-weights paths copy into the parameters, as they do
    for every weight its graphs read) lands in the stack every graph reads. A weight that was replaced by another
    tensor since is copied into its row and re-pointed at the next eager call. Otherwise (other dtypes, or the
    first call inside a capture) the stack is built at every call, in the graph too, so replays read the weights
    as they are then."""
    weights = [n.weight for n in norms]
    stack = model.__dict__.get(_CACHE_ATTR)
    if stack is not None and stack.dtype == dtype and stack.shape[0] == len(weights):
        rows = model.__dict__.get(_ROWS_ATTR)
        if rows is None or rows[0] is not stack:
            rows = model.__dict__[_ROWS_ATTR] = _rows_of(stack)
        _, ptrs, row_shape = rows  # stack[k].data_ptr() and .shape, without making K views per call
        if all(w.data_ptr() == ptrs[k] and w.shape == row_shape for k, w in enumerate(weights)):
            return stack
    aliasable = (all(w.dtype == dtype and w.dim() == 1 and w.shape == weights[0].shape and w.device == weights[0].device
                     for w in weights) and not (weights[0].is_cuda and torch.cuda.is_current_stream_capturing()))
    if not aliasable:
        return torch.stack([w.detach().to(dtype) for w in weights])
    with torch.no_grad():
        if stack is None or stack.dtype != dtype or stack.shape != (len(weights),) + tuple(weights[0].shape) \
                or stack.device != weights[0].device:
            stack = torch.stack([w.detach() for w in weights])
        else:  # same stack (graphs hold it): copy what changed in
            for k, w in enumerate(weights):
                if w.data_ptr() != stack[k].data_ptr():
                    stack[k].copy_(w.detach())
        for k, n in enumerate(norms):
            n.weight.data = stack[k]
    model.__dict__[_CACHE_ATTR] = stack
    model.__dict__[_ROWS_ATTR] = _rows_of(stack)
    return stack


def _rows_of(stack: torch.Tensor):
    """(stack, each row's data pointer, a row's shape) of a [K, H] norm stack."""
    return stack, tuple(stack[k].data_ptr() for k in range(stack.shape[0])), stack.shape[1:]


class _FcPlan:
    """Whether the op can take one draft's fc modules, and what it reads of them, decided once per set of modules:
    `fc`, the fc_norm modules (`norms`, None without fc_norm) with their eps (`eps_all`), `input_norm` (llama_eagle3)
    and K as read (`k_raw`). `why`: what the op cannot take in them (None: it can), in the order the checks run."""

    __slots__ = ("fc", "norms", "eps_all", "input_norm", "k_raw", "K", "eps", "why")

    def __init__(self, fc, norms, input_norm, k_raw):
        self.fc, self.norms, self.input_norm, self.k_raw = fc, norms, input_norm, k_raw
        self.eps_all = None if norms is None else tuple(getattr(n, "variance_epsilon", None) for n in norms)
        self.K = int(k_raw)
        why = _quant_problem(fc)
        if why is None and norms is not None:
            why = _norms_problem(norms)
            if why is None and len(norms) != self.K:
                why = f"{len(norms)} fc_norm modules for {self.K} taps"
        if why is None and input_norm is not None:
            why = _rmsnorm_problem(input_norm)
        self.why = why
        self.eps = float(norms[0].variance_epsilon) if norms and why is None else 1e-6

    def holds(self, fc, norms, input_norm, k_raw) -> bool:
        if self.fc is not fc or self.input_norm is not input_norm or self.k_raw != k_raw:
            return False
        if norms is None or self.norms is None:
            return norms is self.norms
        if len(norms) != len(self.norms):
            return False
        for a, b, e in zip(self.norms, norms, self.eps_all):
            if a is not b or getattr(b, "variance_epsilon", None) != e:
                return False
        return True


def _fc_plan(model, input_norm) -> _FcPlan:
    """The draft's plan: the one kept on the model while it holds for the model's current modules, else a new one."""
    fc = model.fc
    fc_norm = getattr(model, "fc_norm", None)  # absent on 0.5.12's MLA draft
    norms = tuple(fc_norm) if fc_norm is not None else None
    k_raw = getattr(model, "num_aux_hidden_states", 1)  # only read with fc_norm (absent with it on 0.5.12 MLA)
    plan = model.__dict__.get(_PLAN_ATTR)
    if plan is None or not plan.holds(fc, norms, input_norm, k_raw):
        plan = model.__dict__[_PLAN_ATTR] = _FcPlan(fc, norms, input_norm, k_raw)
    return plan


def _fall_back(cls: str, why: str) -> None:
    key = (cls, why)
    if key not in _fallback_logged:
        _fallback_logged.add(key)
        logger.warning("eagle3_capture: %s fc runs SGLang's own code: %s", cls, why)


def fused_fc(x, weight, norm_weights, eps: float, bias, row_norm_weight=None, row_eps: float = 1e-6):
    """The op calls the hooks make, in one place: `x` the packed [T, K*H] capture, `weight` [N, K*H], `norm_weights`
    the per-tap fc_norm weights [K, H] or None, `bias` [N] or None; `row_norm_weight` [K*H] an RMSNorm over the
    whole row (llama_eagle3's input_norm, norm_before_fc). A row norm alone is the op's K=1 case; with per-tap norms
    as well, the hook applies it first with SGLang's own input_norm module and passes the result as `x`."""
    if row_norm_weight is not None and norm_weights is None:
        norm_weights, eps = row_norm_weight.view(1, -1), row_eps
    if torch.is_grad_enabled() or not isinstance(x, torch.Tensor) or not (
            norm_weights is None or isinstance(norm_weights, torch.Tensor)):
        return _ops().draft_fc(x, weight, norm_weights, eps, bias)  # the API, with its inference-only check
    global _draft_fc_op
    if _draft_fc_op is None:
        _ops()
        _draft_fc_op = torch.ops.eagle3_capture.draft_fc.default
    return _draft_fc_op([x], weight, norm_weights, eps, bias)  # what ops.draft_fc calls for these arguments


# ----------------------------------------------------------------------------------------------------------------
# The fused fc for each draft model
# ----------------------------------------------------------------------------------------------------------------

def _mla_fc(model, x) -> Optional[torch.Tensor]:
    """Eagle3MLAModel: cat(fc_norm_k(x_k)) -> ColumnParallelLinear -> _fc_gatherer (0.5.18+), or a replicated
    nn.Linear without fc_norm (0.5.12) or with it (0.5.14, 0.5.16)."""
    plan = _fc_plan(model, None)
    fc = plan.fc
    weight = getattr(fc, "weight", None)
    why = _weight_problem(weight) or plan.why
    if why is None:
        why = _tensor_problem(x, weight, x.shape[1] // plan.K if plan.norms is not None else x.shape[1])
    if why is not None:
        _fall_back(type(model).__name__, why)
        return None
    bias = None if getattr(fc, "skip_bias_add", False) else fc.bias
    g = _norm_stack(model, plan.norms, x.dtype) if plan.norms is not None else None
    y = fused_fc(x, weight, g, plan.eps, bias)
    return gather_columns(model, fc, y)


def _llama_fc(model, x) -> Optional[torch.Tensor]:
    """llama_eagle3.LlamaModel: [input_norm over the row] -> cat(fc_norm_k(x_k)) -> nn.Linear."""
    input_norm = getattr(model, "input_norm", None)  # norm_before_fc: 0.5.18+
    plan = _fc_plan(model, input_norm)
    fc = plan.fc
    weight = getattr(fc, "weight", None)
    why = _weight_problem(weight) or plan.why
    if why is None:
        why = _tensor_problem(x, weight, x.shape[1] // plan.K if plan.norms is not None else x.shape[1])
    if why is None and input_norm is not None and input_norm.weight.dtype != x.dtype:
        why = f"input_norm weight {input_norm.weight.dtype} != hidden states {x.dtype}"
    if why is not None:
        _fall_back(type(model).__name__, why)
        return None
    bias = fc.bias
    if plan.norms is not None:
        if input_norm is not None:
            x = input_norm(x)  # SGLang's own module: the row norm the per-tap norms then see
        g = _norm_stack(model, plan.norms, x.dtype)
        return fused_fc(x, weight, g, plan.eps, bias)
    if input_norm is not None:  # one norm over the whole K*H row: the op's K=1 case
        return fused_fc(x, weight, None, 1e-6, bias, row_norm_weight=input_norm.weight.detach(),
                        row_eps=float(input_norm.variance_epsilon))
    return fused_fc(x, weight, None, 1e-6, bias)


# ----------------------------------------------------------------------------------------------------------------
# Column-shard gather of the fc output at TP > 1: the project's PackedGatherer
# ----------------------------------------------------------------------------------------------------------------

_GATHER_ATTR = "_eagle3_capture_fc_gatherer"
_GATHER_OFF = "off"


def gather_unavailable() -> Optional[str]:
    """Why the project's column-shard gather cannot be used here (None if it can)."""
    return _import_problem(_tp, "eagle3_capture.tp does not import")


def _max_rows() -> int:
    """Rows the gatherer is sized for: SGLang's own sizing of its fc gatherer (decode batch x draft tokens, or a
    prefill chunk; at least 512); larger batches use SGLang's gather."""
    try:
        from sglang.srt.distributed.device_communicators import triton_symm_mem_ag

        return int(triton_symm_mem_ag.recommended_max_tokens(include_prefill=True, floor=512))
    except Exception:
        return 512


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def gather_columns(model, fc, y: torch.Tensor) -> torch.Tensor:
    """[T, N/tp] column shard of every TP rank -> [T, N] on every rank, through ``tp.PackedGatherer`` (layout
    "columns": one tap of width N); SGLang's ``model._fc_gatherer`` at tp=1 (the identity), when the switch is off,
    for more rows than the gatherer holds, or while a CUDA graph is being captured before the gatherer exists
    (building it is collective and cannot run inside a capture). Every TP rank runs the same batch, so every rank
    takes the same branch."""
    fc_gatherer = getattr(model, "_fc_gatherer", None)
    if fc_gatherer is None:  # 0.5.12-0.5.16: the fc is a replicated nn.Linear, its output already whole
        return y
    group = _fc_group(fc)
    world = int(getattr(group, "world_size", 1) or 1)
    if world <= 1 or not switches.enabled(switches.GATHER) or y.dim() != 2:
        return fc_gatherer(y)
    state = model.__dict__.get(_GATHER_ATTR)
    if state is None:
        if _capturing(y):
            return fc_gatherer(y)
        state = _build_gatherer(model, group, y, world)
        model.__dict__[_GATHER_ATTR] = state
    if state == _GATHER_OFF or y.shape[0] > state.max_rows_per_rank or y.dtype != state.dtype:
        return fc_gatherer(y)
    if y.shape[0] == 0:
        return y.new_empty((0, state.hidden_size))
    return state.gather(y if y.stride(-1) == 1 else y.contiguous())


def _fc_group(fc):
    """The group the fc's columns are sharded over: its own ``tp_group`` (0.5.22+), else SGLang's TP group, which
    ColumnParallelLinear shards over on 0.5.16-0.5.21 (it keeps only tp_size / tp_rank there); None -- SGLang's
    ``_fc_gatherer`` then gathers -- where that group is not set up or its size is not the fc's tp_size."""
    group = getattr(fc, "tp_group", None)
    if group is not None:
        return group
    try:
        from sglang.srt.distributed import get_tp_group

        group = get_tp_group()
    except Exception:  # no TP group in this process (a single-process load): nothing to gather
        return None
    same = int(getattr(group, "world_size", 1) or 1) == int(getattr(fc, "tp_size", 1) or 1)
    return group if same else None


def _dist_timeout_s() -> float:
    """SGLang's `--dist-timeout` when set (its process groups' timeout), else torch's default NCCL timeout."""
    try:
        from sglang.srt.runtime_context import get_parallel

        t = get_parallel().dist_timeout
        if t:
            return float(t)
    except Exception:
        pass
    return _tp().default_timeout_s()


def _build_gatherer(model, group, y: torch.Tensor, world: int):
    """The project's gatherer where its p2p kernel runs; _GATHER_OFF (SGLang's own `_fc_gatherer`) otherwise. Built
    at the first eager call, i.e. in SGLang's eager warm-up before the first draft-extend capture, so every
    draft-extend graph records the p2p kernel. Where only NCCL would be left (the probe failed, no peer access,
    NCCL_P2P_DISABLE, gloo on CPU) SGLang's own communicator does the gather: under its graph_capture that is its
    GroupCoordinator's all_gather (pynccl), not torch's ProcessGroupNCCL recorded into SGLang's graphs."""
    tp = _tp()
    pg = getattr(group, "device_group", None)
    if pg is None:
        logger.warning("eagle3_capture: %s: TP group without a device group; the fc gather stays SGLang's",
                       type(model).__name__)
        return _GATHER_OFF
    try:
        g = tp.PackedGatherer(pg, num_taps=1, hidden_size=int(y.shape[1]) * world, dtype=y.dtype,
                              max_rows_per_rank=_max_rows(), device=y.device, layout=tp.COLUMNS,
                              timeout_s=_dist_timeout_s())
    except Exception as e:  # raised on every rank alike (its checks are collective)
        logger.warning("eagle3_capture: %s: the project's gatherer could not be set up (%s); the fc gather stays "
                       "SGLang's", type(model).__name__, e)
        return _GATHER_OFF
    if g.backend != "p2p":  # the same decision on every rank (the plan and the probe's vote are collective)
        reason = g.plan.reason if g.plan is not None else f"backend {g.backend}"
        g.close()
        logger.info("eagle3_capture: %s fc column shards gathered by SGLang's own communicator (the p2p kernel is "
                    "not used here: %s)", type(model).__name__, reason)
        return _GATHER_OFF
    logger.info("eagle3_capture: %s fc column shards gathered by PackedGatherer (p2p kernel, %s signal, tp=%d, "
                "N=%d, up to %d rows, timeout %g s)", type(model).__name__, g.signal, world, g.hidden_size,
                g.max_rows_per_rank, g.timeout_s)
    return g


# ----------------------------------------------------------------------------------------------------------------
# The gather's error poll, outside the captured region
# ----------------------------------------------------------------------------------------------------------------



def gather_poll_hook(original, self, *args, **kwargs):
    """AROUND the EAGLE worker's draft extend (decode and prefill), the only forwards whose fc is wide enough to
    gather: its draft-extend graph replay (or eager forward) runs the p2p gather, and no Python runs inside a
    replay. Before and after it, the host-mapped error words of this process's p2p gatherers are read (no CUDA call):
    a gather that timed out in an earlier step raises GatherTimeout here, naming the peer and the step. Its kernel
    has also trapped, so a CUDA error may surface first anywhere in SGLang's loop; raised from inside the draft
    extend, it is re-raised as the GatherTimeout that explains it."""
    tp = _tp()
    tp.raise_if_a_gather_failed()
    try:
        out = original(self, *args, **kwargs)
    except Exception as e:
        try:
            tp.raise_if_a_gather_failed()
        except tp.GatherTimeout as why:
            raise why from e
        raise
    tp.raise_if_a_gather_failed()
    return out


def gather_hooks(i) -> List[Tuple[str, Callable]]:
    """The gather's error poll around each draft extend the release `i` (internals.Internals) has."""
    return [(path, gather_poll_hook) for path in i.draft_extend_paths]


def _fc_forward_hook(compute: Callable):
    def hook(original, self, input_ids, positions, forward_batch, *args, **kwargs):
        spec_info = getattr(forward_batch, "spec_info", None)
        x = getattr(spec_info, "hidden_states", None)
        embed_dim = getattr(getattr(self, "embed_tokens", None), "embedding_dim", None) or self.config.hidden_size
        if not isinstance(x, torch.Tensor) or x.shape[-1] == embed_dim:
            return original(self, input_ids, positions, forward_batch, *args, **kwargs)
        y = compute(self, x)
        if y is None:
            return original(self, input_ids, positions, forward_batch, *args, **kwargs)
        spec_info.hidden_states = y  # SGLang's forward then skips its own fc (already draft-wide)
        try:
            return original(self, input_ids, positions, forward_batch, *args, **kwargs)
        finally:
            spec_info.hidden_states = x

    hook.__name__ = f"draft_fc_hook_{compute.__name__.strip('_')}"
    return hook


mla_forward_hook = _fc_forward_hook(_mla_fc)
llama_forward_hook = _fc_forward_hook(_llama_fc)

# one AROUND hook per draft layout, on the SGLang forward its row names (draft_layouts.py)
HOOKS: List[Tuple[str, Callable]] = [(lay.sglang_forward, draft_layouts.implementation(lay.plugin_hook))
                                     for lay in draft_layouts.LAYOUTS]

__all__ = ["MLA_DRAFT_FORWARD_PATH", "LLAMA_DRAFT_FORWARD_PATH", "HOOKS", "gather_hooks", "unavailable",
           "gather_unavailable", "fused_fc", "gather_columns", "mla_forward_hook", "llama_forward_hook",
           "gather_poll_hook"]
