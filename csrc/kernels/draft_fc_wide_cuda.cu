// The wide decode kernel of the draft fc: M = 9..64 rows (two, four or eight MMA token groups). The register kernels
// (draft_fc_cuda.cu, draft_fc_cluster_cuda.cu) load each warp's activation vectors from global memory and scale
// them by g per token group and warp, so their load and CUDA-core work grows with M and is repeated by every warp of
// every column tile; streaming more groups through them measured 1.5-3x slower than normalise + cuBLAS
// (benchmarks/NOTES.md). Here a block's 8 warps share one k range: the activations of that range are copied once
// per block into shared memory (cp.async, two stages of 256 k in flight), every warp takes its B fragments from
// there, and g multiplies the weight fragment once per chunk (round(W * g), one rounding of a product as
// round(x * g) is), so a token group costs one shared-memory load and two MMAs per weight chunk. The weights stream
// as in decode_stream (same fragment layout and k permutation, draft_fc_device.cuh). The K-splits of a 128-row
// column tile meet in the fp32 workspace, the tile's last block finishing it (decode_tile_epilogue), as in the split
// kernel. Torch-free.
#include <atomic>

#include "draft_fc_device.cuh"
#include "draft_fc_wide.h"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kWideWarps = 8;
constexpr int kWideRows = kWideWarps * 16;  // column tile: one 16-row MMA A operand per warp
constexpr int kWidePitch = static_cast<int>(kDraftFcWideMaxRows);  // workspace token slots per row
constexpr int kStageK = 256;                // k elements of one shared-memory stage: 8 chunks of 32
// Elements per token row of a stage: 576 bytes, so the two token rows one quarter-warp reads (lanes 4g..4g+7 of a
// 16-byte load) fall in opposite halves of the 32 banks: conflict-free.
constexpr int kStagePitch = kStageK + 32;
constexpr int kStageChunks = kStageK / kFcChunk;  // weight chunks per stage and warp

// One stage's shared memory: the activations [kGroups * 8 tokens][kStagePitch], then the norm weights [kStageK].
__host__ __device__ constexpr int wide_stage_elems(int groups) {
  return groups * kMmaTokens * kStagePitch + kStageK;
}
__host__ __device__ constexpr int wide_smem_bytes(int groups) { return 2 * wide_stage_elems(groups) * 2; }

