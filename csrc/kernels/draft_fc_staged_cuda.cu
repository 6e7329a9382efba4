// The draft fc kernel for 9..64 rows (experiment): the split-K register decode kernel's weight stream
// (draft_fc_device.cuh: 4 warps x 16 weight rows, 16-byte loads, mma.sync with the weights as the A operand) with
// the B operand of every token group read from shared memory, where the block staged its whole k range of every
// token's activations once (x * g rounded, x^2 summed) before streaming: one block barrier per block, none per step,
// and each token's activations read from L2 once per block instead of once per warp. Partials meet in a 64-token
// pitch workspace; the tile's last block finishes it. Torch-free.
#include "draft_fc_device.cuh"
#include "draft_fc_staged.h"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kStThreads = kFcWarps * 32;
constexpr int kStUnroll = 6;                                  // weight chunks per warp step (the split kernel's)
constexpr int kStStep = kFcChunk * kStUnroll;                 // 192 k per warp step
constexpr int kWgPitch = static_cast<int>(kDraftFcStagedMaxRows);  // workspace tokens per row
constexpr int kWgThreads = kStThreads;
constexpr int kWgRows = kFcRowsPerBlock;                      // 64
constexpr int kStSmemBudget = 48 * 1024;                      // activations per block: 4 blocks per SM
constexpr int kWgMaxTaps = 64;                              // the epilogue table in the staged rows

struct StTiling {
  int64_t splits_per_tap;
  int64_t k_block;  // multiple of kStStep
};

// The column tile's epilogue, run by the block that completed it: y = sum_tap rrms(tap) * acc(tap) + bias. Each
// thread owns up to kItems (row, 4-token quad) items, rows fastest across threads (coalesced output stores); a
// tap's loads of all of a thread's items are issued together, one L2 round trip per tap. `scratch` holds K x 64
// floats (shared memory).
template <typename T, bool kNorm, int kTok>
__device__ void wgmma_tile_epilogue(const DraftFcParams& p, const DraftFcWorkspace& ws, int64_t tile,
                                    float* scratch) {
  constexpr int kItems = kWgRows * (kTok / 4) / kWgThreads;
  const int tid = threadIdx.x;
  float* tile_ss = ws.tile_sum_sq + tile * p.taps * kWgPitch;
  if (kNorm) {
    const float inv_h = 1.0f / static_cast<float>(p.hidden);
    for (int i = tid; i < p.taps * kWgPitch; i += kWgThreads)
      scratch[i] = (i % kWgPitch) < p.rows ? rsqrtf(__ldcg(tile_ss + i) * inv_h + p.eps) : 0.f;
    __syncthreads();
    for (int i = tid; i < p.taps * kWgPitch; i += kWgThreads) __stcg(tile_ss + i, 0.f);
  }
  const int64_t left = p.out_features - tile * kWgRows;
  const int rows_here = left < kWgRows ? static_cast<int>(left) : kWgRows;
  const int quads = static_cast<int>((p.rows + 3) / 4);
  const T* bias = static_cast<const T*>(p.bias);
  float4* acc = reinterpret_cast<float4*>(ws.acc + tile * kWgRows * kWgPitch);
  const int64_t tap_pitch = p.out_features * (kWgPitch / 4);  // float4s per tap
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const int r = tid % kWgRows;
  bool ok[kItems];
  int quad[kItems];
  float y[kItems][4];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    quad[j] = tid / kWgRows + j * (kWgThreads / kWgRows);
    ok[j] = r < rows_here && quad[j] < quads;
    const float b = ok[j] && bias != nullptr ? to_f(bias[tile * kWgRows + r]) : 0.f;
    y[j][0] = y[j][1] = y[j][2] = y[j][3] = b;
  }
  for (int tp = 0; tp < p.taps; ++tp) {
    float4 a[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j)
      a[j] = ok[j] ? __ldcg(acc + tp * tap_pitch + r * (kWgPitch / 4) + quad[j]) : zero;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (!ok[j]) continue;
      const float* s = scratch + tp * kWgPitch + 4 * quad[j];
      y[j][0] += (kNorm ? s[0] : 1.f) * a[j].x;
      y[j][1] += (kNorm ? s[1] : 1.f) * a[j].y;
      y[j][2] += (kNorm ? s[2] : 1.f) * a[j].z;
      y[j][3] += (kNorm ? s[3] : 1.f) * a[j].w;
      __stcg(acc + tp * tap_pitch + r * (kWgPitch / 4) + quad[j], zero);
    }
  }
  T* out = static_cast<T*>(p.out) + tile * kWgRows + r;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (!ok[j]) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (4 * quad[j] + e < p.rows) out[(4 * quad[j] + e) * p.out_row_stride] = from_f<T>(y[j][e]);
  }
  if (tid == 0) ws.counters[tile] = 0;
}


