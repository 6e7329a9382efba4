"""Runs inside vLLM's worker through ``LLM.apply_model``: a plain torch forward hook on the target model that keeps
the aux hidden states of its first forwards, and the read-back. A module of its own (not serve_llm.py's
``__main__``): apply_model pickles the function by reference, and every vLLM process must import it by name."""
from __future__ import annotations


def attach(limit, model):
    """Runs in the worker: keep the aux hidden states of the target's first ``limit`` forwards on the model. The hook
    sits on the causal LM, whose forward returns its DeepseekV2Model's output: a hook on the DeepseekV2Model itself
    would never run (vLLM's compile decorator calls its ``forward`` directly, around ``nn.Module.__call__``)."""
    model._e3_observed = []

    def hook(module, args, output):
        if isinstance(output, tuple) and len(module._e3_observed) < limit:
            module._e3_observed.append([t.detach().clone().cpu() for t in output[1]])

    model.register_forward_hook(hook)
    return type(model).__name__


def collect(model):
    return [[t.tolist() for t in aux] for aux in model._e3_observed]


__all__ = ["attach", "collect"]
