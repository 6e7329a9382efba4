// The cluster decode kernel of the draft fc: the split-K weight stream of the register kernel (decode_stream in
// draft_fc_device.cuh) with the K-splits of one column tile in one thread-block cluster (sm_90 and later), so the
// partial sums meet in distributed shared memory instead of an fp32 workspace in L2: no atomics, no fence, no
// counter, no workspace to re-zero, and a fixed summation order (deterministic results). The split-K kernel's
// tail is three dependent L2 round trips (the release fence, the counter, the epilogue's loads); here every block
// but the cluster's leader pushes its partial into the leader's shared memory (st.async, counted on the leader's
// mbarrier) and leaves, and the leader writes the tile. Torch-free.
//
// Layout: grid (n_tiles, taps * splits_per_tap), one cluster per column tile along y, so a cluster holds every
// (tap, split) of its tile; at most 8 blocks (the portable cluster size), hence taps * splits_per_tap <= 8. A block
// is 4 warps: row_groups groups of 16 weight rows (the tile: 16 x row_groups rows), the 4 / row_groups warps of a
// group splitting the block's k range. Small N takes row_groups = 1 and two splits per tap (N = 896, K = 3: 56 tiles
// x 6 = 336 blocks); large N row_groups = 4 and one split (N = 7168: 112 x 3 = 336), the split kernel's grid
// without its workspace.
#include <cooperative_groups.h>

#include <atomic>

#include "draft_fc_cluster.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kMaxCluster = 8;

// Resident blocks per SM and weight chunks per warp step of the cluster kernel. One token group: 3 blocks (168
// registers a thread), so 7 chunks with the norm, 10 without: its grids at the sizes it serves (N <= 1792 at K = 3)
// fill under 3 blocks per SM anyway, and the stream is latency-bound, so fewer, larger load rounds per warp (N=896:
// 4 rounds of 224 instead of 5 of 192). Two groups: the split kernel's budget.
__host__ __device__ constexpr int cluster_blocks_per_sm(int groups) {
  return groups == 1 ? 3 : decode_blocks_per_sm(2);
}
__host__ __device__ constexpr int cluster_unroll(bool norm, int groups) {
  return groups == 1 ? (norm ? 7 : 10) : decode_unroll(norm, groups);
}

struct ClusterTiling {
  int row_groups;       // 16-row groups per block (1, 2 or 4)
  int64_t n_tiles;      // ceil(N / (16 row_groups))
  int splits_per_tap;   // blocks per tap in a cluster
  int64_t k_block;      // k elements per block (within its tap)
  int64_t k_warp;       // k elements per warp: k_block / (4 / row_groups), whole warp steps
};

// Cluster-scope pieces of the tail (sm_90+): the leader's inbox barrier and the asynchronous stores into it.
// This CTA's shared-memory address `a` as seen at the same offset in cluster rank `rank`.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
// Stores into another CTA's shared memory that count their bytes on that CTA's mbarrier when they land.
__device__ __forceinline__ void st_async4(uint32_t remote, float4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(remote), "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ void st_async1(uint32_t remote, float v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(remote), "r"(__float_as_uint(v)), "r"(remote_bar) : "memory");
}

// Floats of the leader's inbox: every block's partial of the tile (16 x row_groups rows x kTok token slots), then
// with the norm every block's sums of x^2 (kTok); the launch's dynamic shared memory.
__host__ __device__ constexpr int64_t cluster_inbox_floats(int blocks, int row_groups, int tok, bool norm) {
  return static_cast<int64_t>(blocks) * (16 * row_groups * tok + (norm ? tok : 0));
}

