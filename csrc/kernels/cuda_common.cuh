// Device-side helpers shared by the CUDA kernels: element conversions, vector chunks, alignment choice,
// block reductions. Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace e3 {
namespace cuda {

// A type passed as a value, so a generic lambda can receive it: decltype(tag)::type.
template <typename T> struct TypeTag { using type = T; };

// The one place a DType maps to its device storage type: calls f(TypeTag<T>{}) with T = float, __half or
// __nv_bfloat16 and returns what f returns as an int (a cudaError_t value).
template <typename F>
int with_device_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: return static_cast<int>(f(TypeTag<float>{}));
    case DType::F16: return static_cast<int>(f(TypeTag<__half>{}));
    case DType::BF16: return static_cast<int>(f(TypeTag<__nv_bfloat16>{}));
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A chunk of N elements of T moved as one aligned access of sizeof(T) * N bytes (N * sizeof(T) in {2,4,8,16}).
template <typename T, int N>
struct alignas(sizeof(T) * N) Chunk {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Chunk<T, N> load_chunk(const T* p) {
  return *reinterpret_cast<const Chunk<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void store_chunk(T* p, const Chunk<T, N>& c) {
  *reinterpret_cast<Chunk<T, N>*>(p) = c;
}

// A shared-memory pointer as the 32-bit shared-window address that PTX shared-memory operands take (mbarrier,
// tensor copies, mapa, st.async).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An attribute of the current device, or `fallback` when the query fails (host code). A successful query's value is
// returned as it is, 0 included: 0 is a real answer for some attributes (the minor compute capability, a yes/no
// capability), so it must not be read as a failure.
inline int current_device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, value = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess)
    return fallback;
  return value;
}

// SMs of the current device (132, an H200's, if the query fails): grid sizing of every launcher.
inline int sm_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount, 132); }

// Widest access (in bytes, at most 16) that every pointer, every row stride and the element size allow, so each
// row of each array starts on an access boundary. Rows whose length is not a multiple of the width are finished
// element by element (the tail); results never depend on the width chosen.
inline int pick_access_bytes(int elem_size, const void* const* ptrs, int n_ptrs, const int64_t* strides,
                             int n_strides) {
  int bytes = 16;
  while (bytes > elem_size) {
    bool ok = true;
    for (int i = 0; i < n_ptrs && ok; ++i)
      if (ptrs[i] != nullptr && reinterpret_cast<uintptr_t>(ptrs[i]) % bytes != 0) ok = false;
    for (int i = 0; i < n_strides && ok; ++i)
      if ((strides[i] * elem_size) % bytes != 0) ok = false;
    if (ok) break;
    bytes /= 2;
  }
  return bytes;
}

// Sum over the block; every thread gets the result. `scratch` holds at least 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch may be reused by the caller right after
  return v;
}

}  // namespace cuda
}  // namespace e3
