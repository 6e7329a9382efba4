// CUDA kernels of the draft fc: the split-K decode kernel (fragment layout in draft_fc_device.cuh), the
// prefill normalise kernel, the decode workspace and the decode dispatch: DraftFcDecodeKernel picks this kernel or the
// cluster kernel of draft_fc_cluster_cuda.cu (sm_90+, small N by default).
#include <atomic>
#include <cstdio>

#include "device.h"
#include "draft_fc_cluster.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

struct DecodeTiling {
  int64_t n_tiles;
  int64_t splits_per_tap;
  int64_t k_block;  // k elements per split (whole warp steps: 32 x the kernel's unroll)
};

// The split-K decode kernel. grid.x: column tiles of 64 weight rows; grid.y: K-splits (taps x splits_per_tap).
// kGroups token groups of 8 rows (M <= 8: one; M = 9..16: two, opt-in; above the threshold, normalise + cuBLAS).
// Each warp streams 16 weight rows over the block's k range (decode_stream); the partials meet in the workspace
// and the tile's last block applies the per-tap rsqrt (decode_add_partials).
template <typename T, bool kNorm, int kGroups>
__global__ void __launch_bounds__(kFcWarps * 32, decode_blocks_per_sm(kGroups))
    draft_fc_split_decode_kernel(DraftFcParams p, DecodeTiling t, DraftFcWorkspace ws) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y / t.splits_per_tap);
  const int64_t k_begin = (blockIdx.y % t.splits_per_tap) * t.k_block;
  const int64_t k_end = k_begin + t.k_block < p.hidden ? k_begin + t.k_block : p.hidden;
  const int64_t row_a = tile * kFcRowsPerBlock + warp * 16 + (lane >> 2);
  float acc[kGroups][4] = {};
  float sum_sq[kGroups] = {};
  // One warp per block sums x^2: the k range is the same for all four.
  decode_stream<T, kNorm, kGroups, decode_unroll(kNorm, kGroups)>(p, tap, row_a, k_begin, k_end, kNorm && warp == 0,
                                                                  acc, sum_sq);
  // One block per (tile, tap, split): the tile is complete after taps * splits_per_tap blocks.
  decode_add_partials<T, kNorm, kGroups>(p, ws, tile, tap, row_a, acc, sum_sq, 1u,
                                         static_cast<unsigned>(p.taps * t.splits_per_tap));
}

// The normalise kernel's per-vector math, shared by its register-held and streaming loops: x^2 added element by
// element into the running sum (the order of the additions is the kernel's), and round(x * rrms * g).
template <typename T, int V>
__device__ __forceinline__ void add_squares(const Chunk<T, V>& x, float& s) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float f = to_f(x.v[e]);
    s += f * f;
  }
}
template <typename T, int V>
__device__ __forceinline__ void rms_scale(Chunk<T, V>& x, const Chunk<T, V>& g, float rrms) {
#pragma unroll
  for (int e = 0; e < V; ++e) x.v[e] = from_f<T>(to_f(x.v[e]) * rrms * to_f(g.v[e]));
}

// Normalise (above the decode threshold, before cuBLAS): one block per (row, tap): rrms over the row's H values, then
// xn = round(x * rrms * g) (or a copy). Rows move as 16-byte vectors (V elements); H is a multiple of 8, hence of V.
// kRegVectors > 0 (few rows: the grid fits one wave, the kernel is latency, not bytes): up to kRegVectors vectors per
// thread (H <= 8192 bf16 at 256 threads) stay in registers from the sum of squares to the store, their norm weights
// loaded before the block reduction, so a row costs one round trip to memory instead of a second pass over x. It
// needs ~96 registers (2 blocks per SM), which made prefill (M = 4096) 20% slower, hence kRegVectors = 0 there: the
// streaming two-pass form at ~30 registers.
template <typename T, bool kNorm, int kRegVectors>
__global__ void __launch_bounds__(256) draft_fc_normalize_kernel(DraftFcParams p, T* xn) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kSlots = kRegVectors > 0 ? kRegVectors : 1;
  __shared__ float scratch[32];
  const int tap = blockIdx.y;
  const T* gk = kNorm ? static_cast<const T*>(p.norm_weight) + tap * p.hidden : nullptr;
  const int64_t nvec = p.hidden / V;
  const int64_t width = p.taps * p.hidden;
  const int64_t reg_end = static_cast<int64_t>(blockDim.x) * kRegVectors;  // vectors [0, reg_end) stay in registers
  for (int64_t m = blockIdx.x; m < p.rows; m += gridDim.x) {
    const T* x = static_cast<const T*>(p.tap(tap)) + m * p.tap_row_stride(tap);
    T* o = xn + m * width + tap * p.hidden;
    Chunk<T, V> xs[kSlots], gs[kSlots];
#pragma unroll
    for (int i = 0; i < kRegVectors; ++i) {
      const int64_t v = threadIdx.x + i * static_cast<int64_t>(blockDim.x);
      if (v < nvec) {
        xs[i] = load_chunk<T, V>(x + v * V);
        if (kNorm) gs[i] = load_chunk<T, V>(gk + v * V);
      }
    }
    float rrms = 1.f;
    if (kNorm) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kRegVectors; ++i) {
        if (threadIdx.x + i * static_cast<int64_t>(blockDim.x) < nvec) add_squares(xs[i], s);
      }
      for (int64_t v = reg_end + threadIdx.x; v < nvec; v += blockDim.x)  // rows longer than the registers hold
        add_squares(load_chunk<T, V>(x + v * V), s);
      rrms = rsqrtf(block_sum(s, scratch) / static_cast<float>(p.hidden) + p.eps);
    }