// Every block streams its (tap, k range) and sums its warps' fragments in shared memory. The block of cluster rank 0
// (the leader) keeps its sums; every other block stores them into the leader's inbox with st.async, whose bytes
// count down the leader's mbarrier, and leaves. The leader waits for the bytes, then finishes the tile's outputs
// (fixed summation order: deterministic). One cluster barrier (its arrive at entry, its wait before the first
// remote store, so it is off the critical path) publishes the leader's mbarrier; no barrier at the end, since no
// block reads another's shared memory (the leader pulling the partials from the others' shared memory would need
// two full cluster barriers, both on the critical path).
template <typename T, bool kNorm, int kGroups>
__global__ void __launch_bounds__(kFcWarps * 32, cluster_blocks_per_sm(kGroups))
    draft_fc_decode_cluster_kernel(DraftFcParams p, ClusterTiling t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kTok = kGroups * kMmaTokens;  // token slots of a partial
  __shared__ float warp_part[kFcWarps][16][kTok];  // each warp's MMA fragments
  __shared__ float warp_sq[kFcWarps][kTok];        // each counting warp's sums of x^2 per token
  __shared__ alignas(8) uint64_t inbox_full;       // the leader's: completes when every other block's bytes landed
  extern __shared__ float4 inbox4[];               // the leader's: cluster_inbox_floats(...)
  float* inbox = reinterpret_cast<float*>(inbox4);
  cg::cluster_group cluster = cg::this_cluster();
  const int row_groups = t.row_groups;
  const int tile_rows = 16 * row_groups;
  {
    const int rank = static_cast<int>(cluster.block_rank());
    const int blocks = static_cast<int>(cluster.num_blocks());
    if (rank == 0 && threadIdx.x == 0) {
      const uint32_t bar = smem_u32(&inbox_full);
      const uint32_t bytes =
          static_cast<uint32_t>(cluster_inbox_floats(blocks - 1, row_groups, kTok, kNorm) * sizeof(float));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
  float acc[kGroups][4] = {};
  float sum_sq[kGroups] = {};
  {
    const int rank = static_cast<int>(cluster.block_rank());
    const int warp = threadIdx.x >> 5, group = warp % row_groups, sub = warp / row_groups;
    const int tap = rank / t.splits_per_tap;
    const int64_t k_split = (rank % t.splits_per_tap) * t.k_block;
    const int64_t k_begin = k_split + sub * t.k_warp;
    int64_t k_end = k_begin + t.k_warp;
    if (k_end > k_split + t.k_block) k_end = k_split + t.k_block;
    if (k_end > p.hidden) k_end = p.hidden;
    const int64_t row_a = blockIdx.x * static_cast<int64_t>(tile_rows) + group * 16 + ((threadIdx.x & 31) >> 2);
    // The warps of group 0 count x^2: together they cover the block's k range once.
    decode_stream<T, kNorm, kGroups, cluster_unroll(kNorm, kGroups)>(p, tap, row_a, k_begin, k_end,
                                                                     kNorm && group == 0, acc, sum_sq);
  }
  // Indices again after the stream rather than live across it (registers for the loads).
  const int rank = static_cast<int>(cluster.block_rank());
  const int blocks = static_cast<int>(cluster.num_blocks());  // taps * splits_per_tap
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int group = warp % row_groups;

#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int t0 = q * kMmaTokens + 2 * c;
    warp_part[warp][g][t0] = acc[q][0];
    warp_part[warp][g][t0 + 1] = acc[q][1];
    warp_part[warp][g + 8][t0] = acc[q][2];
    warp_part[warp][g + 8][t0 + 1] = acc[q][3];
    if (kNorm && group == 0) {
      const float s = quad_sum(sum_sq[q]);
      if (c == 0) warp_sq[warp][q * kMmaTokens + g] = s;
    }
  }
  __syncthreads();
  // This block's partial of the tile, summed over its warps' k sub-ranges in a fixed order, 4 token slots a thread:
  // part[r][tok] at inbox[rank][r][tok], sums of x^2 at the inbox's sq[rank][tok]. The leader's stay local.
  const int subs = kFcWarps / row_groups;
  const int part_floats = tile_rows * kTok;
  float* sq_base = inbox + static_cast<int64_t>(blocks) * part_floats;
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // the leader's mbarrier is initialised
  const uint32_t bar = map_to_rank(smem_u32(&inbox_full), 0);
  for (int i = threadIdx.x; i < part_floats / 4; i += blockDim.x) {
    const int r = (4 * i) / kTok, tok = (4 * i) % kTok;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < subs; ++s) {
      const float* w = &warp_part[s * row_groups + r / 16][r % 16][tok];
      v.x += w[0];
      v.y += w[1];
      v.z += w[2];
      v.w += w[3];
    }
    float4* dst = reinterpret_cast<float4*>(inbox + static_cast<int64_t>(rank) * part_floats) + i;
    if (rank == 0) *dst = v;
    else st_async4(map_to_rank(smem_u32(dst), 0), v, bar);
  }
  if (kNorm && threadIdx.x < kTok) {
    float v = 0.f;
    for (int s = 0; s < subs; ++s) v += warp_sq[s * row_groups][threadIdx.x];
    float* dst = sq_base + rank * kTok + threadIdx.x;
    if (rank == 0) *dst = v;
    else st_async1(map_to_rank(smem_u32(dst), 0), v, bar);
  }
  if (rank != 0) return;  // nothing reads this block's shared memory

  // The leader: every other block's bytes, then the tile's outputs, item = (row, token) for tokens < M.
  {
    const uint32_t local_bar = smem_u32(&inbox_full);
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(local_bar)
          : "memory");
    }
  }
  __syncthreads();  // the leader's own sums, written by other threads
  const int64_t tile_row0 = blockIdx.x * static_cast<int64_t>(tile_rows);
  const int64_t left = p.out_features - tile_row0;
  const int rows_here = static_cast<int>(left < tile_rows ? left : tile_rows);
  const int items = rows_here * static_cast<int>(p.rows);
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  const float inv_h = 1.0f / static_cast<float>(p.hidden);
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    const int r = i / static_cast<int>(p.rows), tok = i % static_cast<int>(p.rows);
    float y = bias != nullptr ? to_f(bias[tile_row0 + r]) : 0.f;
    for (int b0 = 0; b0 < blocks; b0 += t.splits_per_tap) {  // b0: the first block of a tap
      float d = 0.f, q = 0.f;
      for (int s = 0; s < t.splits_per_tap; ++s) {
        d += inbox[static_cast<int64_t>(b0 + s) * part_floats + r * kTok + tok];
        if (kNorm) q += sq_base[(b0 + s) * kTok + tok];
      }
      y += kNorm ? rsqrtf(q * inv_h + p.eps) * d : d;
    }
    out[tok * p.out_row_stride + tile_row0 + r] = from_f<T>(y);
  }
