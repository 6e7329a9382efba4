// The cluster decode kernel of the draft fc: the split-K weight stream of the register kernel (decode_stream in
// draft_fc_device.cuh) with the K-splits of one column tile in one thread-block cluster (sm_90 and later), so the
// partial sums meet in distributed shared memory instead of an fp32 workspace in L2: no atomics, no fence, no
// counter, no workspace to re-zero, and a fixed summation order (deterministic results). The split-K kernel's
// tail is three dependent L2 round trips (the release fence, the counter, the epilogue's loads); here it is two
// cluster barriers and reads of the neighbours' shared memory. Torch-free.
//
// Layout: grid (n_tiles, taps * splits_per_tap), one cluster per column tile along y, so a cluster holds every
// (tap, split) of its tile; at most 8 blocks (the portable cluster size), hence taps * splits_per_tap <= 8. A block
// is 4 warps: R groups of 16 weight rows (the tile: 16 R rows), the 4 / R warps of a group splitting the block's k
// range. Small N takes R = 1 and two splits per tap (N = 896, K = 3: 56 tiles x 6 = 336 blocks); large N R = 4 and
// one split (N = 7168: 112 x 3 = 336), the register kernel's grid without its workspace.
#include <cooperative_groups.h>

#include "draft_fc_cluster.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kMaxCluster = 8;

struct ClusterTiling {
  int row_groups;       // R: 16-row groups per block (1, 2 or 4)
  int64_t n_tiles;      // ceil(N / (16 R))
  int splits_per_tap;   // blocks per tap in a cluster
  int64_t k_block;      // k elements per block (within its tap)
  int64_t k_warp;       // k elements per warp: k_block / (4 / R), whole warp steps
};

// The end of both cluster kernels, run by every thread: each warp's MMA fragments (acc: rows 16 * (warp % R) + g and
// + 8, tokens 8q + 2c and + 1) summed over the block's k sub-ranges in shared memory (and, given warp_sq, the
// counting warps' sums of x^2 into block_sq), a cluster barrier, then each block of the cluster finishes a share of
// the tile's (row, token) outputs from every block's partials and sums of squares; a last cluster barrier keeps
// every block's shared memory alive until its neighbours have read it.
template <typename T, bool kNorm, int kGroups>
__device__ __forceinline__ void cluster_finish(const DraftFcParams& p, const ClusterTiling& t,
                                               const float (&acc)[kGroups][4], const float* warp_sq,
                                               float* block_sq) {
  namespace cg = cooperative_groups;
  constexpr int kTok = kGroups * kMmaTokens;  // token slots of a partial
  __shared__ float warp_part[kFcWarps][16][kTok];      // each warp's MMA fragments
  __shared__ float block_part[kFcRowsPerBlock][kTok];  // this block's partial of the tile: 16 R rows
  cg::cluster_group cluster = cg::this_cluster();
  const int R = t.row_groups;
  const int rank = static_cast<int>(cluster.block_rank());
  const int blocks = static_cast<int>(cluster.num_blocks());  // taps * splits_per_tap
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile_row0 = blockIdx.x * static_cast<int64_t>(16 * R);
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int t0 = q * kMmaTokens + 2 * c;
    warp_part[warp][g][t0] = acc[q][0];
    warp_part[warp][g][t0 + 1] = acc[q][1];
    warp_part[warp][g + 8][t0] = acc[q][2];
    warp_part[warp][g + 8][t0 + 1] = acc[q][3];
  }
  __syncthreads();
  const int subs = kFcWarps / R;
  for (int i = threadIdx.x; i < 16 * R * kTok; i += blockDim.x) {  // sum the k sub-ranges, fixed order
    const int r = i / kTok, tok = i % kTok;
    float v = 0.f;
    for (int s = 0; s < subs; ++s) v += warp_part[s * R + r / 16][r % 16][tok];
    block_part[r][tok] = v;
  }
  if (kNorm && warp_sq != nullptr && threadIdx.x < kTok) {  // warp_sq: [kFcWarps][kTok], the warps of group 0
    float v = 0.f;
    for (int s = 0; s < subs; ++s) v += warp_sq[s * R * kTok + threadIdx.x];
    block_sq[threadIdx.x] = v;
  }
  cluster.sync();  // every block's partials written (release) and visible (acquire)

  // The tile's outputs, shared among the cluster's blocks: item = (row, token) for tokens < M.
  const int64_t left = p.out_features - tile_row0;
  const int rows_here = static_cast<int>(left < 16 * R ? left : 16 * R);
  const int items = rows_here * static_cast<int>(p.rows);
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  const float inv_h = 1.0f / static_cast<float>(p.hidden);
  for (int i = rank * blockDim.x + threadIdx.x; i < items; i += blocks * blockDim.x) {
    const int r = i / static_cast<int>(p.rows), tok = i % static_cast<int>(p.rows);
    const int64_t n = tile_row0 + r;
    // Every block's partial (and sum of squares) first, all reads in flight at once; then the fixed-order sum.
    float dot[kMaxCluster], sq[kMaxCluster];
#pragma unroll
    for (int b = 0; b < kMaxCluster; ++b) {
      if (b < blocks) {
        dot[b] = cluster.map_shared_rank(&block_part[0][0], b)[r * kTok + tok];
        if (kNorm) sq[b] = cluster.map_shared_rank(block_sq, b)[tok];
      }
    }
    float y = bias != nullptr ? to_f(bias[n]) : 0.f;
#pragma unroll
    for (int b0 = 0; b0 < kMaxCluster; b0 += 1) {  // b0: the first block of a tap
      if (b0 >= blocks || b0 % t.splits_per_tap != 0) continue;
      float d = 0.f, q = 0.f;
#pragma unroll
      for (int s = 0; s < kMaxCluster; ++s) {
        if (s < t.splits_per_tap && b0 + s < kMaxCluster) {
          d += dot[b0 + s];
          if (kNorm) q += sq[b0 + s];
        }
      }
      y += kNorm ? rsqrtf(q * inv_h + p.eps) * d : d;
    }
    out[tok * p.out_row_stride + n] = from_f<T>(y);
  }
  cluster.sync();  // no block leaves (its shared memory) while a neighbour may still read it
}

