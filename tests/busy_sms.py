"""Test-only: a kernel on another stream that keeps SMs busy, so that not every block of a gather grid is resident at
once (what other streams' kernels or MPS clients do to a served gather).

The kernel is PTX text loaded through the CUDA driver API (ctypes, libcuda): no compiler and no extension needed,
and it runs under compute-sanitizer like any other kernel. Each block has 1024 threads, every one of which spins on
%globaltimer for `spin_ns` nanoseconds from its block's start, and requests half of an SM's shared memory (less the
1 KB the driver reserves per block): two busy blocks fill an SM's 2048 thread slots and its shared memory, so no
block of another kernel fits beside them, whichever of the two limits the scheduler applies first.
"""
from __future__ import annotations

import ctypes
import torch

PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry e3_busy(.param .u64 p_spin)
{
  .reg .pred %p<3>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [p_spin];
  mov.u64 %rd2, %globaltimer;
  add.u64 %rd3, %rd2, %rd1;
SPIN:
  mov.u64 %rd4, %globaltimer;
  setp.lt.u64 %p2, %rd4, %rd3;
  @%p2 bra SPIN;
  ret;
}
"""

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
THREADS = 1024

_state: dict = {}


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"busy_sms: {what} failed with CUresult {rc}")


def _function(device: int):
    """The loaded kernel for `device` (once per device), the device's SM count and a busy block's shared memory."""
    if device in _state:
        return _state[device]
    torch.zeros(1, device=f"cuda:{device}")  # the primary context exists and is current on this thread
    cuda = _state.setdefault("lib", ctypes.CDLL("libcuda.so.1"))
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    _check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    _check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"e3_busy"), "cuModuleGetFunction")
    attrs = {}
    for name, attr in (("sms", _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                       ("optin", _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                       ("per_sm", _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)):
        v = ctypes.c_int()
        _check(cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, device), f"cuDeviceGetAttribute({name})")
        attrs[name] = v.value
    smem = min(attrs["optin"], attrs["per_sm"] // 2 - 1024)
    _check(cuda.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute")
    _state[device] = (cuda, module, fn, attrs["sms"], smem)
    return _state[device]


def sm_count(device: int = 0) -> int:
    return _function(device)[3]


def launch(stream: torch.cuda.Stream, blocks: int, spin_ns: int) -> None:
    """`blocks` busy blocks on `stream`, each holding half an SM for `spin_ns` ns from its own start: 2 x (SMs - 1)
    blocks leave exactly one SM for everything else while they spin (up to two SMs half free, if the scheduler
    pairs them unevenly); a larger grid runs in waves."""
    device = stream.device.index if stream.device.index is not None else torch.cuda.current_device()
    cuda, _, fn, _, smem = _function(device)
    spin = ctypes.c_uint64(int(spin_ns))
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(spin), ctypes.c_void_p))
    _check(cuda.cuLaunchKernel(fn, int(blocks), 1, 1, THREADS, 1, 1, smem, ctypes.c_void_p(stream.cuda_stream),
                               params, None), "cuLaunchKernel")
