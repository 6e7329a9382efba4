// gather_p2p_: checks, then the P2P gather kernel on the current stream. The Python side (eagle3_capture.tp)
// owns the peer mapping (torch symmetric memory) and hands the peer pointers in as integers.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../kernels/gather.h"
#include "checks.h"

namespace e3ops {
namespace {

const char* kOp = "gather_p2p_";

void gather_p2p_cuda(at::Tensor& out, const at::Tensor& local, c10::IntArrayRef out_ptrs,
                     c10::IntArrayRef flag_ptrs, at::Tensor& flags, at::Tensor& error, int64_t rank,
                     int64_t dst_row_offset, c10::IntArrayRef src_cols, c10::IntArrayRef dst_cols, int64_t seg_len,
                     int64_t blocks, double timeout_s, int64_t signal, bool trap_on_timeout) {
  check_dim(out, 2, kOp, "out", "[rows, K*H]");
  check_dim(local, 2, kOp, "local", "[rows, cols]");
  E3_CHECK(out.is_cuda(), "eagle3_capture.gather_p2p_: expected out on a CUDA device, got ", out.device());
  check_same_dtype_and_device(local, out, kOp, "local", "out");
  to_e3_dtype(out, kOp, "out");
  check_rows(local, kOp, "local");
  check_rows(out, kOp, "out");
  const int64_t world = static_cast<int64_t>(out_ptrs.size());
  E3_CHECK(world >= 1 && world <= e3::kGatherMaxRanks, "eagle3_capture.gather_p2p_: expected 1..",
              e3::kGatherMaxRanks, " ranks, got ", world);
  E3_CHECK(static_cast<int64_t>(flag_ptrs.size()) == world, "eagle3_capture.gather_p2p_: expected ", world,
              " flag pointers (one per rank), got ", flag_ptrs.size());
  E3_CHECK(rank >= 0 && rank < world, "eagle3_capture.gather_p2p_: rank ", rank, " out of range for world ", world);
  E3_CHECK(reinterpret_cast<int64_t>(out.data_ptr()) == out_ptrs[rank], "eagle3_capture.gather_p2p_: out must be ",
              "this rank's registered output buffer (out_ptrs[rank])");
  E3_CHECK(flags.is_cuda() && flags.scalar_type() == at::kLong && flags.is_contiguous() &&
                  flags.numel() >= e3::kGatherFlagWords && reinterpret_cast<int64_t>(flags.data_ptr()) == flag_ptrs[rank],
              "eagle3_capture.gather_p2p_: flags must be this rank's registered int64 flag area of at least ",
              e3::kGatherFlagWords, " words (flag_ptrs[rank])");
  E3_CHECK(error.is_pinned() && error.scalar_type() == at::kInt && error.is_contiguous() && error.numel() >= 4,
              "eagle3_capture.gather_p2p_: error must be a pinned int32 tensor of at least 4 elements");
  const int64_t segments = static_cast<int64_t>(src_cols.size());
  E3_CHECK(segments >= 1 && segments <= e3::kGatherMaxSegments && static_cast<int64_t>(dst_cols.size()) == segments,
              "eagle3_capture.gather_p2p_: expected 1..", e3::kGatherMaxSegments,
              " column segments with one source and one destination column each, got ", src_cols.size(), " and ",
              dst_cols.size());
  E3_CHECK(seg_len >= 1, "eagle3_capture.gather_p2p_: segment length must be >= 1, got ", seg_len);
  for (int64_t s = 0; s < segments; ++s) {
    E3_CHECK(src_cols[s] >= 0 && src_cols[s] + seg_len <= local.size(1), "eagle3_capture.gather_p2p_: segment ",
                s, " reads local columns [", src_cols[s], ", ", src_cols[s] + seg_len, ") of ", local.size(1));
    E3_CHECK(dst_cols[s] >= 0 && dst_cols[s] + seg_len <= out.size(1), "eagle3_capture.gather_p2p_: segment ",
                s, " writes output columns [", dst_cols[s], ", ", dst_cols[s] + seg_len, ") of ", out.size(1));
  }
  E3_CHECK(dst_row_offset >= 0 && dst_row_offset + local.size(0) <= out.size(0),
              "eagle3_capture.gather_p2p_: this rank's ", local.size(0), " rows at offset ", dst_row_offset,
              " do not fit the output's ", out.size(0), " rows");
  E3_CHECK(blocks >= 1 && blocks <= e3::kGatherMaxBlocks, "eagle3_capture.gather_p2p_: blocks must be in 1..",
           e3::kGatherMaxBlocks, ", got ", blocks);
  E3_CHECK(signal == e3::kGatherSignalAtomic || signal == e3::kGatherSignalFlags,
           "eagle3_capture.gather_p2p_: signal must be ", e3::kGatherSignalAtomic, " (atomic) or ",
           e3::kGatherSignalFlags, " (flags), got ", signal);
  E3_CHECK(std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= 1e6,
           "eagle3_capture.gather_p2p_: timeout must be in (0, 1e6] s, got ", timeout_s);

  e3::GatherParams p{};
  p.world = static_cast<int>(world);
  p.rank = static_cast<int>(rank);
  for (int64_t r = 0; r < world; ++r) {
    p.out[r] = reinterpret_cast<void*>(out_ptrs[r]);
    p.flags[r] = reinterpret_cast<unsigned long long*>(flag_ptrs[r]);
  }
  p.out_row_stride = out.stride(0);
  p.local = local.data_ptr();
  p.local_row_stride = local.stride(0);
  p.local_rows = local.size(0);
  p.dst_row_offset = dst_row_offset;
  p.segments = static_cast<int>(segments);
  p.seg_len = seg_len;
  for (int64_t s = 0; s < segments; ++s) {
    p.src_col[s] = src_cols[s];
    p.dst_col[s] = dst_cols[s];
  }
  p.elem_size = static_cast<int>(out.element_size());
  p.blocks = static_cast<int>(blocks);
  p.signal = static_cast<int>(signal);
  p.timeout_ns = static_cast<unsigned long long>(timeout_s * 1e9);
  p.trap = trap_on_timeout ? 1 : 0;
  p.error = static_cast<int*>(error.data_ptr());
  const c10::cuda::CUDAGuard guard(out.device());
  C10_CUDA_CHECK(static_cast<cudaError_t>(e3::gather_p2p_cuda(p, c10::cuda::getCurrentCUDAStream().stream())));
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, CUDA, m) { m.impl("gather_p2p_", &gather_p2p_cuda); }

}  // namespace e3ops
