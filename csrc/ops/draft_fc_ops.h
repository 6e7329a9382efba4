// Checked conversion of the draft fc ops' torch arguments into the kernel parameters, shared by CPU and CUDA, and
// the CPU/GPU-common prefill composition (normalise into scratch, then torch's GEMM).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>

#include <optional>
#include <vector>

#include "../kernels/draft_fc.h"

namespace e3ops {

// Rows at or below which CUDA bf16/fp16 calls take the decode kernel rather than normalise + cuBLAS: by default the
// device's Tuning::decode_max_rows (tuning.h; EAGLE3_CAPTURE_DECODE_MAX_ROWS overrides it), or a process-wide
// setting for the benchmarks and tests (eagle3_capture.ops._set_draft_fc_decode_max_rows); results differ only by
// the rounding of the two paths. The setting is clamped to 0..e3::kDraftFcDecodeMaxRows; a negative value (the
// initial one, kDecodeRowsFromDevice) means the device's tuning.
constexpr int64_t kDecodeRowsFromDevice = -1;
int64_t draft_fc_decode_max_rows_setting();
int64_t set_draft_fc_decode_max_rows(int64_t rows);  // returns the previous setting
// Test knob: the cudaError_t value the cluster decode launch pretends to return (e3::DraftFcDecodeConfig::
// cluster_fault; 0: none). Returns the previous value.
int draft_fc_cluster_fault();
int64_t set_draft_fc_cluster_fault(int64_t err);
// Which decode kernel CUDA calls prefer (e3::DraftFcDecodeKernel as an int: 0 auto, the default; 1 cluster; 2
// split); each applies where it can, else auto's choice. Tuning and test knob; the setter checks the value
// and returns the previous one.
e3::DraftFcDecodeKernel draft_fc_decode_kernel_setting();
int64_t set_draft_fc_decode_kernel(int64_t kernel);

// x: one packed [M, K*H] tensor (K from norm_weight, 1 without a norm) or K [M, H] tensors.
e3::DraftFcParams draft_fc_params(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& norm_weight, double eps,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& out, e3::DType* dtype);

// The output tensor the functional op allocates: [M, N] in the activation dtype on x's device.
at::Tensor draft_fc_empty_out(const std::vector<at::Tensor>& x, const at::Tensor& weight);

using DraftFcOutFn = void (*)(const std::vector<at::Tensor>&, const at::Tensor&, const std::optional<at::Tensor>&,
                              double, const std::optional<at::Tensor>&, at::Tensor&);

// The functional draft_fc of a device: allocate the output, then that device's draft_fc_out.
template <DraftFcOutFn kOut>
at::Tensor draft_fc_functional(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& norm_weight, double eps,
                               const std::optional<at::Tensor>& bias) {
  at::Tensor out = draft_fc_empty_out(x, weight);
  kOut(x, weight, norm_weight, eps, bias, out);
  return out;
}

// out = linear(xn, weight, bias): xn is the packed input itself when there is no norm and one tensor, otherwise a
// scratch [M, K*H] that `fill_scratch` fills with the normalised (or packed) taps.
template <typename Fill>
void draft_fc_prefill(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& bias,
                      at::Tensor& out, const e3::DraftFcParams& p, Fill&& fill_scratch) {
  if (x.size() == 1 && !norm_weight.has_value()) {
    at::linear_out(out, x[0], weight, bias);  // already the packed, un-normed input: the GEMM alone
    return;
  }
  at::Tensor xn = at::empty({p.rows, p.taps * p.hidden}, x[0].options());
  fill_scratch(xn);
  at::linear_out(out, xn, weight, bias);
}

}  // namespace e3ops