// Row pitch of the staged activations in elements: the k range plus 32 (64 bytes), so that 8 token rows start in
// alternating halves of the 128-byte bank window and a warp's 16-byte fragment loads are conflict-free.
__host__ __device__ constexpr int64_t st_pitch(int64_t k_block) { return k_block + 32; }

template <typename T, bool kNorm, int kGroups>
__global__ void __launch_bounds__(kStThreads, 4) draft_fc_staged_kernel(DraftFcParams p, StTiling t,
                                                                          DraftFcWorkspace ws) {
  constexpr int kTok = kGroups * 8;
  extern __shared__ uint4 st_smem[];
  __shared__ float ss_sh[kTok];
  __shared__ unsigned last_flag;
  T* xs = reinterpret_cast<T*>(st_smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y / t.splits_per_tap);
  const int64_t k_begin = (blockIdx.y % t.splits_per_tap) * t.k_block;
  const int64_t k_end = k_begin + t.k_block < p.hidden ? k_begin + t.k_block : p.hidden;
  const int64_t pitch = st_pitch(t.k_block);
  if (tid < kTok) ss_sh[tid] = 0.f;
  __syncthreads();

  // Stage: x * g (rounded) for every token row < M (zeros above M and past k_end), 8 vectors in flight per thread;
  // each vector's x^2 goes to its token's shared sum, one atomic per warp where the warp's lanes share the token.
  {
    const int nvec = static_cast<int>(t.k_block / 8);
    const int total = kTok * nvec;
    const T* grow = static_cast<const T*>(p.norm_weight) + tap * p.hidden;
    const T* xtap = static_cast<const T*>(p.tap(tap));
    const int64_t xstride = p.tap_row_stride(tap);
    for (int base = tid; base - lane < total; base += 8 * kStThreads) {
      uint4 xv[8], gv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int v = base + j * kStThreads;
        const int tok = v / nvec;
        const int64_t k = k_begin + static_cast<int64_t>(v - tok * nvec) * 8;
        const bool in = v < total && tok < p.rows && k < k_end;
        xv[j] = in ? __ldg(reinterpret_cast<const uint4*>(xtap + tok * xstride + k)) : make_uint4(0, 0, 0, 0);
        if (kNorm) gv[j] = in ? __ldg(reinterpret_cast<const uint4*>(grow + k)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int v = base + j * kStThreads;
        const int tok = v < total ? v / nvec : -1;
        float sq = 0.f;
        const uint4 val = kNorm ? scale8<T>(xv[j], gv[j], sq, true) : xv[j];
        if (tok >= 0) *reinterpret_cast<uint4*>(xs + tok * pitch + (v - tok * nvec) * 8) = val;
        if (kNorm) {
          const int tok0 = __shfl_sync(0xffffffffu, tok, 0);
          if (__all_sync(0xffffffffu, tok == tok0)) {
            for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (lane == 0 && tok0 >= 0 && sq != 0.f) atomicAdd(ss_sh + tok0, sq);
          } else if (tok >= 0 && sq != 0.f) {
            atomicAdd(ss_sh + tok, sq);
          }
        }
      }
    }
  }
  __syncthreads();
  if (kNorm && tid < kTok && tid < p.rows)
    atomicAdd(ws.tile_sum_sq + (tile * p.taps + tap) * kWgPitch + tid, ss_sh[tid]);

  // Stream: the warp's rows row_a and row_a + 8, B fragments of every group from the staged rows.
  const int64_t row_a = tile * kFcRowsPerBlock + warp * 16 + g;
  const bool has_a = row_a < p.out_features, has_b = row_a + 8 < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = w_a + 8 * p.weight_row_stride;
  float acc[kGroups][4] = {};
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kStStep) {
    uint4 wa[kStUnroll], wb[kStUnroll];
#pragma unroll
    for (int u = 0; u < kStUnroll; ++u) {
      const int64_t k = k0 + u * kFcChunk + 8 * c;
      const bool in = k < k_end;
      wa[u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      wb[u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kStUnroll; ++u) {
      const T* xk = xs + (k0 - k_begin) + u * kFcChunk + 8 * c;
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        const uint4 xu = *reinterpret_cast<const uint4*>(xk + (q * 8 + g) * pitch);
        Mma<T>::run(acc[q], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xu.x, xu.y);
        Mma<T>::run(acc[q], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xu.z, xu.w);
      }
    }
  }

  // Partials (acc[q]: rows row_a, row_a + 8 x tokens 8q + 2c, 8q + 2c + 1).
  float* wsa = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWgPitch;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int col = 8 * q + 2 * c;
    if (col >= p.rows) continue;
    const bool pair = col + 1 < p.rows;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t n = row_a + 8 * e;
      if (n >= p.out_features) continue;
      float* dst = wsa + n * kWgPitch + col;
      if (pair) {
        atomicAdd(dst, acc[q][2 * e]);
        atomicAdd(dst + 1, acc[q][2 * e + 1]);
      } else {
        atomicAdd(dst, acc[q][2 * e]);
      }
    }
  }
  __syncthreads();
  if (tid == 0)
    last_flag = counter_add_acq_rel(ws.counters + tile, 1u) + 1u ==
                        static_cast<unsigned>(p.taps * t.splits_per_tap)
                    ? 1u
                    : 0u;
  __syncthreads();
  if (last_flag == 0u) return;
  wgmma_tile_epilogue<T, kNorm, kTok>(p, ws, tile, reinterpret_cast<float*>(st_smem));  // xs is dead now
}

