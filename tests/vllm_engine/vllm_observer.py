"""Runs inside vLLM's worker through ``LLM.apply_model``: a plain torch forward hook on the target model that keeps,
for its first forwards, the tokens and positions it was given and the aux hidden states it returned, and the
read-back. A module of its own (not serve_llm.py's ``__main__``): apply_model pickles the function by reference,
and every vLLM process must import it by name.

Why tokens and positions: the engine schedules requests as they arrive (the first prompt's prefill may run alone,
the others' in the next step, beside decodes), so which rows of a forward are which prompt's prefill is read from
the rows themselves (:func:`prefill_rows`), never assumed from the order of forwards."""
from __future__ import annotations


def attach(limit, model):
    """Runs in the worker: keep (input_ids, positions, aux hidden states) of the target's first ``limit`` forwards
    on the model. The hook sits on the causal LM, whose forward returns its DeepseekV2Model's output: a hook on the
    DeepseekV2Model itself would never run (vLLM's compile decorator calls its ``forward`` directly, around
    ``nn.Module.__call__``). The runner calls it with keywords (gpu_model_runner.py ``_model_forward``)."""
    model._e3_observed = []

    def hook(module, args, kwargs, output):
        if isinstance(output, tuple) and len(module._e3_observed) < limit:
            ids = kwargs.get("input_ids", args[0] if args else None)
            pos = kwargs.get("positions", args[1] if len(args) > 1 else None)
            n = output[1][0].shape[0]
            module._e3_observed.append({
                "input_ids": None if ids is None else ids[:n].detach().cpu().tolist(),
                "positions": pos[:n].detach().cpu().tolist(),
                "aux": [t.detach().clone().cpu() for t in output[1]],
            })

    model.register_forward_hook(hook, with_kwargs=True)
    return type(model).__name__


def collect(model):
    return [{**f, "aux": [t.tolist() for t in f["aux"]]} for f in model._e3_observed]


def prefill_rows(observed, prompt):
    """The aux rows of ``prompt``'s prefill ([len(prompt)] rows per tap, as lists), found in the observed forwards
    as the rows whose positions run 0..P-1 over the prompt's tokens; None if no forward holds it whole."""
    P = len(prompt)
    for f in observed:
        ids, pos = f["input_ids"], f["positions"]
        for start in range(len(pos) - P + 1):
            if pos[start] == 0 and pos[start:start + P] == list(range(P)) and ids[start:start + P] == prompt:
                return [tap[start:start + P] for tap in f["aux"]]
    return None


__all__ = ["attach", "collect", "prefill_rows"]
