// capture_ and fused_add_rmsnorm_capture_: argument checks and the CPU implementations.
#include "capture_ops.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "checks.h"

namespace e3ops {

namespace {

// Checks packed against a [T, H] tap and returns a pointer to column slot*H of row 0.
void* packed_slot_ptr(const at::Tensor& packed, int64_t slot, int64_t rows, int64_t cols, const char* op,
                      const at::Tensor& tap, const char* tap_arg) {
  check_dim(packed, 2, op, "packed", "[T, K*H]");
  check_same_dtype_and_device(packed, tap, op, "packed", tap_arg);
  E3_CHECK(packed.size(0) == rows, "eagle3_capture.", op, ": expected packed to have T=", rows,
              " rows like ", tap_arg, ", got shape ", shape_str(packed));
  const int64_t width = packed.size(1);
  E3_CHECK(width >= cols && width % cols == 0, "eagle3_capture.", op,
              ": expected packed width to be K*H for H=", cols, " (a positive multiple of ", cols, "), got ",
              width, " (shape ", shape_str(packed), ")");
  const int64_t k = width / cols;
  E3_CHECK(slot >= 0 && slot < k, "eagle3_capture.", op, ": slot ", slot, " is out of range for a packed ",
              "buffer of K=", k, " taps of H=", cols, " (valid slots 0..", k - 1, ")");
  check_rows(packed, op, "packed");
  check_element_aligned(packed, op, "packed");
  check_no_overlap(packed.narrow(1, slot * cols, cols), tap, op, "packed slot", tap_arg);
  return static_cast<char*>(packed.data_ptr()) + slot * cols * packed.element_size();
}

void check_tap(const at::Tensor& t, const char* op, const char* arg) {
  check_dim(t, 2, op, arg, "[T, H]");
  check_rows(t, op, arg);
  check_element_aligned(t, op, arg);
}

}  // namespace

e3::CaptureParams capture_params(const at::Tensor& packed, int64_t slot, const at::Tensor& hidden,
                                 const std::optional<at::Tensor>& residual, e3::DType* dtype) {
  const char* op = "capture_";
  check_tap(hidden, op, "hidden");
  *dtype = to_e3_dtype(hidden, op, "hidden");
  const int64_t rows = hidden.size(0), cols = hidden.size(1);
  E3_CHECK(cols >= 1, "eagle3_capture.capture_: expected hidden size H >= 1, got shape ", shape_str(hidden));
  e3::CaptureParams p{};
  p.packed = packed_slot_ptr(packed, slot, rows, cols, op, hidden, "hidden");
  p.packed_row_stride = packed.stride(0);
  p.hidden = hidden.data_ptr();
  p.hidden_row_stride = hidden.stride(0);
  p.rows = rows;
  p.cols = cols;
  if (residual.has_value()) {
    const at::Tensor& r = *residual;
    check_tap(r, op, "residual");
    check_same_dtype_and_device(r, hidden, op, "residual", "hidden");
    E3_CHECK(r.sizes() == hidden.sizes(), "eagle3_capture.capture_: expected residual to have the shape of ",
                "hidden ", shape_str(hidden), ", got ", shape_str(r));
    check_no_overlap(packed.narrow(1, slot * cols, cols), r, op, "packed slot", "residual");
    p.residual = r.data_ptr();
    p.residual_row_stride = r.stride(0);
  }
  return p;
}

e3::FusedAddRmsnormCaptureParams fused_add_rmsnorm_capture_params(const at::Tensor& hidden,
                                                                  const at::Tensor& residual,
                                                                  const at::Tensor& weight, double eps,
                                                                  const at::Tensor& packed, int64_t slot,
                                                                  e3::DType* dtype) {
  const char* op = "fused_add_rmsnorm_capture_";
  check_tap(hidden, op, "hidden");
  *dtype = to_e3_dtype(hidden, op, "hidden");
  const int64_t rows = hidden.size(0), cols = hidden.size(1);
  E3_CHECK(cols >= 1, "eagle3_capture.", op, ": expected hidden size H >= 1, got shape ", shape_str(hidden));
  check_tap(residual, op, "residual");
  check_same_dtype_and_device(residual, hidden, op, "residual", "hidden");
  E3_CHECK(residual.sizes() == hidden.sizes(), "eagle3_capture.", op,
              ": expected residual to have the shape of hidden ", shape_str(hidden), ", got ",
              shape_str(residual));
  check_dim(weight, 1, op, "weight", "[H]");
  check_same_dtype_and_device(weight, hidden, op, "weight", "hidden");
  E3_CHECK(weight.size(0) == cols, "eagle3_capture.", op, ": expected weight of shape [", cols,
              "] (H of hidden), got ", shape_str(weight));
  check_contiguous(weight, op, "weight");
  check_element_aligned(weight, op, "weight");
  E3_CHECK(std::isfinite(eps) && eps >= 0.0, "eagle3_capture.", op, ": expected eps finite and >= 0, got ",
              eps);
  check_no_overlap(hidden, residual, op, "hidden", "residual");
  check_no_overlap(hidden, weight, op, "hidden", "weight");
  check_no_overlap(residual, weight, op, "residual", "weight");
  e3::FusedAddRmsnormCaptureParams p{};
  p.packed = packed_slot_ptr(packed, slot, rows, cols, op, hidden, "hidden");
  check_no_overlap(packed.narrow(1, slot * cols, cols), residual, op, "packed slot", "residual");
  check_no_overlap(packed.narrow(1, slot * cols, cols), weight, op, "packed slot", "weight");
  p.packed_row_stride = packed.stride(0);
  p.hidden = hidden.data_ptr();
  p.hidden_row_stride = hidden.stride(0);
  p.residual = residual.data_ptr();
  p.residual_row_stride = residual.stride(0);
  p.weight = weight.data_ptr();
  p.eps = static_cast<float>(eps);
  p.rows = rows;
  p.cols = cols;
  return p;
}

namespace {

// Rows per parallel task: enough work per task that thread start-up does not dominate.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1)); }

void capture_cpu(at::Tensor& packed, int64_t slot, const at::Tensor& hidden,
                 const std::optional<at::Tensor>& residual) {
  e3::DType dtype;
  const e3::CaptureParams p = capture_params(packed, slot, hidden, residual, &dtype);
  if (p.rows == 0) return;
  e3::dispatch_host_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    at::parallel_for(0, p.rows, row_grain(p.cols),
                     [&](int64_t b, int64_t e) { e3::capture_rows_cpu<T>(p, b, e); });
  });
}

void fused_add_rmsnorm_capture_cpu(at::Tensor& hidden, at::Tensor& residual, const at::Tensor& weight,
                                   double eps, at::Tensor& packed, int64_t slot) {
  e3::DType dtype;
  const e3::FusedAddRmsnormCaptureParams p =
      fused_add_rmsnorm_capture_params(hidden, residual, weight, eps, packed, slot, &dtype);
  if (p.rows == 0) return;
  e3::dispatch_host_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    at::parallel_for(0, p.rows, row_grain(p.cols), [&](int64_t b, int64_t e) {
      std::vector<float> x(static_cast<size_t>(p.cols));
      e3::fused_add_rmsnorm_capture_rows_cpu<T>(p, x.data(), b, e);
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CPU, m) {
  m.impl("capture_", &capture_cpu);
  m.impl("fused_add_rmsnorm_capture_", &fused_add_rmsnorm_capture_cpu);
}

}  // namespace e3ops