// This warp's k range: sub-range `sub` of the block's split of its tap, [k_begin, k_end).
__device__ __forceinline__ void cluster_warp_range(const DraftFcParams& p, const ClusterTiling& t, int rank, int sub,
                                                   int64_t& k_begin, int64_t& k_end) {
  const int64_t k_split = (rank % t.splits_per_tap) * t.k_block;
  k_begin = k_split + sub * t.k_warp;
  k_end = k_begin + t.k_warp;
  if (k_end > k_split + t.k_block) k_end = k_split + t.k_block;
  if (k_end > p.hidden) k_end = p.hidden;
}

// The register form: each warp streams its rows and sub-range with the activations loaded beside the weights
// (decode_stream). Serves two token groups (M = 9..16), whose activations would not fit shared memory.
template <typename T, bool kNorm, int kGroups>
__global__ void __launch_bounds__(kFcWarps * 32, decode_blocks_per_sm(kGroups))
    draft_fc_decode_cluster_kernel(DraftFcParams p, ClusterTiling t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kTok = kGroups * kMmaTokens;
  __shared__ float warp_sq[kFcWarps][kTok];  // each counting warp's sums of x^2 per token
  __shared__ float block_sq[kTok];           // this block's sums of x^2 (its tap, its k range)
  const int R = t.row_groups;
  const int warp = threadIdx.x >> 5, group = warp % R;
  float acc[kGroups][4] = {};
  float sum_sq[kGroups] = {};
  {
    const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
    int64_t k_begin, k_end;
    cluster_warp_range(p, t, rank, warp / R, k_begin, k_end);
    const int64_t row_a = blockIdx.x * static_cast<int64_t>(16 * R) + group * 16 + ((threadIdx.x & 31) >> 2);
    // The warps of group 0 count x^2: together they cover the block's k range once.
    decode_stream<T, kNorm, kGroups>(p, rank / t.splits_per_tap, row_a, k_begin, k_end, kNorm && group == 0, acc,
                                     sum_sq);
  }
  if (kNorm && group == 0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      float s = sum_sq[q];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if ((lane & 3) == 0) warp_sq[warp][q * kMmaTokens + (lane >> 2)] = s;
    }
  }
  cluster_finish<T, kNorm, kGroups>(p, t, acc, &warp_sq[0][0], block_sq);
#else
  __trap();  // launched only on sm_90 and later (draft_fc_cluster_supported)
