"""Test-only: a kernel on another stream that keeps SMs busy, so that not every block of a gather grid is resident at
once (what other streams' kernels or MPS clients do to a served gather).

The kernel is PTX text loaded through the CUDA driver API (ctypes, libcuda): no compiler and no extension needed,
and it runs under compute-sanitizer like any other kernel. Each block requests `smem` bytes of dynamic shared
memory (by default the most a block may have, so a busy block fills its SM and no block of another kernel fits
beside it) and its first thread spins on %globaltimer for `spin_ns` nanoseconds from the block's own start."""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry e3_busy(.param .u64 p_spin)
{
  .reg .pred %p<3>;
  .reg .b32 %r<2>;
  .reg .b64 %rd<5>;
  mov.u32 %r1, %tid.x;
  setp.ne.s32 %p1, %r1, 0;
  @%p1 bra DONE;
  ld.param.u64 %rd1, [p_spin];
  mov.u64 %rd2, %globaltimer;
  add.u64 %rd3, %rd2, %rd1;
SPIN:
  mov.u64 %rd4, %globaltimer;
  setp.lt.u64 %p2, %rd4, %rd3;
  @%p2 bra SPIN;
DONE:
  ret;
}
"""

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97

_state: dict = {}


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"busy_sms: {what} failed with CUresult {rc}")


def _function(device: int):
    """The loaded kernel for `device` (once per device) and the device's SM count and opt-in shared memory."""
    if device in _state:
        return _state[device]
    torch.zeros(1, device=f"cuda:{device}")  # the primary context exists and is current on this thread
    cuda = _state.setdefault("lib", ctypes.CDLL("libcuda.so.1"))
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    _check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    _check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"e3_busy"), "cuModuleGetFunction")
    sms, optin = ctypes.c_int(), ctypes.c_int()
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(sms), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
           "cuDeviceGetAttribute(SM count)")
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(optin), _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                     device), "cuDeviceGetAttribute(shared memory opt-in)")
    _check(cuda.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin.value),
           "cuFuncSetAttribute")
    _state[device] = (cuda, module, fn, sms.value, optin.value)
    return _state[device]


def sm_count(device: int = 0) -> int:
    return _function(device)[3]


def launch(stream: torch.cuda.Stream, blocks: int, spin_ns: int, smem: Optional[int] = None) -> None:
    """`blocks` busy blocks on `stream`, each holding its SM (with the default `smem`) for `spin_ns` ns from its own
    start: grid = SMs - 1 leaves exactly one SM for everything else while they spin; a larger grid runs in waves."""
    device = stream.device.index if stream.device.index is not None else torch.cuda.current_device()
    cuda, _, fn, _, optin = _function(device)
    spin = ctypes.c_uint64(int(spin_ns))
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(spin), ctypes.c_void_p))
    _check(cuda.cuLaunchKernel(fn, int(blocks), 1, 1, 32, 1, 1, optin if smem is None else int(smem),
                               ctypes.c_void_p(stream.cuda_stream), params, None), "cuLaunchKernel")
