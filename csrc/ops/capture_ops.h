// Checked conversion from the capture ops' torch arguments to the kernels' parameter structs. Shared by the CPU
// and CUDA implementations so both accept and refuse exactly the same inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "../kernels/capture.h"

namespace e3ops {

e3::CaptureParams capture_params(const at::Tensor& packed, int64_t slot, const at::Tensor& hidden,
                                 const std::optional<at::Tensor>& residual, e3::DType* dtype);

e3::FusedAddRmsnormCaptureParams fused_add_rmsnorm_capture_params(const at::Tensor& hidden,
                                                                  const at::Tensor& residual,
                                                                  const at::Tensor& weight, double eps,
                                                                  const at::Tensor& packed, int64_t slot,
                                                                  e3::DType* dtype);

}  // namespace e3ops
