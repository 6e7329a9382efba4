"""Run inside a subprocess whose sys.path starts with one SGLang release (tests/sglang_release_dirs.py
``--importable``): imports that release's real models and answers, as JSON on stdout, what its real code does for
the cases read as JSON from stdin (test_sglang_releases_code.py compares the answers with sglang_releases/).

- ``set_layers``: ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture(ids)`` on an object built with ``__new__``
  -> ``model.layers_to_capture``;
- ``qwen_set_layers``: ``Qwen2MoeForCausalLM.set_eagle3_layers_to_capture(ids)`` over a real ``Qwen2MoeModel``
  (``__new__``) with L plain layers -> the flagged layers, or the exception;
- ``forward`` (list-in-loop releases): the real ``DeepseekV2Model.forward`` with stand-in layers that record their
  input (hidden + residual) -> which layer inputs the aux list holds, in slot order, or the exception.
"""
from __future__ import annotations

import json
import sys
import warnings
from types import SimpleNamespace


def _set_layers(m, ids, L):
    obj = m.DeepseekV2ForCausalLM.__new__(m.DeepseekV2ForCausalLM)
    obj.pp_group = SimpleNamespace(is_last_rank=True)
    obj.config = SimpleNamespace(num_hidden_layers=L)
    obj.model = SimpleNamespace()
    obj.set_eagle3_layers_to_capture(ids)
    return list(obj.model.layers_to_capture)


def _qwen_set_layers(ids, L):
    import torch

    q = __import__("sglang.srt.models.qwen2_moe", fromlist=["x"])
    top = q.Qwen2MoeForCausalLM.__new__(q.Qwen2MoeForCausalLM)
    torch.nn.Module.__init__(top)
    top.pp_group = SimpleNamespace(is_last_rank=True)
    top.config = SimpleNamespace(num_hidden_layers=L)
    inner = q.Qwen2MoeModel.__new__(q.Qwen2MoeModel)
    torch.nn.Module.__init__(inner)
    inner.layers = [SimpleNamespace() for _ in range(L)]
    top.model = inner
    try:
        top.set_eagle3_layers_to_capture(ids)
    except Exception as e:  # the probe reports what the real code raises
        return {"error": f"{type(e).__name__}: {e}"}
    return {"flagged": [i for i, layer in enumerate(inner.layers) if getattr(layer, "_is_layer_to_capture", False)]}


class _Layer:
    """Stands in for a decoder layer: records its input (hidden_states + residual, or the embedding at layer 0)
    and returns (delta, input) as SGLang's layers return (hidden_states, residual)."""

    def __init__(self, i, seen):
        self.i, self.seen = i, seen

    def __call__(self, positions, hidden_states, forward_batch, residual, *args, **kwargs):
        import torch

        x = hidden_states if residual is None else hidden_states + residual
        self.seen[self.i] = x.clone()
        return torch.full_like(x, 1000.0 * (self.i + 1)), x, None


class _FlagsOff:
    """Server args whose every flag is off (False)."""

    def __getattr__(self, name):
        return False


def _forward(m, stored, L, H=4):
    import torch

    model = m.DeepseekV2Model.__new__(m.DeepseekV2Model)
    torch.nn.Module.__init__(model)
    seen = {}
    for name, value in dict(start_layer=0, end_layer=L, layers_to_capture=list(stored), enable_a2a_moe=False,
                            first_k_dense_replace=0, llama_4_scaling_config=None, nsa_enable_prefill_cp=False,
                            dsa_enable_prefill_cp=False, mla_enable_prefill_cp=False,
                            pp_group=SimpleNamespace(is_first_rank=True, is_last_rank=True)).items():
        object.__setattr__(model, name, value)
    object.__setattr__(model, "layers", [_Layer(i, seen) for i in range(L)])
    object.__setattr__(model, "embed_tokens", lambda ids: ids.float().unsqueeze(-1).repeat(1, H))
    object.__setattr__(model, "norm", lambda h, r=None: h if r is None else (h + r, r))
    # the server's global args: every flag the forward reads (disable_piecewise_cuda_graph, the prefill context
    # parallel switches) off
    sys.modules["sglang.srt.server_args"]._global_server_args = _FlagsOff()
    mode = SimpleNamespace(is_idle=lambda: False, is_context_parallel_extend=lambda: False)
    fb = SimpleNamespace(can_run_tbo=False, attn_cp_metadata=None, forward_mode=mode)
    ids = torch.arange(1, 4)
    try:
        out = model.forward(ids, torch.arange(3), fb)
    except Exception as e:  # the probe reports what the real code raises
        return {"error": f"{type(e).__name__}: {e}"}
    if not isinstance(out, tuple):
        return {"captured": []}
    captured = []
    for t in out[1]:
        match = [i for i, x in seen.items() if torch.equal(t, x)]
        captured.append(match[0] if len(match) == 1 else None)
    return {"captured": captured}


def main() -> int:
    warnings.filterwarnings("ignore")
    cases = json.load(sys.stdin)
    import sglang

    m = __import__("sglang.srt.models.deepseek_v2", fromlist=["x"])
    out = {"version": getattr(sglang, "__version__", None), "file": m.__file__, "set_layers": [],
           "qwen_set_layers": [], "forward": []}
    for ids, L in cases.get("set_layers", []):
        out["set_layers"].append(_set_layers(m, ids, L))
    for ids, L in cases.get("qwen_set_layers", []):
        out["qwen_set_layers"].append(_qwen_set_layers(ids, L))
    for stored, L in cases.get("forward", []):
        out["forward"].append(_forward(m, stored, L))
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
