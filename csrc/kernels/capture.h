// Packed capture: writing a tap (hidden, or hidden + residual) into its column slot of the packed [T, K*H] buffer
// that an EAGLE-3 draft's fc reads, and the fused residual-stream step (add + RMSNorm) that captures on the way.
//
// Torch-free. Pointers passed here already point at the first element each kernel touches: `packed` points at
// column slot*H of row 0. Strides are in elements; the innermost stride is 1 for every array (the ops check it).
#pragma once

#include <cmath>
#include <cstdint>

#include "dtype.h"

namespace e3 {

struct CaptureParams {
  void* packed;              // column `slot*H` of row 0 of the packed buffer
  int64_t packed_row_stride;
  const void* hidden;
  int64_t hidden_row_stride;
  const void* residual;      // nullptr: capture hidden alone (the embedding tap, where no residual exists yet)
  int64_t residual_row_stride;
  int64_t rows;              // T
  int64_t cols;              // H
};

struct FusedAddRmsnormCaptureParams {
  void* hidden;              // in: the layer's output; out: rmsnorm(residual + hidden) * weight
  int64_t hidden_row_stride;
  void* residual;            // in: residual stream; out: residual + hidden (rounded to the storage type)
  int64_t residual_row_stride;
  const void* weight;        // [H], contiguous
  float eps;
  void* packed;              // column `slot*H` of row 0 of the packed buffer; receives the new residual
  int64_t packed_row_stride;
  int64_t rows;
  int64_t cols;
};

// ---- CPU implementations, over rows [row_begin, row_end) so the caller can split rows across threads. ----

template <typename T>
void capture_rows_cpu(const CaptureParams& p, int64_t row_begin, int64_t row_end) {
  for (int64_t t = row_begin; t < row_end; ++t) {
    T* out = static_cast<T*>(p.packed) + t * p.packed_row_stride;
    const T* h = static_cast<const T*>(p.hidden) + t * p.hidden_row_stride;
    if (p.residual == nullptr) {
      for (int64_t j = 0; j < p.cols; ++j) out[j] = h[j];
    } else {
      const T* r = static_cast<const T*>(p.residual) + t * p.residual_row_stride;
      // Add in float, round once: bit-identical to torch's `hidden + residual` in the storage dtype.
      for (int64_t j = 0; j < p.cols; ++j) out[j] = from_float<T>(to_float(h[j]) + to_float(r[j]));
    }
  }
}

// Matches SGLang's fused_add_rmsnorm (FlashInfer's FusedAddRMSNorm kernel): x = float(h) + float(r) in fp32;
// the residual and the capture slot get x rounded to the storage type; the sum of squares and the normalised
// output use the unrounded fp32 x; out = x * rsqrt(mean(x^2) + eps) * float(w), rounded once.
template <typename T>
void fused_add_rmsnorm_capture_rows_cpu(const FusedAddRmsnormCaptureParams& p, float* x_scratch,
                                        int64_t row_begin, int64_t row_end) {
  const T* w = static_cast<const T*>(p.weight);
  for (int64_t t = row_begin; t < row_end; ++t) {
    T* h = static_cast<T*>(p.hidden) + t * p.hidden_row_stride;
    T* r = static_cast<T*>(p.residual) + t * p.residual_row_stride;
    T* out = static_cast<T*>(p.packed) + t * p.packed_row_stride;
    float sum_sq = 0.f;
    for (int64_t j = 0; j < p.cols; ++j) {
      const float x = to_float(h[j]) + to_float(r[j]);
      const T xr = from_float<T>(x);
      r[j] = xr;
      out[j] = xr;
      x_scratch[j] = x;
      sum_sq += x * x;
    }
    const float rrms = 1.0f / std::sqrt(sum_sq / static_cast<float>(p.cols) + p.eps);
    for (int64_t j = 0; j < p.cols; ++j) h[j] = from_float<T>(x_scratch[j] * rrms * to_float(w[j]));
  }
}

// ---- CUDA launchers (capture_cuda.cu). Return a cudaError_t value; 0 is success. `stream` is a cudaStream_t.
// They never allocate and never synchronise, so they are safe inside CUDA-graph capture.
int capture_cuda(const CaptureParams& p, DType dtype, void* stream);
int fused_add_rmsnorm_capture_cuda(const FusedAddRmsnormCaptureParams& p, DType dtype, void* stream);

// Largest H the CUDA fused kernel accepts on the current device (its fp32 row cache lives in shared memory).
int64_t fused_add_rmsnorm_capture_cuda_max_cols();

// Dynamic shared memory the fused kernel's launch requests for rows of `cols` elements: a 32-float reduction
// scratch, then the fp32 row. The CI resource gate checks it (with the kernel's static shared memory) against
// sm_120's 99 KB per block at H = 7168 and at the largest H accepted there.
E3_HOST_DEVICE int64_t fused_add_rmsnorm_capture_smem_bytes(int64_t cols) {
  return (32 + cols) * static_cast<int64_t>(sizeof(float));
}
// The largest H whose request fits `optin_smem_bytes` (a device's opt-in shared memory per block): the launcher's
// limit, fused_add_rmsnorm_capture_cuda_max_cols, for the current device.
E3_HOST_DEVICE int64_t fused_add_rmsnorm_capture_max_cols_for(int64_t optin_smem_bytes) {
  return optin_smem_bytes / static_cast<int64_t>(sizeof(float)) - 32;
}

}  // namespace e3