#else
  __trap();  // launched only on sm_90 and later (draft_fc_cluster_supported)
#endif
}

}  // namespace kernels

namespace {
using namespace kernels;

// Clusters of `size` blocks of this kernel that the current device holds at once. A cluster's blocks share one GPC,
// so this is the GPCs' count, not SMs / size: on the H200, K = 1 with 7 splits (clusters of 7, 392 blocks against
// 396 block slots) took two waves and ran 27% slower than the split kernel (docs/performance.md). Cached per device
// and size (0 included: no cluster of that size fits, e.g. its blocks exceed a GPC); -1 when the runtime cannot say
// (then the block slots alone bound the shape, and a launch the device refuses falls back to the split kernel).
template <typename T, bool kNorm, int kGroups>
int max_active_clusters(int size) {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices][kMaxCluster + 1];  // the answer + 1; zero: not asked yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices || size < 1 || size > kMaxCluster) {
    (void)cudaGetLastError();
    return -1;
  }
  const int known = cache[dev][size].load(std::memory_order_relaxed);
  if (known > 0) return known - 1;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(1, static_cast<unsigned>(size));
  lc.blockDim = dim3(kFcWarps * 32);
  // The largest inbox a cluster of this size takes (64-row tiles); the registers bound residency long before it.
  lc.dynamicSmemBytes =
      static_cast<size_t>(cluster_inbox_floats(size, kFcWarps, kGroups * kMmaTokens, kNorm) * sizeof(float));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(size);
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, draft_fc_decode_cluster_kernel<T, kNorm, kGroups>, &lc) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  cache[dev][size].store(n + 1, std::memory_order_relaxed);
  return n;
}

// The cluster shape: as many blocks as one wave holds (at most `slots` blocks and `clusters(size)` clusters of each
// size), each cluster <= 8 blocks; on a tie, more rows per block (fewer activation re-reads). When no shape fits one
// wave, the fewest blocks. `fits` says which it was. Sizes of which the device holds no cluster at all are never
// chosen; *runnable is false when that leaves none.
template <typename Clusters>
ClusterTiling cluster_tiling(int taps, int64_t hidden, int64_t out_features, int64_t slots, int unroll,
                             Clusters clusters, bool* fits_one_wave, bool* runnable) {
  ClusterTiling best{};
  int64_t best_blocks = -1;
  bool best_fits = false;
  for (int row_groups : {1, 2, 4}) {
    for (int splits = 1; splits * taps <= kMaxCluster; ++splits) {
      const int64_t n_tiles = (out_features + 16 * row_groups - 1) / (16 * row_groups);
      const int64_t blocks = n_tiles * taps * splits;
      const int max_clusters = clusters(taps * splits);  // co-resident clusters of this size; -1: unknown
      if (max_clusters == 0) continue;
      const bool fits = blocks <= slots && (max_clusters < 0 || n_tiles <= max_clusters);
      const bool better = best_blocks < 0 || (fits && !best_fits) || (fits && blocks >= best_blocks) ||
                          (!fits && !best_fits && blocks < best_blocks);
      if (!better) continue;
      best = ClusterTiling{row_groups, n_tiles, splits, 0, 0};
      best_blocks = blocks;
      best_fits = fits;
    }
  }
  *runnable = best_blocks >= 0;
  if (!*runnable) return best;
  // k per warp: the tap's k range over splits * (4 / row_groups) warps, in whole warp steps (a nearly empty last step
  // costs a DRAM round trip for a few bytes); the last warps of a tap may get less.
  const int64_t step = static_cast<int64_t>(kFcChunk) * unroll;
  const int64_t warps_per_tap = static_cast<int64_t>(best.splits_per_tap) * (kFcWarps / best.row_groups);
  best.k_warp = ((hidden + warps_per_tap - 1) / warps_per_tap + step - 1) / step * step;
  best.k_block = best.k_warp * (kFcWarps / best.row_groups);
  if (fits_one_wave != nullptr) *fits_one_wave = best_fits;
  return best;
}

