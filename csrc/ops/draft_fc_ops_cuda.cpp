// CUDA implementation of draft_fc: the decode weight-streaming kernel for M <= 64 bf16/fp16 rows, otherwise the
// normalise kernel into scratch plus torch's GEMM (cuBLAS). float32 always takes the second path.
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "checks.h"
#include "draft_fc_ops.h"

namespace e3ops {
namespace {

// One self-cleaning decode workspace per device (zeroed once here, re-zeroed by the kernel after every call).
// Buffers that grow are retired, never freed, so CUDA graphs that captured an older pointer stay valid.
// Concurrent decode calls on two streams of one device would share it: the draft runs on one stream in SGLang.
struct Workspaces {
  std::mutex mu;
  std::vector<at::Tensor> current;  // by device index
  std::vector<at::Tensor> retired;
};
Workspaces& workspaces() {
  static Workspaces w;
  return w;
}

void* decode_workspace(const at::Device& device, int64_t bytes, cudaStream_t stream) {
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  const size_t idx = static_cast<size_t>(device.index());
  if (w.current.size() <= idx) w.current.resize(idx + 1);
  at::Tensor& cur = w.current[idx];
  if (cur.defined() && cur.numel() >= bytes) return cur.data_ptr();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  TORCH_CHECK(status == cudaStreamCaptureStatusNone, "eagle3_capture.draft_fc: the decode workspace (", bytes,
              " bytes for this K and N) must exist before CUDA-graph capture; call draft_fc once eagerly with the "
              "same (or larger) K and N on this device first (the usual warm-up before capture)");
  if (cur.defined()) w.retired.push_back(cur);
  cur = at::zeros({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  return cur.data_ptr();
}

void check_vector_aligned(const void* ptr, int64_t row_stride, const char* what) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "eagle3_capture.draft_fc: the CUDA kernels read ", what,
              " as 16-byte vectors, so it must start 16-byte aligned; got address ", ptr);
  TORCH_CHECK(row_stride % 8 == 0, "eagle3_capture.draft_fc: the CUDA kernels read ", what,
              " rows as 16-byte vectors, so its row stride must be a multiple of 8 elements; got ", row_stride);
}

void draft_fc_out_cuda(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& norm_weight, double eps,
                       const std::optional<at::Tensor>& bias, at::Tensor& out) {
  TORCH_CHECK(!x.empty() && x[0].is_cuda(), "eagle3_capture.draft_fc: expected x on a CUDA device");
  e3::DType dtype;
  const e3::DraftFcParams p = draft_fc_params(x, weight, norm_weight, eps, bias, out, &dtype);
  if (p.rows == 0) return;
  const c10::cuda::CUDAGuard guard(x[0].device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  for (int k = 0; k < p.taps; ++k) {
    const std::string what = "tap " + std::to_string(k);
    check_vector_aligned(p.tap(k), p.tap_row_stride(k), what.c_str());
  }
  if (p.norm_weight != nullptr) check_vector_aligned(p.norm_weight, 8, "norm_weight");
  const bool decode = p.rows <= e3::kDraftFcDecodeMaxRows && dtype != e3::DType::F32;
  if (decode) {
    check_vector_aligned(p.weight, p.weight_row_stride, "weight");
    void* ws = decode_workspace(x[0].device(), e3::draft_fc_decode_workspace_bytes(p.taps, p.out_features), stream);
    C10_CUDA_CHECK(static_cast<cudaError_t>(e3::draft_fc_decode_cuda(
        p, dtype, e3::draft_fc_decode_workspace_view(ws, p.taps, p.out_features), stream)));
    return;
  }
  draft_fc_prefill(x, weight, norm_weight, bias, out, p, [&](at::Tensor& xn) {
    C10_CUDA_CHECK(static_cast<cudaError_t>(e3::draft_fc_normalize_cuda(p, dtype, xn.data_ptr(), stream)));
  });
}

at::Tensor draft_fc_cuda(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& norm_weight, double eps,
                         const std::optional<at::Tensor>& bias) {
  at::Tensor out = draft_fc_empty_out(x, weight);
  draft_fc_out_cuda(x, weight, norm_weight, eps, bias, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CUDA, m) {
  m.impl("draft_fc", &draft_fc_cuda);
  m.impl("draft_fc_out", &draft_fc_out_cuda);
}

}  // namespace e3ops