struct WideTiling {
  int64_t n_tiles;
  int64_t splits_per_tap;
  int64_t k_block;  // k elements per split, a multiple of 32
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// A warp's weights for one stage: rows row_a, row_a + 8, this lane's 8 elements of each of the stage's chunks.
struct StageWeights {
  uint4 a[kStageChunks], b[kStageChunks];
};

// grid.x: 128-row column tiles; grid.y: taps x splits_per_tap. Each warp holds two stages of weights in registers:
// the next stage's loads are issued before the current stage's MMAs, so a block keeps 64 KB of weights in flight
// without a second resident block (the first form loaded half a stage at a time after the previous half's MMAs:
// 1.6x the register kernels' time at M = 8, benchmarks/NOTES.md). Shared memory: two stages (wide_stage_elems).
template <typename T, bool kNorm, int kGroups>
__global__ void __launch_bounds__(kWideWarps * 32, 1)
    draft_fc_wide_kernel(DraftFcParams p, WideTiling t, DraftFcWorkspace ws) {
  constexpr int kTok = kGroups * kMmaTokens;
  constexpr int kVecsPerRow = kStageK / 8;  // 16-byte vectors per token row of a stage
  constexpr int kStageElems = wide_stage_elems(kGroups);
  extern __shared__ uint4 wide_smem[];
  T* stages_buf = reinterpret_cast<T*>(wide_smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y / t.splits_per_tap);
  const int64_t k_begin = (blockIdx.y % t.splits_per_tap) * t.k_block;
  const int64_t k_end = k_begin + t.k_block < p.hidden ? k_begin + t.k_block : p.hidden;
  const int stages = static_cast<int>((k_end - k_begin + kStageK - 1) / kStageK);
  const T* x0 = static_cast<const T*>(p.tap(tap));
  const int64_t x_stride = p.tap_row_stride(tap);
  const T* gw = static_cast<const T*>(p.norm_weight) + tap * p.hidden;

  // Stage s's activations (and norm weights) into buffer s & 1, zeros past the range and for tokens >= M: one
  // commit group per stage.
  auto issue = [&](int s) {
    const int64_t kb = k_begin + static_cast<int64_t>(s) * kStageK;
    T* dst = stages_buf + (s & 1) * kStageElems;
    for (int i = threadIdx.x; i < kTok * kVecsPerRow; i += blockDim.x) {
      const int tok = i / kVecsPerRow, v = i % kVecsPerRow;
      const int64_t k = kb + v * 8;
      T* d = dst + tok * kStagePitch + v * 8;
      if (tok < p.rows && k < k_end) cp_async16(d, x0 + tok * x_stride + k);
      else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    if (kNorm && threadIdx.x < kVecsPerRow) {
      const int64_t k = kb + threadIdx.x * 8;
      T* d = dst + kTok * kStagePitch + threadIdx.x * 8;
      if (k < k_end) cp_async16(d, gw + k);
      else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();
  };

  const int64_t row_a = tile * kWideRows + warp * 16 + g, row_b = row_a + 8;
  const bool has_a = row_a < p.out_features, has_b = row_b < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = static_cast<const T*>(p.weight) + row_b * p.weight_row_stride + tap * p.hidden;
  float acc[kGroups][4] = {};
  float sum_sq[kGroups] = {};  // this lane's part of token warp + 8q's sum of x^2 over the block's k range

  auto load_stage = [&](StageWeights& w, int s) {
    const int64_t kb = k_begin + static_cast<int64_t>(s) * kStageK;
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      const int64_t k = kb + u * kFcChunk + 8 * c;
      const bool in = s < stages && k < k_end;
      w.a[u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      w.b[u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
    }
  };
  // Stage s: the next stage's weights into `next` first, then the MMAs of `cur` over the staged activations.
  auto run_stage = [&](StageWeights& cur, StageWeights& next, int s) {
    load_stage(next, s + 1);
    if (s + 1 < stages) {
      issue(s + 1);  // its buffer was last read in stage s - 1, before that stage's closing barrier
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage s visible to every warp
    const T* xs = stages_buf + (s & 1) * kStageElems;
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      uint4 wa = cur.a[u], wb = cur.b[u];
      if (kNorm) {
        const uint4 gv = *reinterpret_cast<const uint4*>(xs + kTok * kStagePitch + u * kFcChunk + 8 * c);
        wa = mul8<T>(wa, gv);
        wb = mul8<T>(wb, gv);
      }
      const T* xk = xs + g * kStagePitch + u * kFcChunk + 8 * c;
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        const uint4 xu = *reinterpret_cast<const uint4*>(xk + q * kMmaTokens * kStagePitch);
        Mma<T>::run(acc[q], wa.x, wb.x, wa.y, wb.y, xu.x, xu.y);
        Mma<T>::run(acc[q], wa.z, wb.z, wa.w, wb.w, xu.z, xu.w);
      }
    }
    if (kNorm) {  // warp w sums tokens w, w + 8, ...: one 16-byte vector of each per lane and stage
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + (warp + q * kMmaTokens) * kStagePitch + 8 * lane);
        add_squares8<T>(xv, sum_sq[q]);
      }
    }
    __syncthreads();  // every warp is done with buffer s & 1 before stage s + 2 is copied into it
  };

  StageWeights w0, w1;
  issue(0);
  load_stage(w0, 0);
  for (int s = 0; s < stages; s += 2) {  // two stages per trip: the register sets swap roles statically
    run_stage(w0, w1, s);
    if (s + 1 < stages) run_stage(w1, w0, s + 1);
  }

  // The block's partials into the workspace (tokens >= M hold exact zeros: their activations were zero-filled),
  // its sums of x^2 into the tile's, then the tile's counter; the last block finishes the tile.
  float* ws_acc = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWidePitch;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int t0 = q * kMmaTokens + 2 * c;
    if (t0 >= p.rows) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (has_a) atomicAdd(reinterpret_cast<float2*>(ws_acc + row_a * kWidePitch + t0), make_float2(acc[q][0], acc[q][1]));
    if (has_b) atomicAdd(reinterpret_cast<float2*>(ws_acc + row_b * kWidePitch + t0), make_float2(acc[q][2], acc[q][3]));
#else
    if (has_a) {
      atomicAdd(ws_acc + row_a * kWidePitch + t0, acc[q][0]);
      atomicAdd(ws_acc + row_a * kWidePitch + t0 + 1, acc[q][1]);
    }
    if (has_b) {
      atomicAdd(ws_acc + row_b * kWidePitch + t0, acc[q][2]);
      atomicAdd(ws_acc + row_b * kWidePitch + t0 + 1, acc[q][3]);
    }
#endif
  }
  if (kNorm) {
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      float s = sum_sq[q];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      const int tok = warp + q * kMmaTokens;
      if (lane == 0 && tok < p.rows) atomicAdd(ws.tile_sum_sq + (tile * p.taps + tap) * kWidePitch + tok, s);
    }
  }
  __shared__ unsigned last_flag;
  __syncthreads();
  const unsigned units = static_cast<unsigned>(p.taps * t.splits_per_tap);
  if (threadIdx.x == 0) last_flag = counter_add_acq_rel(ws.counters + tile, 1u) + 1u == units ? 1u : 0u;
  __syncthreads();
  if (last_flag == 0u) return;
  decode_tile_epilogue<T, kNorm, kWideRows, kWidePitch>(p, ws, tile);
}

}  // namespace kernels

