// CUDA kernels of the draft fc: the register-streaming decode kernel (fragment layout in draft_fc_device.cuh; the
// default decode path), the prefill normalise kernel, the decode workspace and the decode dispatch (which runs the
// opt-in TMA kernel of draft_fc_bulk_cuda.cu instead when asked for, on sm_90 and later with packed input).
#include "draft_fc_bulk.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

struct DecodeTiling {
  int64_t n_tiles;
  int64_t splits_per_tap;
  int64_t k_block;  // k elements per split (whole warp steps: 32 x the kernel's unroll)
};

// grid.x: column tiles of 64 weight rows; grid.y: K-splits (taps x splits_per_tap). One token group of 8 rows
// (M <= 8; larger M goes through normalise + cuBLAS, which measured faster from M = 9 on, benchmarks/NOTES.md).
// Each warp streams 16 weight rows over the block's k range, kUnroll 32-wide chunks per step, all of a step's
// loads issued before its MMAs. kNorm: g multiplies the activations as they are loaded and
// warp 0 sums x^2 for the per-tap rsqrt, which the epilogue applies to each tap's partial dot product.
template <typename T, bool kNorm>
__global__ void __launch_bounds__(kFcWarps * 32, 4) draft_fc_decode_kernel(DraftFcParams p, DecodeTiling t,
                                                                             DraftFcWorkspace ws) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y / t.splits_per_tap);
  const int64_t k_begin = (blockIdx.y % t.splits_per_tap) * t.k_block;
  const int64_t k_end = k_begin + t.k_block < p.hidden ? k_begin + t.k_block : p.hidden;
  const int64_t row_a = tile * kFcRowsPerBlock + warp * 16 + g, row_b = row_a + 8;
  const bool has_a = row_a < p.out_features, has_b = row_b < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = static_cast<const T*>(p.weight) + row_b * p.weight_row_stride + tap * p.hidden;
  const T* x = static_cast<const T*>(p.tap(tap)) + g * p.tap_row_stride(tap);  // this lane's token row
  const bool has_x = g < p.rows;
  const T* gw = static_cast<const T*>(p.norm_weight) + tap * p.hidden;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float sum_sq = 0.f;
  const bool count_sq = kNorm && warp == 0;  // one warp per block: the k range is the same for all four

  constexpr int kUnroll = kNorm ? kFcUnrollNorm : kFcUnroll;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kFcChunk * kUnroll) {
    // Every load of the step (weights, activations, norm weights) is issued before its first MMA: a norm-weight
    // load left next to its use serialised one L2 round trip per chunk (a 30% slower kernel on the H200).
    uint4 wa[kUnroll], wb[kUnroll], xv[kUnroll], gv[kNorm ? kUnroll : 1];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kFcChunk + 8 * c;  // this lane's 8 contiguous elements
      const bool in = k < k_end;
      wa[u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      wb[u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
      xv[u] = in && has_x ? __ldg(reinterpret_cast<const uint4*>(x + k)) : make_uint4(0, 0, 0, 0);
      if (kNorm) gv[u] = in ? __ldg(reinterpret_cast<const uint4*>(gw + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint4 xu = xv[u];
      if (kNorm) xu = scale8<T>(xu, gv[kNorm ? u : 0], sum_sq, count_sq);
      // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of the weight and activation vectors.
      Mma<T>::run(acc, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xu.x, xu.y);
      Mma<T>::run(acc, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xu.z, xu.w);
    }
  }

  // One block per (tile, tap, split): the tile is complete after taps * splits_per_tap blocks.
  decode_add_partials<T, kNorm>(p, ws, tile, tap, row_a, acc, sum_sq, 1u,
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

// Normalise (the M > 8 path, before cuBLAS): one block per (row, tap): rrms over the row's H values, then
// xn = round(x * rrms * g) (or a copy). Rows move as 16-byte vectors (V elements); H is a multiple of 8, hence of V.
// kHeld > 0 (few rows: the grid fits one wave, the kernel is latency, not bytes): up to kHeld vectors per thread
// (H <= 8192 bf16 at 256 threads) stay in registers from the sum of squares to the store, their norm weights
// loaded before the block reduction, so a row costs one round trip to memory instead of a second pass over x. It
// needs ~96 registers (2 blocks per SM), which made prefill (M = 4096) 20% slower, hence kHeld = 0 there: the
// streaming two-pass form at ~30 registers.
template <typename T, bool kNorm, int kHeld>
__global__ void __launch_bounds__(256) draft_fc_normalize_kernel(DraftFcParams p, T* xn) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kSlots = kHeld > 0 ? kHeld : 1;
  __shared__ float scratch[32];
  const int tap = blockIdx.y;
  const T* gk = kNorm ? static_cast<const T*>(p.norm_weight) + tap * p.hidden : nullptr;
  const int64_t nvec = p.hidden / V;
  const int64_t width = p.taps * p.hidden;
  const int64_t held_end = static_cast<int64_t>(blockDim.x) * kHeld;  // vectors [0, held_end) stay in registers
  for (int64_t m = blockIdx.x; m < p.rows; m += gridDim.x) {
    const T* x = static_cast<const T*>(p.tap(tap)) + m * p.tap_row_stride(tap);
    T* o = xn + m * width + tap * p.hidden;
    Chunk<T, V> xs[kSlots], gs[kSlots];
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
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
      for (int i = 0; i < kHeld; ++i) {
        if (threadIdx.x + i * static_cast<int64_t>(blockDim.x) < nvec) add_squares(xs[i], s);
      }
      for (int64_t v = held_end + threadIdx.x; v < nvec; v += blockDim.x)  // rows longer than the registers hold
        add_squares(load_chunk<T, V>(x + v * V), s);
      rrms = rsqrtf(block_sum(s, scratch) / static_cast<float>(p.hidden) + p.eps);
    }
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int64_t v = threadIdx.x + i * static_cast<int64_t>(blockDim.x);
      if (v < nvec) {
        Chunk<T, V> xv = xs[i];
        if (kNorm) rms_scale(xv, gs[i], rrms);
        store_chunk<T, V>(o + v * V, xv);
      }
    }
    for (int64_t v = held_end + threadIdx.x; v < nvec; v += blockDim.x) {
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

DecodeTiling decode_tiling(int taps, int64_t hidden, int64_t out_features, const DraftFcDecodeConfig& cfg, bool norm) {
  DecodeTiling t;
  const int blocks_per_sm = cfg.blocks_per_sm;
  t.n_tiles = decode_n_tiles(out_features);
  // As many K-splits as fit in one wave of resident blocks (a second, partial wave would idle most SMs while it
  // runs); every warp then streams its k range, loads for a whole step issued before its MMAs.
  const int64_t target_blocks = static_cast<int64_t>(blocks_per_sm > 0 ? blocks_per_sm : 4) * sm_count();
  const int64_t max_splits = (hidden + kFcChunk - 1) / kFcChunk;
  int64_t spt = target_blocks / (t.n_tiles * taps);
  if (cfg.splits_per_tap > 0) spt = cfg.splits_per_tap;
  spt = spt < 1 ? 1 : (spt > max_splits ? max_splits : spt);
  const int64_t per = (hidden + spt - 1) / spt;
  // k blocks in whole warp steps (32 x unroll elements): with blocks in multiples of 32 the last step of a block was
  // often nearly empty, one more DRAM round trip for a few bytes (3% at N=896, benchmarks/NOTES.md).
  const int64_t align = kFcChunk * (norm ? kFcUnrollNorm : kFcUnroll);
  t.k_block = (per + align - 1) / align * align;
  t.splits_per_tap = (hidden + t.k_block - 1) / t.k_block;
  return t;
}

template <typename T>
cudaError_t launch_decode(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s,
                          const DraftFcDecodeConfig& cfg) {
  const bool norm = p.norm_weight != nullptr;
  const DecodeTiling t = decode_tiling(p.taps, p.hidden, p.out_features, cfg, norm);
  const dim3 grid(static_cast<unsigned>(t.n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  if (norm)
    draft_fc_decode_kernel<T, true><<<grid, kFcWarps * 32, 0, s>>>(p, t, ws);
  else
    draft_fc_decode_kernel<T, false><<<grid, kFcWarps * 32, 0, s>>>(p, t, ws);
  return cudaGetLastError();
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
  const bool held = blocks * p.taps <= 2 * static_cast<int64_t>(sm_count());
  const bool norm = p.norm_weight != nullptr;
  if (held && norm) draft_fc_normalize_kernel<T, true, 4><<<grid, nt, 0, s>>>(p, o);
  else if (held) draft_fc_normalize_kernel<T, false, 4><<<grid, nt, 0, s>>>(p, o);
  else if (norm) draft_fc_normalize_kernel<T, true, 0><<<grid, nt, 0, s>>>(p, o);
  else draft_fc_normalize_kernel<T, false, 0><<<grid, nt, 0, s>>>(p, o);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

namespace {
constexpr int64_t kW = cuda::kernels::kWsTokens;
}  // namespace

int64_t draft_fc_decode_zeroed_bytes(int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  return cuda::align256(taps * out_features * kW * 4) + cuda::align256(n_tiles * taps * kW * 4) +
         cuda::align256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_decode_workspace_view(void* zeroed, int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  char* z = static_cast<char*>(zeroed);
  DraftFcWorkspace ws;
  ws.acc = reinterpret_cast<float*>(z);
  z += cuda::align256(taps * out_features * kW * 4);
  ws.tile_sum_sq = reinterpret_cast<float*>(z);
  z += cuda::align256(n_tiles * taps * kW * 4);
  ws.counters = reinterpret_cast<unsigned*>(z);
  return ws;
}

int draft_fc_decode_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                         const DraftFcDecodeConfig& cfg) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (p.rows > kDraftFcDecodeMaxRows) return static_cast<int>(cudaErrorInvalidValue);
  if (cfg.bulk && draft_fc_bulk_applies(p) && draft_fc_bulk_supported())
    return draft_fc_decode_bulk_cuda(p, dtype, ws, stream, cfg.bulk_stages);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_decode<__nv_bfloat16>(p, ws, s, cfg);
    case DType::F16: return cuda::launch_decode<__half>(p, ws, s, cfg);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int draft_fc_normalize_cuda(const DraftFcParams& p, DType dtype, void* xn, void* stream) {
  if (p.rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_normalize<__nv_bfloat16>(p, xn, s);
    case DType::F16: return cuda::launch_normalize<__half>(p, xn, s);
    case DType::F32: return cuda::launch_normalize<float>(p, xn, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace e3