#endif
}

// The shared-memory form (one token group, M <= 8): the block first stages x * g of its k range for every token in
// shared memory (copied asynchronously, then scaled in place as the register form rounds it; per-token sums of x^2
// on the way), so a thread's registers hold only weights: kSmemUnroll chunks a step, 2.3x the register form's bytes in flight, hence fewer dependent DRAM
// round trips per warp (the Nsight profile of the register form: 53% of DRAM bandwidth, latency-bound). The first
// step's weight loads are issued before the staging, so its latency hides them.
// Weight chunks per step: 112 registers of weights out of 168 (3 blocks per SM). ptxas spills the staging's
// registers at 14 on sm_100a and sm_120a, hence 12 there. Device code only (the host side never needs it).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
constexpr int kSmemUnroll = 12;
#else
constexpr int kSmemUnroll = 14;
#endif
constexpr int kSmemBlocksPerSm = 3;

// Token rows of the staging buffer: k_block (a multiple of 32) elements, padded so consecutive rows start 64 bytes
// apart modulo 128: the 8 rows x 64 bytes a warp reads per chunk then take 4 shared-memory wavefronts, the minimum.
__host__ __device__ constexpr int64_t smem_pitch(int64_t k_block) { return k_block + (k_block % 64 == 0 ? 32 : 0); }

// 16 bytes global -> shared without registers (cp.async, L2 only: the activations are read once per block).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}

template <typename T, bool kNorm>
__global__ void __launch_bounds__(kFcWarps * 32, kSmemBlocksPerSm)
    draft_fc_decode_cluster_smem_kernel(DraftFcParams p, ClusterTiling t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);  // [M][pitch]: x * g of this block's k range, then [pitch]: g
  __shared__ float block_sq[kMmaTokens];
  const int R = t.row_groups;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const int tap = rank / t.splits_per_tap;
  const int64_t kb0 = (rank % t.splits_per_tap) * t.k_block;
  const int64_t kb1 = kb0 + t.k_block < p.hidden ? kb0 + t.k_block : p.hidden;
  const int64_t pitch = smem_pitch(t.k_block);
  int64_t k_begin, k_end;
  cluster_warp_range(p, t, rank, warp / R, k_begin, k_end);
  const int64_t row_a = blockIdx.x * static_cast<int64_t>(16 * R) + (warp % R) * 16 + g;
  const bool has_a = row_a < p.out_features, has_b = row_a + 8 < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = w_a + 8 * p.weight_row_stride;

  constexpr int U = kSmemUnroll;
  uint4 wa[U], wb[U];
  auto issue = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * kFcChunk + 8 * c;  // this lane's 8 contiguous elements
      const bool in = k < k_end;
      wa[u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      wb[u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
    }
  };
  issue(k_begin);

  // Stage x (and g) of [kb0, kb1) for tokens < M with asynchronous copies: every copy in flight at once and no
  // registers held (loads into registers, four tokens at a time beside the weights, made the staging a chain of
  // DRAM round trips: 3-6 us). Then x * g in place, rounded as the register form rounds it, and each token's sum
  // of x^2 over the range.
  const int M = static_cast<int>(p.rows);
  T* gs = xs + M * pitch;  // the norm weights' row, after the tokens'
  {
    const T* x = static_cast<const T*>(p.tap(tap));
    const int64_t xstride = p.tap_row_stride(tap);
    const T* gw = static_cast<const T*>(p.norm_weight) + tap * p.hidden;
    for (int64_t k = kb0 + 8 * static_cast<int64_t>(threadIdx.x); k < kb1; k += 8 * blockDim.x) {
      for (int m = 0; m < M; ++m) cp_async16(xs + m * pitch + (k - kb0), x + m * xstride + k);
      if (kNorm) cp_async16(gs + (k - kb0), gw + k);
    }
    asm volatile("cp.async.commit_group;\n" "cp.async.wait_group 0;\n" ::: "memory");
  }
  if (threadIdx.x < kMmaTokens) block_sq[threadIdx.x] = 0.f;
  __syncthreads();
  if (kNorm) {
    float ss[kMmaTokens] = {};
    for (int64_t v = 8 * static_cast<int64_t>(threadIdx.x); v < kb1 - kb0; v += 8 * blockDim.x) {
      const uint4 gv = *reinterpret_cast<const uint4*>(gs + v);
#pragma unroll
      for (int m = 0; m < kMmaTokens; ++m) {
        if (m < M) {
          uint4* px = reinterpret_cast<uint4*>(xs + m * pitch + v);
          *px = scale8<T>(*px, gv, ss[m], true);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kMmaTokens; ++m) {
      if (m < M) {
        float sm = ss[m];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sm += __shfl_xor_sync(0xffffffffu, sm, o);
        if (lane == 0) atomicAdd(block_sq + m, sm);
      }
    }
    __syncthreads();
  }

  float acc[1][4] = {};
  const bool has_x = g < p.rows;
  const T* xrow = xs + (has_x ? g : 0) * pitch - kb0;  // indexed by k within the tap
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kFcChunk * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * kFcChunk + 8 * c;
      const uint4 xu = k < k_end && has_x ? *reinterpret_cast<const uint4*>(xrow + k) : make_uint4(0, 0, 0, 0);
      // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of the weight and activation vectors.
      Mma<T>::run(acc[0], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xu.x, xu.y);
      Mma<T>::run(acc[0], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xu.z, xu.w);
    }
    if (k0 + kFcChunk * U < k_end) issue(k0 + kFcChunk * U);
  }
  cluster_finish<T, kNorm, 1>(p, t, acc, nullptr, block_sq);
