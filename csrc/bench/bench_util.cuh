// Small helpers for the torch-free bench binaries: error checks, argument parsing, random fill, event timing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define E3_CHECK(expr)                                                                          \
  do {                                                                                          \
    cudaError_t e3_err_ = static_cast<cudaError_t>(expr);                                       \
    if (e3_err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                 \
                   cudaGetErrorString(e3_err_));                                                \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

#include "../kernels/device.h"

namespace bench {

// Copies of `bytes_per_copy` whose rotation spans the device's bench_rotation_bytes (tuning.h: 4 x L2, at least
// 256 MB), so no timing sits in L2; exits if that takes more than `cap` copies.
inline int rotation_copies(size_t bytes_per_copy, int cap = 4096) {
  const size_t target = static_cast<size_t>(e3::device_tuning().bench_rotation_bytes);
  const size_t per = bytes_per_copy > 0 ? bytes_per_copy : 1;
  size_t n = (target + per - 1) / per;
  if (n < 2) n = 2;
  if (n > static_cast<size_t>(cap)) {
    std::fprintf(stderr, "a rotation of %zu bytes needs %zu copies of %zu bytes, more than %d\n", target, n, per, cap);
    std::exit(2);
  }
  return static_cast<int>(n);
}

// "--name value" lookup with a default; "--help" anywhere prints usage and exits.
inline long arg_long(int argc, char** argv, const char* name, long def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  return def;
}
inline std::string arg_str(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
inline bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// Fills n 16-bit or 32-bit elements with hash-based values in [-2, 2): never zeros, cheap, deterministic.
__global__ void fill_kernel(void* p, size_t n, int elem_size, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed * 97u;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    const float v = (static_cast<float>(x & 0xffffu) / 65536.0f) * 4.0f - 2.0f + 1e-3f;
    if (elem_size == 4) static_cast<float*>(p)[i] = v;
    else if (elem_size == 2) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}
inline void fill(void* p, size_t n, int elem_size, unsigned seed) {
  fill_kernel<<<1024, 256>>>(p, n, elem_size, seed);
  E3_CHECK(cudaGetLastError());
}

// Median over `samples` of the mean time of `iters` calls of f(i), timed with CUDA events; microseconds.
inline double time_us(const std::function<void(int)>& f, int iters, int samples) {
  cudaEvent_t a, b;
  E3_CHECK(cudaEventCreate(&a));
  E3_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) f(i);  // warm-up
  std::vector<float> ms;
  for (int s = 0; s < samples; ++s) {
    E3_CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f(i);
    E3_CHECK(cudaEventRecord(b));
    E3_CHECK(cudaEventSynchronize(b));
    float t = 0;
    E3_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  E3_CHECK(cudaEventDestroy(a));
  E3_CHECK(cudaEventDestroy(b));
  return 1000.0 * ms[ms.size() / 2] / iters;
}

}  // namespace bench