namespace {
using namespace kernels;

constexpr int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }
int64_t wide_n_tiles(int64_t out_features) { return (out_features + kWideRows - 1) / kWideRows; }

// K-splits per tap by a cost model of one SM's share (one resident block): its blocks (the busiest SM's count,
// blocks spread evenly) x (the block's weight row length + its partial sums, 4M elements' worth of atomics, + a
// fixed 3 stages for the first stage's wait and the block's start and end). N = 896, K = 3, M = 64 on 132 SMs: 6
// splits (126 blocks, one per SM); N = 7168: 3 (504 blocks).
WideTiling wide_tiling(int taps, int64_t hidden, int64_t out_features, int64_t rows) {
  WideTiling best{wide_n_tiles(out_features), 1, 0};
  const int64_t sms = sm_count();
  int64_t best_cost = -1;
  const int64_t max_splits = (hidden + kFcChunk - 1) / kFcChunk;
  for (int64_t s = 1; s <= max_splits && s <= 64; ++s) {
    const int64_t per = (hidden + s - 1) / s;
    const int64_t k_block = (per + kFcChunk - 1) / kFcChunk * kFcChunk;
    const int64_t splits = (hidden + k_block - 1) / k_block;
    const int64_t blocks = best.n_tiles * taps * splits;
    const int64_t per_sm = (blocks + sms - 1) / sms;
    const int64_t cost = per_sm * (k_block + 4 * rows + 3 * kStageK);
    if (best_cost >= 0 && cost >= best_cost) continue;
    best_cost = cost;
    best.splits_per_tap = splits;
    best.k_block = k_block;
  }
  return best;
}

// Dynamic shared memory above 48 KB needs the kernel's opt-in, once per device.
template <typename T, bool kNorm, int kGroups>
cudaError_t opt_in_shared_memory() {
  constexpr int kBytes = wide_smem_bytes(kGroups);
  if (kBytes <= 48 * 1024) return cudaSuccess;
  constexpr int kDevices = 64;
  static std::atomic<bool> done[kDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const bool cached = dev >= 0 && dev < kDevices;
  if (cached && done[dev].load(std::memory_order_relaxed)) return cudaSuccess;
  err = cudaFuncSetAttribute(draft_fc_wide_kernel<T, kNorm, kGroups>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kBytes);
  if (err == cudaSuccess && cached) done[dev].store(true, std::memory_order_relaxed);
  return err;
}

template <typename T, bool kNorm, int kGroups>
cudaError_t launch_wide(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s) {
  const cudaError_t opted = opt_in_shared_memory<T, kNorm, kGroups>();
  if (opted != cudaSuccess) return opted;
  const WideTiling t = wide_tiling(p.taps, p.hidden, p.out_features, p.rows);
  const dim3 grid(static_cast<unsigned>(t.n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  draft_fc_wide_kernel<T, kNorm, kGroups><<<grid, kWideWarps * 32, wide_smem_bytes(kGroups), s>>>(p, t, ws);
  return cudaGetLastError();
}

template <typename T, bool kNorm>
cudaError_t launch_wide_groups(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s) {
  if (p.rows <= 2 * kMmaTokens) return launch_wide<T, kNorm, 2>(p, ws, s);
  if (p.rows <= 4 * kMmaTokens) return launch_wide<T, kNorm, 4>(p, ws, s);
  return launch_wide<T, kNorm, 8>(p, ws, s);
}

template <typename T>
cudaError_t launch_wide_typed(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s) {
  return p.norm_weight != nullptr ? launch_wide_groups<T, true>(p, ws, s) : launch_wide_groups<T, false>(p, ws, s);
}

}  // namespace
}  // namespace cuda

int64_t draft_fc_wide_zeroed_bytes(int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::wide_n_tiles(out_features);
  constexpr int64_t kP = cuda::kernels::kWidePitch;
  return cuda::align256(taps * out_features * kP * 4) + cuda::align256(n_tiles * taps * kP * 4) +
         cuda::align256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_wide_workspace_view(void* zeroed, int taps, int64_t out_features) {
  const int64_t n_tiles = cuda::wide_n_tiles(out_features);
  constexpr int64_t kP = cuda::kernels::kWidePitch;
  char* z = static_cast<char*>(zeroed);
  DraftFcWorkspace ws;
  ws.acc = reinterpret_cast<float*>(z);
  z += cuda::align256(taps * out_features * kP * 4);
  ws.tile_sum_sq = reinterpret_cast<float*>(z);
  z += cuda::align256(n_tiles * taps * kP * 4);
  ws.counters = reinterpret_cast<unsigned*>(z);
  return ws;
}

int draft_fc_decode_wide_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (p.rows > kDraftFcWideMaxRows) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_wide_typed<__nv_bfloat16>(p, ws, s);
    case DType::F16: return cuda::launch_wide_typed<__half>(p, ws, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace e3