#pragma unroll
    for (int i = 0; i < kRegVectors; ++i) {
      const int64_t v = threadIdx.x + i * static_cast<int64_t>(blockDim.x);
      if (v < nvec) {
        Chunk<T, V> xv = xs[i];
        if (kNorm) rms_scale(xv, gs[i], rrms);
        store_chunk<T, V>(o + v * V, xv);
      }
    }
    for (int64_t v = reg_end + threadIdx.x; v < nvec; v += blockDim.x) {
      Chunk<T, V> xv = load_chunk<T, V>(x + v * V);
      if (kNorm) {
        const Chunk<T, V> gv = load_chunk<T, V>(gk + v * V);
        rms_scale(xv, gv, rrms);
      }
      store_chunk<T, V>(o + v * V, xv);
    }
  }
}

}  // namespace kernels

namespace {
using namespace kernels;

constexpr int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

DecodeTiling decode_tiling(int taps, int64_t hidden, int64_t out_features, const DraftFcDecodeConfig& cfg, int groups,
                           int unroll, int sms) {
  DecodeTiling t;
  t.n_tiles = decode_n_tiles(out_features);
  // As many K-splits as fit in one wave of resident blocks (a second, partial wave would idle most SMs while it
  // runs); every warp then streams its k range, loads for a whole step issued before its MMAs.
  const int blocks_per_sm = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : decode_blocks_per_sm(groups);
  const int64_t target_blocks = static_cast<int64_t>(blocks_per_sm) * sms;
  const int64_t max_splits = (hidden + kFcChunk - 1) / kFcChunk;
  int64_t splits = target_blocks / (t.n_tiles * taps);
  if (cfg.splits_per_tap > 0) splits = cfg.splits_per_tap;
  splits = splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
  const int64_t per = (hidden + splits - 1) / splits;
  // k blocks in whole warp steps (32 x unroll elements): with blocks in multiples of 32 the last step of a block is
  // often nearly empty, one more DRAM round trip for a few bytes (3% at N=896, docs/performance.md).
  const int64_t align = kFcChunk * unroll;
  t.k_block = (per + align - 1) / align * align;
  t.splits_per_tap = (hidden + t.k_block - 1) / t.k_block;
  return t;
}

// The split-K grid of this call: what the split kernel launches, and what Auto consults (its K-splits per tap) to
// choose between the split and cluster kernels; computed once per call.
DecodeTiling split_tiling(const DraftFcParams& p, const DraftFcDecodeConfig& cfg, int sms) {
  return with_norm_and_groups(p, [&](auto norm, auto groups) {
    return decode_tiling(p.taps, p.hidden, p.out_features, cfg, groups(), decode_unroll(norm(), groups()), sms);
  });
}

template <typename T, bool kNorm, int kGroups>
cudaError_t launch_decode_groups(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s,
                                 const DecodeTiling& t) {
  const dim3 grid(static_cast<unsigned>(t.n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  draft_fc_split_decode_kernel<T, kNorm, kGroups><<<grid, kFcWarps * 32, 0, s>>>(p, t, ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_decode(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s, const DecodeTiling& t) {
  return with_norm_and_groups(p, [&](auto norm, auto groups) {
    return launch_decode_groups<T, decltype(norm)::value, decltype(groups)::value>(p, ws, s, t);
  });
}

template <typename T>
cudaError_t launch_normalize(const DraftFcParams& p, void* xn, cudaStream_t s) {
  const int64_t blocks = p.rows < 65535 * 4 ? p.rows : 65535 * 4;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.taps));
  int64_t threads = ((p.hidden / (16 / static_cast<int64_t>(sizeof(T))) + 31) / 32) * 32;
  threads = threads < 32 ? 32 : (threads > 256 ? 256 : threads);
  const unsigned nt = static_cast<unsigned>(threads);
  T* o = static_cast<T*>(xn);
  // Registers across the reduction only while the whole grid is one wave at 2 blocks per SM.
  const bool in_registers = blocks * p.taps <= 2 * static_cast<int64_t>(sm_count());
  const bool norm = p.norm_weight != nullptr;
  if (in_registers && norm) draft_fc_normalize_kernel<T, true, 4><<<grid, nt, 0, s>>>(p, o);
  else if (in_registers) draft_fc_normalize_kernel<T, false, 4><<<grid, nt, 0, s>>>(p, o);
  else if (norm) draft_fc_normalize_kernel<T, true, 0><<<grid, nt, 0, s>>>(p, o);
  else draft_fc_normalize_kernel<T, false, 0><<<grid, nt, 0, s>>>(p, o);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

namespace {
using cuda::kernels::kWsTokens;  // floats per (tap, output row) of the partial sums and per (tile, tap) of the sums
}  // namespace

int64_t draft_fc_decode_workspace_bytes(int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  return cuda::align256(taps * out_features * kWsTokens * 4) + cuda::align256(n_tiles * taps * kWsTokens * 4) +
         cuda::align256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_decode_workspace_view(void* buffer, int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  char* at = static_cast<char*>(buffer);
  DraftFcWorkspace ws;
  ws.acc = reinterpret_cast<float*>(at);
  at += cuda::align256(taps * out_features * kWsTokens * 4);
  ws.tile_sum_sq = reinterpret_cast<float*>(at);
  at += cuda::align256(n_tiles * taps * kWsTokens * 4);
  ws.counters = reinterpret_cast<unsigned*>(at);
  return ws;
}

namespace {

// Errors with which a cluster launch is refused before anything runs (its configuration, not the context): the
// split kernel can still run. Anything else (a sticky error from earlier work, an invalid stream) is returned.
bool cluster_refused(int err) {
  switch (static_cast<cudaError_t>(err)) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorCooperativeLaunchTooLarge:
    case cudaErrorNotSupported:
    case cudaErrorInvalidClusterSize:
      return true;
    default:
      return false;
  }
}

std::atomic<bool> g_fallback_noted{false};

void note_cluster_fallback(int err) {
  if (g_fallback_noted.exchange(true)) return;
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  const auto e = static_cast<cudaError_t>(err);
  std::fprintf(stderr,
               "eagle3_capture: the draft fc cluster kernel cannot launch on device %d (%s: %s); the split-K kernel "
               "runs instead (the same products, summed in another order); said once per process\n",
               dev, cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace

void draft_fc_rearm_fallback_note() { g_fallback_noted.store(false); }

int64_t draft_fc_split_pieces_per_tap(int sms, int taps, int64_t hidden, int64_t out_features, int64_t rows,
                                      bool norm) {
  DraftFcParams p{};
  p.taps = taps;
  p.hidden = hidden;
  p.out_features = out_features;
  p.rows = rows;
  p.norm_weight = norm ? &p : nullptr;  // only its presence matters here
  return cuda::split_tiling(p, DraftFcDecodeConfig{}, sms).splits_per_tap;
}

int draft_fc_decode_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                         const DraftFcDecodeConfig& cfg) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (p.rows > kDraftFcDecodeMaxRows) return static_cast<int>(cudaErrorInvalidValue);
  const bool cluster = draft_fc_cluster_applies(p) && draft_fc_cluster_supported();
  // Auto: the cluster kernel where the split grid would cut each tap into many pieces and the cluster grid fits one
  // wave of co-resident clusters (the cluster launcher declines otherwise), else the split kernel on the grid already
  // computed. Cluster: the cluster kernel whatever its grid.
  const cuda::kernels::DecodeTiling split = cuda::split_tiling(p, cfg, cuda::sm_count());
  const int64_t min_splits = cfg.cluster_min_splits > 0 ? cfg.cluster_min_splits : device_tuning().cluster_min_splits;
  const bool want_cluster =
      cfg.kernel == DraftFcDecodeKernel::Cluster ||
      (cfg.kernel != DraftFcDecodeKernel::Split && split.splits_per_tap >= min_splits);
  if (cluster && want_cluster) {
    bool launched = false;
    int err = cfg.cluster_fault;
    if (err == 0) {
      err = draft_fc_decode_cluster_cuda(p, dtype, stream, cfg,
                                         /*only_one_wave=*/cfg.kernel != DraftFcDecodeKernel::Cluster, &launched);
    }
    if (err == 0 && launched) return 0;
    if (err != 0) {
      if (!cluster_refused(err)) return err;
      (void)cudaGetLastError();  // the refused launch's error is not the split kernel's
      note_cluster_fallback(err);
    }
  }
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_decode<__nv_bfloat16>(p, ws, s, split);
    case DType::F16: return cuda::launch_decode<__half>(p, ws, s, split);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int draft_fc_normalize_cuda(const DraftFcParams& p, DType dtype, void* xn, void* stream) {
  if (p.rows == 0) return 0;
  return cuda::with_device_type(dtype, [&](auto tag) {
    return cuda::launch_normalize<typename decltype(tag)::type>(p, xn, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace e3
