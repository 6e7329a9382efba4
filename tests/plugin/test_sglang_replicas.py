"""Issue 32, kind 1, for real: two server-like replicas, each in its own PID namespace (``unshare --pid --fork
--mount-proc``: both are pid 1, as two containers' servers were both pid 6), serving at the same time through
SGLang's real ModelRunner.forward with the plugin loaded by SGLang's load_plugins(), write one dump directory through
the plugin's real dump writer, with two different capture declarations. No record may be lost (each replica's count
of records it wrote = the records of its requests found in the directory), and the dump format's inventory must
name both declarations, each with its own server.

Skipped, saying why, only where PID namespaces cannot be made (not root, no unshare): replicas.py. Prints the
numbers (run with -s to see them)."""
import os

import pytest

from replicas import run_replicas, unshare_problem
from sglang_fixtures import require_sglang  # noqa: F401  (fixture)

pytestmark = pytest.mark.sglang

REQUESTS, DECODES = 3, 2
GOOD, MISWIRED = "-1,1,3,5", "1,2,3"   # replica A's draft ids; replica B's draft declares other taps


def test_two_replicas_in_separate_pid_namespaces_lose_no_record_and_both_declarations_are_named(tmp_path):
    why = unshare_problem()
    if why is not None:
        pytest.skip(f"two PID namespaces are needed for this test and cannot be made here: {why}")
    from eagle3_capture.dump_format import DumpReader, inventory

    d = tmp_path / "shared"
    d.mkdir()
    a, b = run_replicas(str(d), str(tmp_path / "work"), [(GOOD, REQUESTS), (MISWIRED, REQUESTS)], DECODES)
    assert a["pid"] == b["pid"] == 1, "each replica is pid 1 in its own namespace"
    per = REQUESTS * (1 + DECODES)
    assert a["forwards"] == b["forwards"] == per and a["written"] == b["written"] == per, (a, b)

    files = sorted(os.listdir(d))
    assert not [f for f in files if f.endswith(".tmp")], files
    recs = DumpReader(str(d)).refresh()  # every file read and checked by the dump format's one reader
    found = {rep["ids"]: sum(1 for r in recs if r.requests[0].rid in rep["rids"]) for rep in (a, b)}
    written = a["written"] + b["written"]
    print(f"\ntwo replicas (pid {a['pid']} and pid {b['pid']}, separate PID namespaces): records written "
          f"{a['written']} + {b['written']} = {written}, files found {len(files)}, records read {len(recs)}, "
          f"per replica found {found}")
    assert len(files) == len(recs) == written, (len(files), len(recs), written)
    assert found == {GOOD: per, MISWIRED: per}

    inv = inventory(recs)
    line = inv.mixed()
    print(f"inventory: {line}")
    assert len(inv.groups) == 2 and len(inv.writers) == 2 and inv.records == written
    assert line.startswith("the records come from 2 capture declarations") and "\n" not in line
    servers = {rep["ids"]: {r.server for r in recs if r.requests[0].rid in rep["rids"]} for rep in (a, b)}
    assert all(len(s) == 1 for s in servers.values()) and servers[GOOD] != servers[MISWIRED], servers
    by_server = {next(iter(g.writers)): g for g in inv.groups}
    for ids, (server,) in servers.items():
        g = by_server[server]
        assert list(g.writers) == [server] and len(g.records) == per
        assert f"server {server} (host {os.uname().nodename}, pid 1)" in line
    assert by_server[next(iter(servers[GOOD]))].declaration != by_server[next(iter(servers[MISWIRED]))].declaration
