// The EAGLE-3 draft's first step: y = fc(cat(norm_1(x_1), ..., norm_K(x_K))) + bias, where norm_k is the optional
// per-tap RMSNorm of EAGLE-3.1 drafts (x * rsqrt(mean(x^2) + eps) * g_k) and fc is [N, K*H]. Torch-free.
//
// Two CUDA paths:
// - decode (M <= 8 rows by default, up to 16 by the ops' knob): weight-streaming kernels. The norm is applied on the
//   fly: g_k multiplies the activations as they are loaded, and rsqrt(mean(x^2) + eps), a per-(row, tap) scalar,
//   multiplies each tap's partial dot product, so nothing is materialised and every weight byte is read once. The
//   K-split partials of a column tile meet either in an fp32 workspace through L2 atomics, the tile's last block
//   scaling, summing the taps, adding the bias, writing the output and re-zeroing the workspace (self-cleaning, so
//   CUDA-graph replays need no memset): the split kernel; or in a thread-block cluster's distributed shared memory
//   (sm_90+): the cluster kernel (draft_fc_cluster.h). DraftFcDecodeKernel says which runs where.
// - prefill: the normalised (or just packed) activations are written once to a [M, K*H] scratch and the ops layer
//   runs the GEMM through torch (cuBLAS).
// Numerics: fp32 norm statistics and fp32 accumulation. Prefill rounds x*rrms*g to the activation dtype before the
// GEMM (what K RMSNorm modules + cat + linear do); decode rounds x*g and applies rrms in fp32 after the dot product.
#pragma once

#include <cmath>
#include <cstdint>

#include "dtype.h"

namespace e3 {

struct DraftFcParams {
  static constexpr int kMaxListTaps = 16;
  // Tap k's [M, H] activations: `x_base + k * x_tap_stride` with row stride x_row_stride[0] when x_base is set
  // (the packed [M, K*H] buffer), else x[k] with row stride x_row_stride[k] (a list of K tensors).
  const void* x_base;
  int64_t x_tap_stride;
  const void* x[kMaxListTaps];
  int64_t x_row_stride[kMaxListTaps];
  int taps;                  // K
  int64_t hidden;            // H, a multiple of 8
  int64_t rows;              // M
  const void* weight;        // [N, K*H], rows contiguous, row stride weight_row_stride
  int64_t weight_row_stride;
  int64_t out_features;      // N
  const void* norm_weight;   // [K, H] contiguous, or nullptr: no per-tap norm
  float eps;
  const void* bias;          // [N] or nullptr
  void* out;                 // [M, N], row stride out_row_stride
  int64_t out_row_stride;
  int elem_size;             // bytes per activation/weight element

