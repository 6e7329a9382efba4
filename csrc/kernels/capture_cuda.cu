// CUDA kernels for packed capture. Torch-free: built by setup.py into the extension and by CMake into the bench
// binaries. Both kernels are pure streaming: each input element is read once and each output written once.
#include "capture.h"
#include "cuda_common.cuh"
#include "device.h"

#include <mutex>
#include <type_traits>

namespace e3 {
namespace cuda {

// Kernels live in a named namespace (not an anonymous one) so their symbols read the same in every arch's cubin.
namespace kernels {

constexpr int kCaptureThreads = 128;
constexpr int kCaptureUnroll = 4;  // independent 16-byte loads in flight per thread and array
constexpr int kMaxGridY = 65535;

// grid.x tiles the row's chunks, grid.y walks rows (grid-stride when T > 65535).
template <typename T, int N, bool kHasResidual>
__global__ void __launch_bounds__(kCaptureThreads) capture_kernel(CaptureParams p) {
  const int64_t nchunks = p.cols / N;
  const int64_t tail_begin = nchunks * N;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    T* out = static_cast<T*>(p.packed) + row * p.packed_row_stride;
    const T* h = static_cast<const T*>(p.hidden) + row * p.hidden_row_stride;
    const T* r = kHasResidual ? static_cast<const T*>(p.residual) + row * p.residual_row_stride : nullptr;
    const int64_t base = static_cast<int64_t>(blockIdx.x) * kCaptureThreads * kCaptureUnroll + threadIdx.x;
    Chunk<T, N> hv[kCaptureUnroll], rv[kCaptureUnroll];
#pragma unroll
    for (int u = 0; u < kCaptureUnroll; ++u) {
      const int64_t c = base + u * kCaptureThreads;
      if (c < nchunks) {
        hv[u] = load_chunk<T, N>(h + c * N);
        if (kHasResidual) rv[u] = load_chunk<T, N>(r + c * N);
      }
    }
#pragma unroll
    for (int u = 0; u < kCaptureUnroll; ++u) {
      const int64_t c = base + u * kCaptureThreads;
      if (c < nchunks) {
        if (kHasResidual) {
#pragma unroll
          for (int i = 0; i < N; ++i) hv[u].v[i] = from_f<T>(to_f(hv[u].v[i]) + to_f(rv[u].v[i]));
        }
        store_chunk<T, N>(out + c * N, hv[u]);
      }
    }
    // Tail (cols % N elements), done by the first block of the row.
    if (blockIdx.x == 0) {
      for (int64_t j = tail_begin + threadIdx.x; j < p.cols; j += kCaptureThreads) {
        out[j] = kHasResidual ? from_f<T>(to_f(h[j]) + to_f(r[j])) : h[j];
      }
    }
  }
}

}  // namespace kernels

namespace {
using namespace kernels;

template <typename T, int N>
cudaError_t launch_capture(const CaptureParams& p, cudaStream_t stream) {
  const int64_t nchunks = p.cols / N;
  const int64_t per_block = static_cast<int64_t>(kCaptureThreads) * kCaptureUnroll;
  int64_t gx = (nchunks + per_block - 1) / per_block;
  if (gx == 0) gx = 1;  // the tail alone still needs a block
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(p.rows < kMaxGridY ? p.rows : kMaxGridY));
  if (p.residual != nullptr)
    capture_kernel<T, N, true><<<grid, kCaptureThreads, 0, stream>>>(p);
  else
    capture_kernel<T, N, false><<<grid, kCaptureThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// Calls f(TypeTag<T>{}, std::integral_constant<int, N>{}) for dtype's device type T and the widest access of N
// elements that every pointer and row stride allow (pick_access_bytes), and returns its cudaError_t value: the one
// place both capture kernels' launches are mapped to their template arguments.
template <typename F>
int with_type_and_width(DType dtype, const void* const* ptrs, int n_ptrs, const int64_t* strides, int n_strides,
                        F&& f) {
  return with_device_type(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    switch (pick_access_bytes(sizeof(T), ptrs, n_ptrs, strides, n_strides) / static_cast<int>(sizeof(T))) {
      case 8: return f(tag, std::integral_constant<int, 8>{});
      case 4: return f(tag, std::integral_constant<int, 4>{});
      case 2: return f(tag, std::integral_constant<int, 2>{});
      default: return f(tag, std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace

// ---- fused add + RMSNorm + capture: one block per row, the fp32 row cached in shared memory. ----
namespace kernels {

template <typename T, int N>
__global__ void __launch_bounds__(1024) fused_add_rmsnorm_capture_kernel(FusedAddRmsnormCaptureParams p) {
  extern __shared__ float smem[];  // [32] reduction scratch, then [cols] fp32 row
  float* scratch = smem;
  float* xrow = smem + 32;
  const int64_t nchunks = p.cols / N;
  const int64_t tail_begin = nchunks * N;
  const T* w = static_cast<const T*>(p.weight);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    T* h = static_cast<T*>(p.hidden) + row * p.hidden_row_stride;
    T* r = static_cast<T*>(p.residual) + row * p.residual_row_stride;
    T* out = static_cast<T*>(p.packed) + row * p.packed_row_stride;
    float sum_sq = 0.f;
    for (int64_t c = threadIdx.x; c < nchunks; c += blockDim.x) {
      Chunk<T, N> hv = load_chunk<T, N>(h + c * N);
      Chunk<T, N> rv = load_chunk<T, N>(r + c * N);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float x = to_f(hv.v[i]) + to_f(rv.v[i]);
        sum_sq += x * x;
        xrow[c * N + i] = x;
        rv.v[i] = from_f<T>(x);
      }
      store_chunk<T, N>(r + c * N, rv);
      store_chunk<T, N>(out + c * N, rv);
    }
    for (int64_t j = tail_begin + threadIdx.x; j < p.cols; j += blockDim.x) {
      const float x = to_f(h[j]) + to_f(r[j]);
      sum_sq += x * x;
      xrow[j] = x;
      const T xr = from_f<T>(x);
      r[j] = xr;
      out[j] = xr;
    }
    const float rrms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(p.cols) + p.eps);
    for (int64_t c = threadIdx.x; c < nchunks; c += blockDim.x) {
      const Chunk<T, N> wv = load_chunk<T, N>(w + c * N);
      Chunk<T, N> ov;
#pragma unroll
      for (int i = 0; i < N; ++i) ov.v[i] = from_f<T>(xrow[c * N + i] * rrms * to_f(wv.v[i]));
      store_chunk<T, N>(h + c * N, ov);
    }
    for (int64_t j = tail_begin + threadIdx.x; j < p.cols; j += blockDim.x) {
      h[j] = from_f<T>(xrow[j] * rrms * to_f(w[j]));
    }
    __syncthreads();  // xrow is rewritten by the next row of this block
  }
}

}  // namespace kernels

namespace {
using namespace kernels;

int max_dynamic_smem_bytes() {
  return current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
}

// The device facts the block size depends on, queried once per device (a launch must not pay 9 attribute queries).
DeviceFacts fused_facts(int dev) {
  constexpr int kDevices = 64;
  static std::once_flag once[kDevices];
  static DeviceFacts facts[kDevices];
  if (dev < 0 || dev >= kDevices) return DeviceFacts{};
  std::call_once(once[dev], [dev] { facts[dev] = query_device_facts(dev); });
  return facts[dev];
}

template <typename T, int N>
cudaError_t launch_fused(const FusedAddRmsnormCaptureParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(fused_add_rmsnorm_capture_smem_bytes(p.cols));
  auto kernel = fused_add_rmsnorm_capture_kernel<T, N>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  // One chunk per thread where the row allows (latency-bound decode rows), rounded to whole warps; with more rows
  // than SMs, as few chunks per thread as keep 3/4 of the SM's threads resident (tuning.h, fused_norm_threads).
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return cudaGetLastError();
  const Tuning& tuning = device_tuning(dev);
  const int64_t work = p.cols / N + (p.cols % N);
  const DeviceFacts facts = fused_facts(dev);
  const int64_t threads = fused_norm_threads(facts, work, p.rows, static_cast<int64_t>(smem), tuning.fused_norm_threads);
  // Enough blocks to fill the machine many times over; more rows than that are walked grid-stride.
  const int64_t max_blocks = static_cast<int64_t>(facts.sms) * 64;
  const int64_t blocks = p.rows < max_blocks ? p.rows : max_blocks;
  kernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

int capture_cuda(const CaptureParams& p, DType dtype, void* stream) {
  if (p.rows == 0 || p.cols == 0) return 0;
  const void* ptrs[3] = {p.packed, p.hidden, p.residual};
  const int64_t strides[3] = {p.packed_row_stride, p.hidden_row_stride,
                              p.residual != nullptr ? p.residual_row_stride : 0};
  return cuda::with_type_and_width(dtype, ptrs, 3, strides, 3, [&](auto tag, auto width) {
    return cuda::launch_capture<typename decltype(tag)::type, decltype(width)::value>(
        p, static_cast<cudaStream_t>(stream));
  });
}

int fused_add_rmsnorm_capture_cuda(const FusedAddRmsnormCaptureParams& p, DType dtype, void* stream) {
  if (p.rows == 0 || p.cols == 0) return 0;
  const void* ptrs[4] = {p.hidden, p.residual, p.packed, p.weight};
  const int64_t strides[3] = {p.hidden_row_stride, p.residual_row_stride, p.packed_row_stride};
  return cuda::with_type_and_width(dtype, ptrs, 4, strides, 3, [&](auto tag, auto width) {
    return cuda::launch_fused<typename decltype(tag)::type, decltype(width)::value>(
        p, static_cast<cudaStream_t>(stream));
  });
}

int64_t fused_add_rmsnorm_capture_cuda_max_cols() {
  return fused_add_rmsnorm_capture_max_cols_for(cuda::max_dynamic_smem_bytes());
}

}  // namespace e3
