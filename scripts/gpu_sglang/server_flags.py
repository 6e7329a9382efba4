"""Which CUDA-graph size options the installed SGLang release accepts, read from its own ``ServerArgs``.

SGLang 0.5.12 has one list, ``--cuda-graph-bs`` (field ``cuda_graph_bs``, decode graphs only); from 0.5.14 there are
``--cuda-graph-bs-decode`` and ``--cuda-graph-bs-prefill`` (prefill graphs appear with the breakable runner), and
there argparse refuses ``--cuda-graph-bs`` as an ambiguous prefix of both (launch_server exits 2). So the options a
server gets are chosen by what the release's parser holds, never by a version table:

    python scripts/gpu_sglang/server_flags.py     # prints {"version", "options": [...], "fields": [...]} as JSON

:func:`accepted` runs that in a child process with the server's own environment (the stand-ins on its path, as
the server will import SGLang), so the launching process never imports SGLang itself.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, Iterable, List, Optional, Sequence

DECODE, PREFILL, ONE_LIST = "--cuda-graph-bs-decode", "--cuda-graph-bs-prefill", "--cuda-graph-bs"
# SGLang 0.5.12 also captures prefill in a piecewise CUDA graph by default, which --disable-cuda-graph leaves on (on
# a host without a GPU its runner asks torch.cpu for a graph pool handle and the server dies at start)
NO_GRAPHS, NO_PIECEWISE = "--disable-cuda-graph", "--disable-piecewise-cuda-graph"


def stock_layer_inputs(ids: List[int]) -> Optional[List[int]]:
    """What the installed SGLang's own ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` makes of draft ids
    (run on an object made with ``__new__``: it reads only pp_group, config and model), None if it raises."""
    import types

    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    m = DeepseekV2ForCausalLM.__new__(DeepseekV2ForCausalLM)
    for attr in ("_modules", "_parameters", "_buffers"):  # nn.Module's attribute machinery without its __init__
        object.__setattr__(m, attr, {})
    m.__dict__.update(pp_group=types.SimpleNamespace(is_last_rank=True),
                      config=types.SimpleNamespace(num_hidden_layers=64),
                      model=types.SimpleNamespace(layers_to_capture=[]))
    try:
        m.set_eagle3_layers_to_capture(list(ids))
    except Exception:
        return None
    return list(m.model.layers_to_capture)


def id_rule() -> str:
    """How the installed release turns draft ids into layer inputs: "shift_all" (+1 on every id, up to 0.5.12)
    or "shift_if_first_is_1" (from 0.5.13: ids used unchanged unless the first is 1)."""
    got = stock_layer_inputs([0, 2, 5])
    if got == [1, 3, 6]:
        return "shift_all"
    if got == [0, 2, 5] and stock_layer_inputs([1, 2, 5]) == [2, 3, 6]:
        return "shift_if_first_is_1"
    raise ValueError(f"this SGLang's set_eagle3_layers_to_capture turns [0, 2, 5] into {got}: a rule this harness "
                     "does not know")


def release_options() -> dict:
    """The installed release's launch_server options and the matching ServerArgs attribute names (``dest``)."""
    import argparse

    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    options, fields = [], []
    for action in parser._actions:  # argparse's public surface has no other way to list what it accepts
        options += [o for o in action.option_strings if o.startswith("--")]
        fields.append(action.dest)
    return {"version": getattr(sglang, "__version__", None), "options": sorted(set(options)),
            "fields": sorted(set(fields)), "id_rule": id_rule()}


def graph_options(options: Iterable[str], decode: Sequence[int], prefill: Sequence[int]) -> List[str]:
    """launch_server's arguments for these CUDA-graph sizes on a release whose parser has ``options``. A release
    with no prefill graphs gets the decode sizes only. ValueError when it has neither spelling."""
    have = set(options)
    if DECODE in have:
        out = [DECODE, *map(str, decode)]
        if prefill and PREFILL in have:
            out += [PREFILL, *map(str, prefill)]
        return out
    if ONE_LIST in have:
        return [ONE_LIST, *map(str, decode)]
    raise ValueError(f"this SGLang's launch_server accepts none of {DECODE}, {ONE_LIST}: its CUDA-graph sizes "
                     "cannot be set")


def eager_options(options: Iterable[str]) -> List[str]:
    """launch_server's arguments for no CUDA graph at all on a release whose parser has ``options``: the piecewise
    prefill graph off too where the release has one."""
    return [NO_GRAPHS] + ([NO_PIECEWISE] if NO_PIECEWISE in set(options) else [])


def eager_kwargs(fields: Iterable[str]) -> Dict[str, bool]:
    """The same as ``sglang.Engine`` keyword arguments (ServerArgs field names; ``disable_cuda_graph`` is in every
    release)."""
    field = NO_PIECEWISE[2:].replace("-", "_")
    return {"disable_cuda_graph": True, **({field: True} if field in set(fields) else {})}


def graph_kwargs(fields: Iterable[str], decode: Sequence[int], prefill: Sequence[int]) -> Dict[str, List[int]]:
    """The same choice as ``sglang.Engine`` keyword arguments (ServerArgs field names)."""
    names = {o: o[2:].replace("-", "_") for o in (DECODE, PREFILL, ONE_LIST)}
    cli = graph_options({o for o, f in names.items() if f in set(fields)}, decode, prefill)
    out: Dict[str, List[int]] = {}
    key: Optional[str] = None
    for tok in cli:
        if tok.startswith("--"):
            key = names[tok]
            out[key] = []
        else:
            out[key].append(int(tok))
    return out


def accepted(env: Dict[str, str], cwd: Optional[str] = None, timeout_s: float = 180.0) -> dict:
    """:func:`release_options` of the SGLang that a process with ``env`` imports (a child process: the caller
    does not import SGLang). RuntimeError with the child's last lines when it fails."""
    p = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"reading SGLang's ServerArgs failed (exit {p.returncode}): {p.stderr[-1500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(release_options()))
