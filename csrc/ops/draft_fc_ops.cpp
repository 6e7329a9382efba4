// draft_fc / draft_fc_out: argument checks, the CPU implementation, and the prefill composition.
#include "draft_fc_ops.h"

#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>

#include "checks.h"

namespace e3ops {

namespace {
std::atomic<int64_t> g_decode_max_rows{kDecodeRowsFromDevice};
std::atomic<int> g_decode_kernel{static_cast<int>(e3::DraftFcDecodeConfig{}.kernel)};
std::atomic<int> g_cluster_fault{0};
}  // namespace

int64_t draft_fc_decode_max_rows_setting() { return g_decode_max_rows.load(std::memory_order_relaxed); }

int64_t set_draft_fc_decode_max_rows(int64_t rows) {
  rows = rows < 0 ? kDecodeRowsFromDevice : (rows > e3::kDraftFcDecodeMaxRows ? e3::kDraftFcDecodeMaxRows : rows);
  return g_decode_max_rows.exchange(rows);
}

int draft_fc_cluster_fault() { return g_cluster_fault.load(std::memory_order_relaxed); }
int64_t set_draft_fc_cluster_fault(int64_t err) {
  E3_CHECK(err >= 0 && err < 100000, "eagle3_capture: the cluster fault knob takes a cudaError_t value >= 0 (0: ",
           "none), got ", err);
  return g_cluster_fault.exchange(static_cast<int>(err));
}

e3::DraftFcDecodeKernel draft_fc_decode_kernel_setting() {
  return static_cast<e3::DraftFcDecodeKernel>(g_decode_kernel.load(std::memory_order_relaxed));
}
int64_t set_draft_fc_decode_kernel(int64_t kernel) {
  E3_CHECK(kernel >= 0 && kernel <= static_cast<int64_t>(e3::DraftFcDecodeKernel::Split),
           "eagle3_capture: decode kernel must be 0 (auto), 1 (cluster) or 2 (split), got ", kernel);
  return g_decode_kernel.exchange(static_cast<int>(kernel));
}

namespace {
const char* kOp = "draft_fc";

// Every tensor of the call: `dim` dims laid out as `layout`, and the dtype and device of `ref` (named `ref_what`).
void check_tensor(const at::Tensor& t, int64_t dim, const char* layout, const at::Tensor& ref, const char* what,
                  const char* ref_what) {
  check_dim(t, dim, kOp, what, layout);
  check_same_dtype_and_device(t, ref, kOp, what, ref_what);
}

void check_x_tensor(const at::Tensor& t, const at::Tensor& ref, const char* what) {
  check_tensor(t, 2, "[M, H] (or one packed [M, K*H])", ref, what, "x[0]");
  check_rows(t, kOp, what);
  check_element_aligned(t, kOp, what);
}

void check_taps_given(const std::vector<at::Tensor>& x) {
  E3_CHECK(!x.empty(), "eagle3_capture.draft_fc: expected x to be a packed [M, K*H] tensor or a list of K [M, H] "
              "tensors, got an empty list");
}
}  // namespace

at::Tensor draft_fc_empty_out(const std::vector<at::Tensor>& x, const at::Tensor& weight) {
  check_taps_given(x);
  E3_CHECK(x[0].dim() == 2 && weight.dim() == 2, "eagle3_capture.draft_fc: expected 2-D x and weight, got x ",
              shape_str(x[0]), " and weight ", shape_str(weight));
  return at::empty({x[0].size(0), weight.size(0)}, x[0].options());
}

e3::DraftFcParams draft_fc_params(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& norm_weight, double eps,
                                  const std::optional<at::Tensor>& bias, const at::Tensor& out, e3::DType* dtype) {
  check_taps_given(x);
  const at::Tensor& x0 = x[0];
  check_x_tensor(x0, x0, "x[0]");
  *dtype = to_e3_dtype(x0, kOp, "x");
  e3::DraftFcParams p{};
  p.elem_size = static_cast<int>(x0.element_size());
  p.rows = x0.size(0);
  if (x.size() == 1) {
    const int64_t k = norm_weight.has_value() ? norm_weight->size(0) : 1;
    E3_CHECK(k >= 1 && x0.size(1) % k == 0, "eagle3_capture.draft_fc: packed x of width ", x0.size(1),
                " cannot hold the K=", k, " taps that norm_weight ", shape_str(*norm_weight), " declares");
    p.taps = static_cast<int>(k);
    p.hidden = x0.size(1) / k;
    p.x_base = x0.data_ptr();
    p.x_tap_stride = p.hidden;
    p.x_row_stride[0] = x0.stride(0);
  } else {
    E3_CHECK(static_cast<int64_t>(x.size()) <= e3::DraftFcParams::kMaxListTaps, "eagle3_capture.draft_fc: at most ",
                e3::DraftFcParams::kMaxListTaps, " taps as a list, got ", x.size(),
                "; pass them packed as one [M, K*H] tensor instead");
    p.taps = static_cast<int>(x.size());
    p.hidden = x0.size(1);
    for (size_t k = 0; k < x.size(); ++k) {
      const std::string what = "x[" + std::to_string(k) + "]";
      check_x_tensor(x[k], x0, what.c_str());
      E3_CHECK(x[k].sizes() == x0.sizes(), "eagle3_capture.draft_fc: expected every tap to have the shape of x[0] ",
                  shape_str(x0), ", got ", what, " ", shape_str(x[k]));
      p.x[k] = x[k].data_ptr();
      p.x_row_stride[k] = x[k].stride(0);
    }
  }
  E3_CHECK(p.hidden >= 8 && p.hidden % 8 == 0, "eagle3_capture.draft_fc: H must be a positive multiple of 8 ",
              "(rows are moved as 16-byte vectors of 8 bf16/fp16 elements), got H=", p.hidden);
  const int64_t in_features = p.taps * p.hidden;

  check_tensor(weight, 2, "[N, K*H]", x0, "weight", "x");
  E3_CHECK(weight.size(1) == in_features, "eagle3_capture.draft_fc: expected weight in_features K*H = ",
              p.taps, "*", p.hidden, " = ", in_features, ", got weight ", shape_str(weight));
  check_contiguous(weight, kOp, "weight");
  check_element_aligned(weight, kOp, "weight");
  p.weight = weight.data_ptr();
  p.weight_row_stride = weight.size(1);
  p.out_features = weight.size(0);

  if (norm_weight.has_value()) {
    const at::Tensor& g = *norm_weight;
    check_tensor(g, 2, "[K, H]", x0, "norm_weight", "x");
    E3_CHECK(g.size(0) == p.taps && g.size(1) == p.hidden, "eagle3_capture.draft_fc: expected norm_weight [K, H] = [",
                p.taps, ", ", p.hidden, "], got ", shape_str(g));
    check_contiguous(g, kOp, "norm_weight");
    p.norm_weight = g.data_ptr();
  }
  E3_CHECK(std::isfinite(eps) && eps >= 0.0, "eagle3_capture.draft_fc: expected eps finite and >= 0, got ", eps);
  p.eps = static_cast<float>(eps);
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    check_tensor(b, 1, "[N]", x0, "bias", "x");
    E3_CHECK(b.size(0) == p.out_features, "eagle3_capture.draft_fc: expected bias [N] = [", p.out_features,
                "], got ", shape_str(b));
    check_contiguous(b, kOp, "bias");
    p.bias = b.data_ptr();
  }
  check_tensor(out, 2, "[M, N]", x0, "out", "x");
  E3_CHECK(out.size(0) == p.rows && out.size(1) == p.out_features, "eagle3_capture.draft_fc: expected out [M, N] = [",
              p.rows, ", ", p.out_features, "], got ", shape_str(out));
  check_contiguous(out, kOp, "out");
  for (size_t k = 0; k < x.size(); ++k) check_no_overlap(out, x[k], kOp, "out", "x");
  check_no_overlap(out, weight, kOp, "out", "weight");
  p.out = out.data_ptr();
  p.out_row_stride = out.stride(0);
  return p;
}

namespace {

void draft_fc_out_cpu(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& norm_weight, double eps, const std::optional<at::Tensor>& bias,
                      at::Tensor& out) {
  e3::DType dtype;
  const e3::DraftFcParams p = draft_fc_params(x, weight, norm_weight, eps, bias, out, &dtype);
  if (p.rows == 0) return;
  draft_fc_prefill(x, weight, norm_weight, bias, out, p, [&](at::Tensor& xn) {
    e3::dispatch_host_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      T* dst = static_cast<T*>(xn.data_ptr());
      at::parallel_for(0, p.rows, std::max<int64_t>(1, 8192 / (p.taps * p.hidden)),
                       [&](int64_t b, int64_t e) { e3::draft_fc_normalize_rows_cpu<T>(p, dst, b, e); });
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CPU, m) {
  m.impl("draft_fc", &draft_fc_functional<&draft_fc_out_cpu>);
  m.impl("draft_fc_out", &draft_fc_out_cpu);
}

}  // namespace e3ops
