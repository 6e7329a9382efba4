// CUDA implementations of the capture ops: the same checks as the CPU path, then one kernel launch on the
// current stream (no allocation, no host sync: safe inside CUDA-graph capture).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "capture_ops.h"
#include "checks.h"
#include "tuning_check.h"

namespace e3ops {
namespace {

void capture_cuda(at::Tensor& packed, int64_t slot, const at::Tensor& hidden,
                  const std::optional<at::Tensor>& residual) {
  E3_CHECK(hidden.is_cuda(), "eagle3_capture.capture_: expected hidden on a CUDA device, got ",
              hidden.device());
  e3::DType dtype;
  const e3::CaptureParams p = capture_params(packed, slot, hidden, residual, &dtype);
  if (p.rows == 0) return;
  const c10::cuda::CUDAGuard guard(hidden.device());
  C10_CUDA_CHECK(static_cast<cudaError_t>(
      e3::capture_cuda(p, dtype, c10::cuda::getCurrentCUDAStream().stream())));
}

void fused_add_rmsnorm_capture_cuda(at::Tensor& hidden, at::Tensor& residual, const at::Tensor& weight,
                                    double eps, at::Tensor& packed, int64_t slot) {
  E3_CHECK(hidden.is_cuda(), "eagle3_capture.fused_add_rmsnorm_capture_: expected hidden on a CUDA device, ",
              "got ", hidden.device());
  e3::DType dtype;
  const e3::FusedAddRmsnormCaptureParams p =
      fused_add_rmsnorm_capture_params(hidden, residual, weight, eps, packed, slot, &dtype);
  if (p.rows == 0) return;
  const c10::cuda::CUDAGuard guard(hidden.device());
  checked_device_tuning(hidden.get_device());  // the block size comes from it; a malformed override raises here
  const int64_t max_cols = e3::fused_add_rmsnorm_capture_cuda_max_cols();
  E3_CHECK(p.cols <= max_cols, "eagle3_capture.fused_add_rmsnorm_capture_: H=", p.cols,
              " exceeds the CUDA kernel's limit of ", max_cols,
              " on this device (the fp32 row is cached in shared memory)");
  C10_CUDA_CHECK(static_cast<cudaError_t>(
      e3::fused_add_rmsnorm_capture_cuda(p, dtype, c10::cuda::getCurrentCUDAStream().stream())));
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CUDA, m) {
  m.impl("capture_", &capture_cuda);
  m.impl("fused_add_rmsnorm_capture_", &fused_add_rmsnorm_capture_cuda);
}

}  // namespace e3ops