  E3_HOST_DEVICE const void* tap(int k) const {
    if (x_base != nullptr) return static_cast<const char*>(x_base) + k * x_tap_stride * elem_size;
    return x[k];
  }
  E3_HOST_DEVICE int64_t tap_row_stride(int k) const {
    return x_base != nullptr ? x_row_stride[0] : x_row_stride[k];
  }
};

// ---- CPU: write the normalised taps (or a plain copy when norm_weight is null) into xn [M, K*H] contiguous. ----
template <typename T>
void draft_fc_normalize_rows_cpu(const DraftFcParams& p, T* xn, int64_t row_begin, int64_t row_end) {
  const T* g = static_cast<const T*>(p.norm_weight);
  const int64_t width = p.taps * p.hidden;
  for (int64_t m = row_begin; m < row_end; ++m) {
    for (int k = 0; k < p.taps; ++k) {
      const T* x = static_cast<const T*>(p.tap(k)) + m * p.tap_row_stride(k);
      T* o = xn + m * width + k * p.hidden;
      if (g == nullptr) {
        for (int64_t j = 0; j < p.hidden; ++j) o[j] = x[j];
        continue;
      }
      float sum_sq = 0.f;
      for (int64_t j = 0; j < p.hidden; ++j) {
        const float v = to_float(x[j]);
        sum_sq += v * v;
      }
      const float rrms = 1.0f / std::sqrt(sum_sq / static_cast<float>(p.hidden) + p.eps);
      const T* gk = g + k * p.hidden;
      for (int64_t j = 0; j < p.hidden; ++j) o[j] = from_float<T>(to_float(x[j]) * rrms * to_float(gk[j]));
    }
  }
}

// ---- CUDA (draft_fc_cuda.cu). Each returns a cudaError_t value (0 = success); `stream` is a cudaStream_t. ----

// Rows the decode kernels take at most (two MMA token groups of 8). The rows at or below which the ops use them
// come from the device (Tuning::decode_max_rows, tuning.h): 8 on the H200, where two groups measured slower than
// normalise + cuBLAS except at N = 896, M <= 12 (docs/performance.md); 16 on sm_12x (reasoned).
constexpr int64_t kDraftFcDecodeMaxRows = 16;

// Decode workspace, zero at rest: zero-filled once at allocation and re-zeroed by the kernel after every call
// (self-cleaning, so CUDA-graph replays need no memset; any (K, N) can reuse a large enough buffer since all of it
// is zero between calls).
struct DraftFcWorkspace {
  float* acc;           // [K][N][16] split-K partial sums per tap (16 = kDraftFcDecodeMaxRows)
  float* tile_sum_sq;   // [n_tiles][K][16] per-column-tile sums of squares (per-tap norm)
  unsigned* counters;   // [n_tiles] blocks finished per column tile
};
// Bytes of the workspace buffer for K taps and N outputs, and the workspace's arrays inside such a buffer (zero at
// rest, at least that many bytes).
int64_t draft_fc_decode_workspace_bytes(int taps, int64_t out_features);
DraftFcWorkspace draft_fc_decode_workspace_view(void* buffer, int taps, int64_t out_features);

// The decode kernels. Each streams the weights once through registers; they differ in where the K-splits of a column
// tile meet.
enum class DraftFcDecodeKernel : int {
  // The default: Cluster where it applies, the split-K grid would cut each tap into at least the device's
  // Tuning::cluster_min_splits pieces (small N: many partials per tile, whose L2 round trips the cluster saves;
  // 4 at the H200's 132 SMs, scaled with the SM count) and the cluster grid fits one wave of co-resident clusters
  // (draft_fc_cluster.h), else Split. On the H200 (H = 7168, K = 3) that is N <= 1792, where the cluster kernel is
  // 1.0-2.1 us faster; the two are within noise of each other at N = 3584 and 7168 (docs/performance.md,
  // benchmarks/results/draft_fc-decode-sweep-h200.json).
  Auto = 0,
  // sm_90+, K <= 8: one thread-block cluster per column tile, partials reduced in distributed shared memory
  // (draft_fc_cluster.h); no workspace, deterministic. Where it does not apply, Split. A cluster launch the device
  // refuses (cluster size unsupported, no cluster fits: occupancy 0) runs the split kernel instead and says so once
  // on stderr.
  Cluster = 1,
  // Any GPU: partials added into the fp32 workspace with L2 atomics, the tile's last block finishes it.
  Split = 2,
};
// Launch tuning; the defaults are what the library uses. Exposed for the bench binary's sweeps.
struct DraftFcDecodeConfig {
  DraftFcDecodeKernel kernel = DraftFcDecodeKernel::Auto;
  int blocks_per_sm = 0;  // register kernels: K-split so that about this many blocks per SM stream weights (0: as
                          // many as the kernel is built to keep resident)
  int splits_per_tap = 0;  // register-streaming kernel: K-splits per tap (0: from blocks_per_sm)
  int64_t cluster_min_splits = 0;  // Auto's switch (0: the device's Tuning::cluster_min_splits)
  // Test knob: a cudaError_t value the cluster launch pretends to return (0: none), to exercise the fallback to
  // the split kernel on a GPU where clusters launch.
  int cluster_fault = 0;
};

int draft_fc_decode_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                         const DraftFcDecodeConfig& cfg = DraftFcDecodeConfig());
// The cluster-to-split fallback's stderr line is printed once per process; this re-arms it (tests).
void draft_fc_rearm_fallback_note();
// The split-K grid's pieces per tap on a GPU of `sms` SMs, what Auto compares with Tuning::cluster_min_splits
// (the CPU tests check the switch's N on the H200's and the RTX PRO 6000's SM counts).
int64_t draft_fc_split_pieces_per_tap(int sms, int taps, int64_t hidden, int64_t out_features, int64_t rows,
                                      bool norm);

// Writes the normalised (or packed) taps into xn [M, K*H] contiguous; the GEMM follows in the ops layer.
int draft_fc_normalize_cuda(const DraftFcParams& p, DType dtype, void* xn, void* stream);

}  // namespace e3