#else
  __trap();  // launched only on sm_90 and later (draft_fc_cluster_supported)
#endif
}

}  // namespace kernels

namespace {
using namespace kernels;

// The cluster shape: as many blocks as one wave holds (`slots`), each cluster <= 8 blocks; on a tie, more rows per
// block (fewer activation re-reads). When no shape fits one wave, the fewest blocks.
ClusterTiling cluster_tiling(int taps, int64_t hidden, int64_t out_features, int64_t slots, int unroll) {
  ClusterTiling best{};
  int64_t best_blocks = -1;
  bool best_fits = false;
  for (int R : {1, 2, 4}) {
    for (int spt = 1; spt * taps <= kMaxCluster; ++spt) {
      const int64_t n_tiles = (out_features + 16 * R - 1) / (16 * R);
      const int64_t blocks = n_tiles * taps * spt;
      const bool fits = blocks <= slots;
      const bool better = best_blocks < 0 || (fits && !best_fits) || (fits && blocks >= best_blocks) ||
                          (!fits && !best_fits && blocks < best_blocks);
      if (!better) continue;
      best = ClusterTiling{R, n_tiles, spt, 0, 0};
      best_blocks = blocks;
      best_fits = fits;
    }
  }
  // k per warp: the tap's k range over splits * (4 / R) warps, in whole warp steps (a nearly empty last step costs
  // a DRAM round trip for a few bytes); the last warps of a tap may get less.
  const int64_t step = static_cast<int64_t>(kFcChunk) * unroll;
  const int64_t warps_per_tap = static_cast<int64_t>(best.splits_per_tap) * (kFcWarps / best.row_groups);
  best.k_warp = ((hidden + warps_per_tap - 1) / warps_per_tap + step - 1) / step * step;
  best.k_block = best.k_warp * (kFcWarps / best.row_groups);
  return best;
}

cudaLaunchConfig_t cluster_launch_config(const ClusterTiling& t, int taps, size_t smem, cudaStream_t s,
                                         cudaLaunchAttribute* attr) {
  const unsigned cluster = static_cast<unsigned>(taps * t.splits_per_tap);
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(t.n_tiles), cluster);
  lc.blockDim = dim3(kFcWarps * 32);
  lc.dynamicSmemBytes = smem;
  lc.stream = s;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = cluster;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = 1;
  return lc;
}

// The shared-memory form's launch plan: its tiling and staging bytes, and whether the grid is one wave at the
// occupancy those bytes allow (on an sm_120 card, ~100 KB of shared memory per SM, M = 8 may not be).
struct SmemPlan {
  ClusterTiling t;
  size_t smem;
  bool ok;
};

