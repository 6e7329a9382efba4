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
            "fields": sorted(set(fields))}


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