template <typename T, bool kNorm, int kGroups>
cudaError_t launch_staged(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s, int splits) {
  constexpr int kTok = kGroups * 8;
  const int64_t n_tiles = decode_n_tiles(p.out_features);
  // One wave at 4 blocks per SM where the activations fit the budget, else the largest k range that fits.
  int64_t spt = splits > 0 ? splits : 4 * static_cast<int64_t>(sm_count()) / (n_tiles * p.taps);
  spt = spt < 1 ? 1 : spt;
  int64_t k_block = (p.hidden + spt - 1) / spt;
  k_block = (k_block + kStStep - 1) / kStStep * kStStep;
  const int64_t cap = ((kStSmemBudget / (kTok * 2)) - 32) / kStStep * kStStep;
  if (k_block > cap) k_block = cap < kStStep ? kStStep : cap;
  StTiling t;
  t.k_block = k_block;
  t.splits_per_tap = (p.hidden + k_block - 1) / k_block;
  size_t smem = static_cast<size_t>(kTok) * st_pitch(k_block) * sizeof(T);
  const size_t table = static_cast<size_t>(p.taps) * kWgPitch * sizeof(float);  // the epilogue's rsqrt table
  smem = smem > table ? smem : table;
  static size_t set_for = 0;
  if (smem > 48 * 1024 && set_for < smem) {
    cudaError_t e = cudaFuncSetAttribute(draft_fc_staged_kernel<T, kNorm, kGroups>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    set_for = smem;
  }
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  draft_fc_staged_kernel<T, kNorm, kGroups><<<grid, kStThreads, smem, s>>>(p, t, ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_staged_typed(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s, int splits) {
  const bool norm = p.norm_weight != nullptr;
  if (p.rows <= 16) return norm ? launch_staged<T, true, 2>(p, ws, s, splits) : launch_staged<T, false, 2>(p, ws, s, splits);
  if (p.rows <= 32) return norm ? launch_staged<T, true, 4>(p, ws, s, splits) : launch_staged<T, false, 4>(p, ws, s, splits);
  return norm ? launch_staged<T, true, 8>(p, ws, s, splits) : launch_staged<T, false, 8>(p, ws, s, splits);
}

}  // namespace kernels
}  // namespace cuda

namespace {
int64_t a256(int64_t b) { return (b + 255) / 256 * 256; }
}  // namespace

int64_t draft_fc_staged_zeroed_bytes(int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  return a256(taps * out_features * kWgPitch * 4) + a256(n_tiles * taps * kWgPitch * 4) + a256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_staged_workspace_view(void* zeroed, int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::decode_n_tiles(out_features);
  char* z = static_cast<char*>(zeroed);
  DraftFcWorkspace ws;
  ws.acc = reinterpret_cast<float*>(z);
  z += a256(taps * out_features * kWgPitch * 4);
  ws.tile_sum_sq = reinterpret_cast<float*>(z);
  z += a256(n_tiles * taps * kWgPitch * 4);
  ws.counters = reinterpret_cast<unsigned*>(z);
  return ws;
}

bool draft_fc_staged_supported() { return cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 8; }

bool draft_fc_staged_applies(const DraftFcParams& p) {
  return p.rows >= 1 && p.rows <= kDraftFcStagedMaxRows && p.elem_size == 2 && p.hidden % 8 == 0 &&
         p.taps <= cuda::kernels::kWgMaxTaps && reinterpret_cast<uintptr_t>(p.weight) % 16 == 0 &&
         p.weight_row_stride % 8 == 0;
}

int draft_fc_staged_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                         int splits_per_tap) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_staged_applies(p) || (dtype != DType::BF16 && dtype != DType::F16))
    return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::BF16) return cuda::kernels::launch_staged_typed<__nv_bfloat16>(p, ws, s, splits_per_tap);
  return cuda::kernels::launch_staged_typed<__half>(p, ws, s, splits_per_tap);
}

}  // namespace e3
