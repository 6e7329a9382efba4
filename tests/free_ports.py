"""TCP ports for the tests' servers and rendezvous (gloo's MASTER_PORT, Prometheus, launch_server), one range per
pytest-xdist worker.

A port found free with bind(0) comes from the kernel's ephemeral range (32768-60999 here); between finding it and
the server's own bind, another worker's bind(0) can be handed the same one. Here each worker draws from its own
range, below the ephemeral range: two workers never pick the same port, and the kernel never hands one of them out
to a client. Within a process a port is handed out once (a test may start two servers before either binds).
Outside xdist the process counts as worker 0. Two pytest sessions at once (CI runs the engine suite beside the
release matrix) keep apart by E3_TEST_PORT_SLOT: the session's first range (default 0), its workers counting on
from there.

Ports stay below 55536: SGLang 0.5.12's launch_server takes HTTP port + 10000 as its gRPC port and refuses one
above 65535.
"""
from __future__ import annotations

import os
import random
import socket

BASE = 20000
PER_WORKER = 2000
SLOT_ENV = "E3_TEST_PORT_SLOT"
_HANDED_OUT = set()


def worker_index() -> int:
    """This process's range: E3_TEST_PORT_SLOT (default 0) plus its pytest-xdist worker number (gw0 -> 0, gw3 ->
    3; 0 outside xdist)."""
    raw = os.environ.get(SLOT_ENV, "0")
    if not raw.isdigit():
        raise ValueError(f"{SLOT_ENV} must be a whole number, got {raw!r}")
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(raw) + (int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0)


def free_port() -> int:
    """A port on 127.0.0.1 free now, from this worker's range, not handed out before by this process."""
    index = worker_index()
    low = BASE + PER_WORKER * index
    if low + PER_WORKER > 55536:
        raise RuntimeError(f"free_port: range {index} ({SLOT_ENV} + the pytest-xdist worker) has no ports below "
                           f"55536 ({PER_WORKER} a range from {BASE}): use fewer workers or a lower {SLOT_ENV}")
    start = random.randrange(PER_WORKER)
    for k in range(PER_WORKER):
        port = low + (start + k) % PER_WORKER
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"free_port: no free port in {low}-{low + PER_WORKER - 1} (range {index})")
