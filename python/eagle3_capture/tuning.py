"""Device-derived tuning: the launch constants that were chosen on the H200 and move with the device.

One table, in C++ (csrc/kernels/tuning.h), serves the CUDA launchers, the CMake bench binaries and this module:

| value | what it decides | H200 (sm_90, 132 SMs) | RTX PRO 6000 (sm_120, 188 SMs) |
|---|---|---|---|
| decode_max_rows | draft fc rows on the decode kernels | 8, measured | 16, reasoned |
| cluster_min_splits | draft fc auto: cluster kernel from this many split-K pieces per tap | 4, measured | 6 (4 per 132 SMs), reasoned |
| gather_blocks_nvlink / _pcie | p2p gather grid by link class | 264 (2 x SMs), measured / 64 | 376 / 64, reasoned |
| fused_norm_threads | fused add + RMSNorm block size (0: derived per call) | 896 at H=7168, measured | 896 few rows, 448 many rows, reasoned |
| bench_rotation_bytes | benchmark input rotation | 256 MB (>= 4 x 60 MB L2) | 512 MB (4 x 128 MB L2) |

Each can be overridden for a process with an environment variable, read once per device at first use:
EAGLE3_CAPTURE_DECODE_MAX_ROWS (0..16), EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS (>= 1), EAGLE3_CAPTURE_GATHER_BLOCKS
(1..1024, both link classes), EAGLE3_CAPTURE_FUSED_NORM_THREADS (32..1024, a multiple of 32; 0 = derived). A
malformed value makes the CUDA ops raise, naming the variable.
"""
from __future__ import annotations

import json
from dataclasses import astuple, dataclass
from typing import Optional

from .native import load

OVERRIDE_VARIABLES = ("EAGLE3_CAPTURE_DECODE_MAX_ROWS", "EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS",
                      "EAGLE3_CAPTURE_GATHER_BLOCKS", "EAGLE3_CAPTURE_FUSED_NORM_THREADS")


@dataclass(frozen=True)
class DeviceFacts:
    """What a device reports (cudaDeviceGetAttribute), in the order the native table takes them."""
    cc_major: int
    cc_minor: int
    sms: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int
    smem_per_block_optin: int
    smem_reserved_per_block: int
    l2_bytes: int


def tuning_for(facts: DeviceFacts) -> dict:
    """The table's values for a real or pretended device, with the overrides the environment holds now."""
    return json.loads(load().tuning_for(*astuple(facts)))["tuning"]


def fused_norm_threads(facts: DeviceFacts, chunks: int, rows: int, smem_bytes: int, override: int = 0) -> int:
    """The fused add + RMSNorm + capture kernel's block size for a row of `chunks` 16-byte vectors (plus tail) and
    `rows` rows with `smem_bytes` of dynamic shared memory, as its launcher computes it."""
    return int(load().fused_norm_threads(astuple(facts), int(chunks), int(rows), int(smem_bytes), int(override)))


def for_device(index: Optional[int] = None) -> dict:
    """{"facts", "facts_error", "tuning"} of a CUDA device as its launchers use them (cached at their first use, so
    overrides set after that do not apply to it). Needs a CUDA build and a GPU."""
    import torch

    if index is None:
        index = torch.cuda.current_device()
    return json.loads(load().device_tuning(int(index)))


def decode_max_rows(index: Optional[int] = None) -> int:
    """Rows at or below which draft_fc takes the decode kernels on a device: the process-wide setting of
    ops._set_draft_fc_decode_max_rows when one was made, else the device's tuned value."""
    setting = int(load().set_draft_fc_decode_max_rows(0))
    load().set_draft_fc_decode_max_rows(setting)  # read back, put back at once
    return setting if setting >= 0 else int(for_device(index)["tuning"]["decode_max_rows"])


def bench_rotation_bytes(index: Optional[int] = None) -> int:
    """Bytes one benchmark rotation of input copies must span: 4 x the device's L2, at least 256 MB."""
    return int(for_device(index)["tuning"]["bench_rotation_bytes"])
