// CUDA implementation of draft_fc: the decode weight-streaming kernels for M <= 8 bf16/fp16 rows (up to 16 by the
// threshold knob), otherwise the normalise kernel into scratch plus torch's GEMM (cuBLAS). float32 always takes the
// second path.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "checks.h"
#include "draft_fc_ops.h"
#include "tuning_check.h"

namespace e3ops {
namespace {

// Decode workspaces, one per device: a buffer that is zero at rest (zero-filled once at allocation; the kernel
// re-zeroes what it used after every call). Buffers that grow are retired, never freed, so CUDA graphs that captured
// an older pointer stay valid. Concurrent decode calls on two streams of one device would share them: the draft runs
// on one stream in SGLang.
//
// Every buffer is allocated and zero-filled eagerly, outside every CUDA graph, even when it is first needed during
// a capture: every graph that uses it (captured in any order, replayed in any order, sharing one memory pool or
// not) then starts from zero. A buffer allocated on the capturing stream would come from the graph's private pool
// with its zero fill only recorded into that graph: a graph captured later that reuses it, replayed first, would
// start from garbage counters and never write its output, and an earlier graph of the same pool whose freed
// scratch the buffer took over would overwrite it at every replay.
struct Workspaces {
  std::mutex mu;
  std::vector<at::Tensor> by_device;  // zero at rest
  std::vector<cudaStream_t> side;     // per device: a stream of our own for allocations made during a capture
  std::vector<at::Tensor> retired;
};
Workspaces& workspaces() {
  static Workspaces w;
  return w;
}

// `bytes` of zeros on `device`, filled before this returns when `capturing` (in stream order on the current stream
// otherwise). During a capture the allocation and the fill go to a non-blocking stream of our own, which is not
// capturing, so the caching allocator serves the ordinary pool (a capture's pool serves only the capturing stream)
// and the fill runs now; the capture mode is relaxed meanwhile, since a global-mode capture forbids the
// synchronisation. Caller holds w.mu.
at::Tensor zeros_outside_graphs(Workspaces& w, const at::Device& device, int64_t bytes, bool capturing) {
  const auto opts = at::TensorOptions().dtype(at::kByte).device(device);
  if (!capturing) return at::zeros({bytes}, opts);
  const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  const size_t idx = static_cast<size_t>(device.index());
  if (w.side.size() <= idx) w.side.resize(idx + 1, nullptr);
  if (w.side[idx] == nullptr) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&w.side[idx], cudaStreamNonBlocking));
  at::Tensor t;
  {
    const c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromExternal(w.side[idx], device.index()));
    t = at::zeros({bytes}, opts);
  }
  C10_CUDA_CHECK(cudaStreamSynchronize(w.side[idx]));
  return t;
}

e3::DraftFcWorkspace decode_workspace(const at::Device& device, const e3::DraftFcParams& p, cudaStream_t stream) {
  const int64_t buffer_bytes = e3::draft_fc_decode_workspace_bytes(p.taps, p.out_features);
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  const size_t idx = static_cast<size_t>(device.index());
  if (w.by_device.size() <= idx) w.by_device.resize(idx + 1);
  at::Tensor& buffer = w.by_device[idx];
  if (!buffer.defined() || buffer.numel() < buffer_bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (buffer.defined()) w.retired.push_back(buffer);
    buffer = zeros_outside_graphs(w, device, buffer_bytes, status != cudaStreamCaptureStatusNone);
  }
  return e3::draft_fc_decode_workspace_view(buffer.data_ptr(), p.taps, p.out_features);
}

void check_vector_aligned(const void* ptr, int64_t row_stride, const char* what) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  E3_CHECK(addr % 16 == 0, "eagle3_capture.draft_fc: the CUDA kernels read ", what,
              " as 16-byte vectors, so it must start 16-byte aligned; got an address 16-byte misaligned by ",
              addr % 16, " bytes");
  E3_CHECK(row_stride % 8 == 0, "eagle3_capture.draft_fc: the CUDA kernels read ", what,
              " rows as 16-byte vectors, so its row stride must be a multiple of 8 elements; got ", row_stride);
}

void draft_fc_out_cuda(const std::vector<at::Tensor>& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& norm_weight, double eps,
                       const std::optional<at::Tensor>& bias, at::Tensor& out) {
  E3_CHECK(!x.empty() && x[0].is_cuda(), "eagle3_capture.draft_fc: expected x on a CUDA device");
  e3::DType dtype;
  const e3::DraftFcParams p = draft_fc_params(x, weight, norm_weight, eps, bias, out, &dtype);
  // Every check happens before the device guard and the workspace: past this point nothing throws but a CUDA error.
  for (int k = 0; k < p.taps; ++k) {
    const std::string what = "tap " + std::to_string(k);
    check_vector_aligned(p.tap(k), p.tap_row_stride(k), what.c_str());
  }
  if (p.norm_weight != nullptr) check_vector_aligned(p.norm_weight, 8, "norm_weight");
  const int64_t setting = draft_fc_decode_max_rows_setting();
  const int64_t max_rows = setting >= 0 ? setting : checked_device_tuning(x[0].get_device()).decode_max_rows;
  const bool decode = p.rows <= max_rows && dtype != e3::DType::F32;
  if (decode) check_vector_aligned(p.weight, p.weight_row_stride, "weight");
  if (p.rows == 0) return;
  const c10::cuda::CUDAGuard guard(x[0].device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (decode) {
    const e3::DraftFcWorkspace ws = decode_workspace(x[0].device(), p, stream);
    e3::DraftFcDecodeConfig cfg;
    cfg.kernel = draft_fc_decode_kernel_setting();
    cfg.cluster_fault = draft_fc_cluster_fault();
    C10_CUDA_CHECK(static_cast<cudaError_t>(e3::draft_fc_decode_cuda(p, dtype, ws, stream, cfg)));
    return;
  }
  draft_fc_prefill(x, weight, norm_weight, bias, out, p, [&](at::Tensor& xn) {
    C10_CUDA_CHECK(static_cast<cudaError_t>(e3::draft_fc_normalize_cuda(p, dtype, xn.data_ptr(), stream)));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CUDA, m) {
  m.impl("draft_fc", &draft_fc_functional<&draft_fc_out_cuda>);
  m.impl("draft_fc_out", &draft_fc_out_cuda);
}

}  // namespace e3ops