template <typename T, bool kNorm>
SmemPlan smem_plan(const DraftFcParams& p, const DraftFcDecodeConfig& cfg) {
  SmemPlan plan{};
  auto kernel = draft_fc_decode_cluster_smem_kernel<T, kNorm>;
  const int sms = sm_count();
  const int bpsm = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : kSmemBlocksPerSm;
  plan.t = cluster_tiling(p.taps, p.hidden, p.out_features, static_cast<int64_t>(bpsm) * sms, 1);
  plan.smem = static_cast<size_t>((p.rows + 1) * smem_pitch(plan.t.k_block)) * sizeof(T);  // tokens' rows, g's
  cudaFuncAttributes fa;
  const int optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || plan.smem + fa.sharedSizeBytes > static_cast<size_t>(optin)) {
    cudaGetLastError();
    return plan;
  }
  int per_sm = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin - static_cast<int>(fa.sharedSizeBytes)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kFcWarps * 32, plan.smem) != cudaSuccess) {
    cudaGetLastError();
    return plan;
  }
  plan.ok = static_cast<int64_t>(per_sm) * sms >= plan.t.n_tiles * p.taps * plan.t.splits_per_tap;
  return plan;
}

template <typename T>
bool smem_plan_ok(const DraftFcParams& p, const DraftFcDecodeConfig& cfg) {
  return p.norm_weight != nullptr ? smem_plan<T, true>(p, cfg).ok : smem_plan<T, false>(p, cfg).ok;
}

template <typename T, bool kNorm>
cudaError_t launch_cluster_smem(const DraftFcParams& p, cudaStream_t s, const DraftFcDecodeConfig& cfg) {
  const SmemPlan plan = smem_plan<T, kNorm>(p, cfg);
  if (!plan.ok) return cudaErrorInvalidConfiguration;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t lc = cluster_launch_config(plan.t, p.taps, plan.smem, s, attr);
  return cudaLaunchKernelEx(&lc, draft_fc_decode_cluster_smem_kernel<T, kNorm>, p, plan.t);
}

template <typename T, bool kNorm>
cudaError_t launch_cluster_regs(const DraftFcParams& p, cudaStream_t s, const DraftFcDecodeConfig& cfg) {
  constexpr int kGroups = 2;
  const int blocks_per_sm = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : decode_blocks_per_sm(kGroups);
  const int64_t slots = static_cast<int64_t>(blocks_per_sm) * sm_count();
  const ClusterTiling t = cluster_tiling(p.taps, p.hidden, p.out_features, slots, decode_unroll(kNorm, kGroups));
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t lc = cluster_launch_config(t, p.taps, 0, s, attr);
  return cudaLaunchKernelEx(&lc, draft_fc_decode_cluster_kernel<T, kNorm, kGroups>, p, t);
}

// One token group: the shared-memory form; two: the register form.
template <typename T>
cudaError_t launch_cluster_typed(const DraftFcParams& p, cudaStream_t s, const DraftFcDecodeConfig& cfg) {
  const bool norm = p.norm_weight != nullptr, two = p.rows > kMmaTokens;
  if (two) return norm ? launch_cluster_regs<T, true>(p, s, cfg) : launch_cluster_regs<T, false>(p, s, cfg);
  return norm ? launch_cluster_smem<T, true>(p, s, cfg) : launch_cluster_smem<T, false>(p, s, cfg);
}

}  // namespace
}  // namespace cuda

bool draft_fc_cluster_supported() {
  return cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9 &&
         cuda::current_device_attribute(cudaDevAttrClusterLaunch, 0) != 0;
}

bool draft_fc_cluster_applies(const DraftFcParams& p, DType dtype, const DraftFcDecodeConfig& cfg) {
  if (p.taps > cuda::kernels::kMaxCluster || p.rows > kDraftFcDecodeMaxRows || p.out_features >= (int64_t(1) << 31))
    return false;
  if (p.rows > cuda::kernels::kMmaTokens) return true;  // the register form
  switch (dtype) {
    case DType::BF16: return cuda::smem_plan_ok<__nv_bfloat16>(p, cfg);
    case DType::F16: return cuda::smem_plan_ok<__half>(p, cfg);
    default: return false;
  }
}

int draft_fc_decode_cluster_cuda(const DraftFcParams& p, DType dtype, void* stream, const DraftFcDecodeConfig& cfg) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_cluster_applies(p, dtype, cfg)) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::BF16: return cuda::launch_cluster_typed<__nv_bfloat16>(p, s, cfg);
    case DType::F16: return cuda::launch_cluster_typed<__half>(p, s, cfg);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace e3