// Tiles the call once; with only_one_wave, launches only if the grid fits one wave. *launched says whether it did.
// cudaErrorLaunchOutOfResources without launching when the device holds no cluster of any usable size (occupancy
// 0), so the dispatch falls back to the split kernel.
template <typename T, bool kNorm, int kGroups>
cudaError_t launch_cluster(const DraftFcParams& p, cudaStream_t s, const DraftFcDecodeConfig& cfg, bool only_one_wave,
                           bool* launched) {
  const int blocks_per_sm = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : cluster_blocks_per_sm(kGroups);
  const int64_t slots = static_cast<int64_t>(blocks_per_sm) * sm_count();
  bool fits = false, runnable = false;
  const ClusterTiling t = cluster_tiling(p.taps, p.hidden, p.out_features, slots, cluster_unroll(kNorm, kGroups),
                                         max_active_clusters<T, kNorm, kGroups>, &fits, &runnable);
  if (!runnable) return cudaErrorLaunchOutOfResources;
  *launched = !only_one_wave || fits;
  if (!*launched) return cudaSuccess;
  const unsigned cluster = static_cast<unsigned>(p.taps * t.splits_per_tap);
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(t.n_tiles), cluster);
  lc.blockDim = dim3(kFcWarps * 32);
  lc.dynamicSmemBytes = static_cast<size_t>(
      cluster_inbox_floats(static_cast<int>(cluster), t.row_groups, kGroups * kMmaTokens, kNorm) * sizeof(float));
  lc.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = cluster;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&lc, draft_fc_decode_cluster_kernel<T, kNorm, kGroups>, p, t);
  if (e != cudaSuccess) *launched = false;
  return e;
}

template <typename T>
cudaError_t launch_cluster_typed(const DraftFcParams& p, cudaStream_t s, const DraftFcDecodeConfig& cfg,
                                 bool only_one_wave, bool* launched) {
  return with_norm_and_groups(p, [&](auto norm, auto groups) {
    return launch_cluster<T, decltype(norm)::value, decltype(groups)::value>(p, s, cfg, only_one_wave, launched);
  });
}

}  // namespace
}  // namespace cuda

int64_t draft_fc_cluster_dynamic_smem_bytes(int cluster_blocks, int row_groups, int groups, bool norm) {
  return cuda::kernels::cluster_inbox_floats(cluster_blocks, row_groups, groups * cuda::kernels::kMmaTokens, norm) *
         static_cast<int64_t>(sizeof(float));
}

bool draft_fc_cluster_supported() {
  return cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9 &&
         cuda::current_device_attribute(cudaDevAttrClusterLaunch, 0) != 0;
}

bool draft_fc_cluster_applies(const DraftFcParams& p) {
  return p.taps <= cuda::kernels::kMaxCluster && p.rows <= kDraftFcDecodeMaxRows &&
         p.out_features < (int64_t(1) << 31);
}

int draft_fc_decode_cluster_cuda(const DraftFcParams& p, DType dtype, void* stream, const DraftFcDecodeConfig& cfg,
                                 bool only_one_wave, bool* launched) {
  bool ran = false;
  if (launched == nullptr) launched = &ran;
  *launched = false;
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_cluster_applies(p)) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_cluster_typed<__nv_bfloat16>(p, s, cfg, only_one_wave, launched);
    case DType::F16: return cuda::launch_cluster_typed<__half>(p, s, cfg, only_one_wave, launched);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace e3
