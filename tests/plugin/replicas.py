"""Run server-like replicas (replica_server.py) at once, each in its own PID namespace, all writing one dump
directory through the plugin's real dump (issue 32, kind 1: two replicas in separate containers were both pid 6 and
overwrote each other's records). Used by tests/plugin/test_sglang_replicas.py and tests/sweep_issue32_plugin.py.

``unshare --pid --fork --mount-proc`` needs root (or a user namespace the kernel allows): :func:`unshare_problem`
says why it cannot run here, or None.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "replica_server.py")
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def unshare_problem() -> Optional[str]:
    """Why replicas cannot get their own PID namespaces here (None: they can)."""
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux) on this machine"
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()}): `unshare --pid --fork --mount-proc` needs root here"
    try:
        p = subprocess.run(UNSHARE + ["sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`unshare --pid --fork --mount-proc` did not run: {e}"
    if p.returncode != 0 or p.stdout.strip() != "1":
        return (f"`unshare --pid --fork --mount-proc sh -c 'echo $$'` gave exit {p.returncode}, stdout "
                f"{p.stdout.strip()!r} (expected 1), stderr {p.stderr.strip()[-300:]!r}")
    return None


def run_replicas(dump_dir: str, work: str, replicas: Sequence[Tuple[str, int]], decodes: int = 2,
                 env_extra: Optional[Dict[str, str]] = None, timeout: int = 300) -> List[dict]:
    """Start every replica (ids, requests) at once, each under ``unshare --pid --fork --mount-proc``, with
    ``EAGLE3_CAPTURE_DUMP=dump_dir``; wait for all; their reports (replica_server.py's OUT.json), in order. Raises
    AssertionError with the replica's stderr when one fails."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env.update(TORCHDYNAMO_DISABLE="1", EAGLE3_CAPTURE_DUMP=dump_dir,
               EAGLE3_CAPTURE_DUMP_REQUESTS=str(max(r for _, r in replicas) + 1))
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.makedirs(work, exist_ok=True)
    outs = [os.path.join(work, f"replica{i}.json") for i in range(len(replicas))]
    procs = [subprocess.Popen(UNSHARE + [sys.executable, SCRIPT, out, ids, str(n), str(decodes)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for out, (ids, n) in zip(outs, replicas)]
    errs = []
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"replica {i} did not finish within {timeout} s")
        errs.append((p.returncode, err))
    for i, (rc, err) in enumerate(errs):
        if rc != 0:
            raise AssertionError(f"replica {i} ({replicas[i][0]}) failed (exit {rc}):\n{err[-4000:]}")
    reports = []
    for out in outs:
        with open(out) as f:
            reports.append(json.load(f))
    return reports


__all__ = ["unshare_problem", "run_replicas", "SCRIPT", "UNSHARE"]
