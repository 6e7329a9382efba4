// The draft fc kernel for 9..64 rows on Hopper (sm_90a): the register decode kernels' weight stream feeding the
// warpgroup tensor-core instruction (wgmma) from registers, the activations shared by the block in shared memory.
// Torch-free.
//
// Layout. Grid (n_tiles, taps * splits_per_tap), as the split-K decode kernel: a block (one warpgroup, 4 warps)
// owns 64 weight rows (the wgmma M; rows are output features), warp w rows 16w..16w+15, and a k range inside one
// tap, walked in steps of kWgStepK = 128. Per step:
// - every lane loads its A fragments straight from global memory with the decode kernels' load (draft_fc_device.cuh:
//   16 contiguous bytes of rows g and g + 8 per 32-wide chunk, whose k order is permuted so those bytes are the
//   fragments of two k16 MMAs), the next step's loads issued before this step's MMAs (two register sets);
// - the block's activations of the step [kTok tokens x 128 k] were multiplied by g (x^2 summed on the way: a block
//   owns the sums of its k range), rounded to the activation type, and stored in shared memory during the previous
//   step, in the same permuted k order, K-major and 128B-swizzled: the B operand of 8 wgmma m64 n{kTok} k16, each
//   token's activations read once per block instead of once per warp (the register kernels' cost above 8 rows).
// The block then adds its partial (and its sums of x^2) to the workspace with L2 atomics, and the block that
// completes a column tile applies each tap's rsqrt(mean(x^2) + eps), sums the taps, adds the bias, writes the tile
// and re-zeroes its workspace (the split-K kernel's scheme, draft_fc.h, at a pitch of 64 tokens).
// Why this shape (benchmarks/NOTES.md, seventh round): a first form streamed the weights as TMA tiles (64 or 128
// rows x 128 bytes) and capped near 3.3 TB/s, where the register loads reach 3.8.
// Numerics as the decode kernels: round(x * g) in the activation type, fp32 accumulation, rrms applied in fp32 to
// each tap's dot product.
#include "draft_fc_device.cuh"
#include "draft_fc_wgmma.h"
#include "tma.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kWgThreads = 128;                   // one warpgroup
constexpr int kWgRows = 64;                       // weight rows per block: the wgmma M
constexpr int kWgStepK = 128;                     // k elements per step: 4 chunks of 32, 8 k16 MMAs
constexpr int kWgChunks = kWgStepK / kFcChunk;
constexpr int kWgPitch = static_cast<int>(kDraftFcWgmmaMaxRows);  // workspace tokens per row
constexpr int kWgMaxTaps = 64;                    // the epilogue's rsqrt table (K x 64 floats) in the idle buffers
static_assert(kWgRows == kFcWarps * 16 && kWgChunks * kFcChunk == kWgStepK, "the decode kernels' fragment layout");

// One activation buffer of the kTok instantiation: kWgStepK / 64 swizzle atoms of kTok rows x 128 bytes.
__host__ __device__ constexpr int wg_x_bytes(int tok) { return kWgStepK / 64 * tok * 128; }
// Shared memory: two activation buffers (at least the rsqrt table), 1024 bytes of slack to align them.
__host__ __device__ constexpr int wg_smem_bytes(int tok) {
  return 1024 + (2 * wg_x_bytes(tok) > kWgMaxTaps * kWgPitch * 4 ? 2 * wg_x_bytes(tok) : kWgMaxTaps * kWgPitch * 4);
}
__host__ __device__ constexpr int64_t wg_n_tiles(int64_t out_features) { return (out_features + kWgRows - 1) / kWgRows; }

struct WgTiling {
  int steps_per_tap;    // ceil(H / kWgStepK)
  int steps_per_split;  // steps per block
  int splits_per_tap;
};

// A shared-memory matrix descriptor of a K-major, 128B-swizzled tile whose 8-row groups are 1024 bytes apart. The
// start address advances by 32 bytes (2 in the descriptor) per k16 block inside a swizzle row: the swizzle is a
// function of the address bits, so the base must be 1024-aligned.
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint64_t addr = tma::smem_u32(p);
  return ((addr >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// wgmma m64 n{kTok} k16, A from registers (the mma.sync m16n8k16 A fragment per warp), B from shared memory.
template <typename T, int kTok> struct Wgmma;
template <> struct Wgmma<__nv_bfloat16, 16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7"
        "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
        "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7"
        "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
        "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
};


#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
#endif
// Pins the accumulators (and the A registers) after a wait: no read of the accumulators may be scheduled before
// the asynchronous MMAs completed, and no other value may take the A registers while the MMAs still read them.
template <int kN>
__device__ __forceinline__ void fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_operands(uint4 (&a)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(a[i].x), "+r"(a[i].y), "+r"(a[i].z), "+r"(a[i].w)::"memory");
}

// The column tile's epilogue, run by the block that completed it: y = sum_tap rrms(tap) * acc(tap) + bias. Each
// thread owns up to kItems (row, 4-token quad) items, rows fastest across threads (coalesced output stores); a
// tap's loads of all of a thread's items are issued together, one L2 round trip per tap. `scratch` holds K x 64
// floats (the activation buffers, idle by now).
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


template <typename T, bool kNorm, int kTok>
__global__ void __launch_bounds__(kWgThreads) draft_fc_wgmma_kernel(DraftFcParams p, WgTiling t, DraftFcWorkspace ws) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kXBytes = wg_x_bytes(kTok);
  constexpr int kAtomBytes = kTok * 128;
  constexpr int kP = kWgThreads / kTok;       // threads per token row: 8, 4 or 2
  constexpr int kV = kWgStepK / 8 / kP;       // 16-byte activation vectors per thread and step
  static_assert(kWgThreads % kTok == 0 && (kWgStepK / 8) % kP == 0, "activation mapping");
  extern __shared__ unsigned char wg_smem_raw[];
  __shared__ unsigned last_flag;
  unsigned char* xbuf = wg_smem_raw + ((1024 - (tma::smem_u32(wg_smem_raw) & 1023)) & 1023);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y) / t.splits_per_tap;
  const int step0 = (static_cast<int>(blockIdx.y) % t.splits_per_tap) * t.steps_per_split;
  const int n_steps = t.steps_per_tap - step0 < t.steps_per_split ? t.steps_per_tap - step0 : t.steps_per_split;

  // Weights: this lane's rows row_a = tile*64 + 16 warp + g and row_a + 8.
  const int64_t row_a = tile * kWgRows + warp * 16 + g;
  const bool has_a = row_a < p.out_features, has_b = row_a + 8 < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = w_a + 8 * p.weight_row_stride;
  auto load_w = [&](int i, uint4 (&w)[2][kWgChunks]) {
    const int64_t kb = static_cast<int64_t>(step0 + i) * kWgStepK;
#pragma unroll
    for (int u = 0; u < kWgChunks; ++u) {
      const int64_t k = kb + u * kFcChunk + 8 * c;
      const bool in = k < p.hidden;  // H is a multiple of 8: a vector is all in or all out
      w[0][u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      w[1][u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
    }
  };

  // Activations: thread tid owns token row tok's 16-byte vectors col = part + kP v (chunk col / 4, lane group
  // col % 4 of the fragment layout) of every step.
  const int tok = tid / kP, part = tid % kP;
  const bool has_tok = tok < p.rows;
  const T* xrow = static_cast<const T*>(p.tap(tap)) + (has_tok ? tok : 0) * p.tap_row_stride(tap);
  const T* grow = static_cast<const T*>(p.norm_weight) + tap * p.hidden;
  float sum_sq = 0.f;
  // Step i's activations: loaded, x * g (rounded), stored into buffer i & 1 in the fragment order. Vector col holds
  // elements 8c' + 4s + 2h + e (c' = col % 4) of chunk u = col / 4: the word (s, h) goes to k16 block 2u + s,
  // position 2c' + 8h + e, i.e. 16-byte unit ((2u + s) % 4) * 2 + h of swizzle atom (2u + s) / 4, word c'.
  auto stage_x = [&](int i) {
    const int64_t kb = static_cast<int64_t>(step0 + i) * kWgStepK;
    uint4 xv[kV], gv[kNorm ? kV : 1];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t k = kb + (part + kP * v) * 8;
      const bool in = k < p.hidden;
      xv[v] = in && has_tok ? __ldg(reinterpret_cast<const uint4*>(xrow + k)) : make_uint4(0, 0, 0, 0);
      if (kNorm) gv[v] = in ? __ldg(reinterpret_cast<const uint4*>(grow + k)) : make_uint4(0, 0, 0, 0);
    }
    unsigned char* buf = xbuf + (i & 1) * kXBytes + tok * 128;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int col = part + kP * v, u = col >> 2, cc = col & 3;
      const uint4 val = kNorm ? scale8<T>(xv[v], gv[kNorm ? v : 0], sum_sq, true) : xv[v];
      const uint32_t words[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
      for (int sh = 0; sh < 4; ++sh) {
        const int s = sh >> 1, h = sh & 1, blk = 2 * u + s;
        const int unit = ((blk & 3) * 2 + h) ^ (tok & 7);
        *reinterpret_cast<uint32_t*>(buf + (blk >> 2) * kAtomBytes + (unit << 4) + cc * 4) = words[sh];
      }
    }
  };

  float acc[kTok / 2];
#pragma unroll
  for (int j = 0; j < kTok / 2; ++j) acc[j] = 0.f;
  uint4 wa[2][kWgChunks], wb[2][kWgChunks];
  load_w(0, wa);
  stage_x(0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores, visible to the tensor cores
  __syncthreads();
  const uint64_t xdesc = sw128_desc(xbuf);
  // One step on the weights in `cur` (loaded earlier), the next step's weights loaded into `nxt` first.
  auto step = [&](int i, uint4 (&cur)[2][kWgChunks], uint4 (&nxt)[2][kWgChunks]) {
    if (i + 1 < n_steps) load_w(i + 1, nxt);
    wgmma_fence();
    const uint64_t xd = xdesc + (((i & 1) * kXBytes) >> 4);
#pragma unroll
    for (int u = 0; u < kWgChunks; ++u) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int blk = 2 * u + s;
        const uint64_t bd = xd + (((blk >> 2) * kAtomBytes) >> 4) + 2 * (blk & 3);
        // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of rows g and g + 8.
        if (s == 0) Wgmma<T, kTok>::run(acc, cur[0][u].x, cur[1][u].x, cur[0][u].y, cur[1][u].y, bd);
        else Wgmma<T, kTok>::run(acc, cur[0][u].z, cur[1][u].z, cur[0][u].w, cur[1][u].w, bd);
      }
    }
    wgmma_commit();
    // While the MMAs run: the next step's activations into the other buffer (its last reader, step i - 1, is done).
    if (i + 1 < n_steps) stage_x(i + 1);
    wgmma_wait_all();
    fence_operands(acc);
    fence_operands(cur[0]);
    fence_operands(cur[1]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();  // buffer i & 1 is free, buffer (i + 1) & 1 is written
  };
  for (int i = 0; i < n_steps; i += 2) {
    step(i, wa, wb);
    if (i + 1 < n_steps) step(i + 1, wb, wa);
  }

  // This block's partial into the workspace: thread (warp w, lane l) holds rows 16w + l/4 (+ 8) of the tile and
  // tokens 8j + 2(l%4) (+ 1), j < kTok / 8 (the wgmma accumulator layout).
  float* wsa = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWgPitch;
#pragma unroll
  for (int j = 0; j < kTok / 8; ++j) {
    const int col = 8 * j + 2 * c;
    if (col >= p.rows) continue;
    const bool pair = col + 1 < p.rows;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t n = row_a + 8 * e;
      if (n >= p.out_features) continue;
      float* dst = wsa + n * kWgPitch + col;
      const float lo = acc[4 * j + 2 * e], hi = acc[4 * j + 2 * e + 1];
      if (pair) atomicAdd(reinterpret_cast<float2*>(dst), make_float2(lo, hi));
      else atomicAdd(dst, lo);
    }
  }
  if (kNorm) {
#pragma unroll
    for (int o = 1; o < kP; o <<= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
    if (part == 0 && has_tok) atomicAdd(ws.tile_sum_sq + (tile * p.taps + tap) * kWgPitch + tok, sum_sq);
  }
  __syncthreads();
  if (tid == 0)
    last_flag = counter_add_acq_rel(ws.counters + tile, 1u) + 1u == static_cast<unsigned>(p.taps * t.splits_per_tap)
                    ? 1u
                    : 0u;
  __syncthreads();
  if (last_flag == 0u) return;
  wgmma_tile_epilogue<T, kNorm, kTok>(p, ws, tile, reinterpret_cast<float*>(xbuf));
#else
  __trap();  // launched only on compute capability 9.0 (draft_fc_wgmma_supported)
#endif
}

// Resident blocks per SM of one instantiation (asked once per device), and its opt-in shared-memory size set.
template <typename T, bool kNorm, int kTok>
cudaError_t prepare_kernel(int* blocks_per_sm) {
  constexpr int kDevices = 64;
  static int cached[kDevices] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < kDevices && cached[dev] > 0) {
    *blocks_per_sm = cached[dev];
    return cudaSuccess;
  }
  auto kernel = draft_fc_wgmma_kernel<T, kNorm, kTok>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_smem_bytes(kTok));
  if (e != cudaSuccess) return e;
  int n = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWgThreads, wg_smem_bytes(kTok));
  if (e != cudaSuccess) return e;
  if (n < 1) return cudaErrorInvalidConfiguration;
  if (dev < kDevices) cached[dev] = n;
  *blocks_per_sm = n;
  return cudaSuccess;
}

template <typename T, bool kNorm, int kTok>
cudaError_t launch_wgmma(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s, int splits_per_tap) {
  int blocks_per_sm = 0;
  cudaError_t e = prepare_kernel<T, kNorm, kTok>(&blocks_per_sm);
  if (e != cudaSuccess) return e;
  // K-splits: as many as fill one wave of resident blocks, each a whole number of steps.
  const int64_t n_tiles = wg_n_tiles(p.out_features);
  WgTiling t;
  t.steps_per_tap = static_cast<int>((p.hidden + kWgStepK - 1) / kWgStepK);
  int64_t spt = splits_per_tap > 0 ? splits_per_tap
                                   : static_cast<int64_t>(blocks_per_sm) * sm_count() / (n_tiles * p.taps);
  spt = spt < 1 ? 1 : (spt > t.steps_per_tap ? t.steps_per_tap : spt);
  t.steps_per_split = static_cast<int>((t.steps_per_tap + spt - 1) / spt);
  t.splits_per_tap = (t.steps_per_tap + t.steps_per_split - 1) / t.steps_per_split;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  draft_fc_wgmma_kernel<T, kNorm, kTok><<<grid, kWgThreads, wg_smem_bytes(kTok), s>>>(p, t, ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_wgmma_typed(const DraftFcParams& p, const DraftFcWorkspace& ws, cudaStream_t s, int splits) {
  const bool norm = p.norm_weight != nullptr;
  if (p.rows <= 16) return norm ? launch_wgmma<T, true, 16>(p, ws, s, splits) : launch_wgmma<T, false, 16>(p, ws, s, splits);
  if (p.rows <= 32) return norm ? launch_wgmma<T, true, 32>(p, ws, s, splits) : launch_wgmma<T, false, 32>(p, ws, s, splits);
  return norm ? launch_wgmma<T, true, 64>(p, ws, s, splits) : launch_wgmma<T, false, 64>(p, ws, s, splits);
}

}  // namespace kernels
}  // namespace cuda

int64_t draft_fc_wgmma_zeroed_bytes(int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::wg_n_tiles(out_features);
  auto a256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  return a256(taps * out_features * kWgPitch * 4) + a256(n_tiles * taps * kWgPitch * 4) + a256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_wgmma_workspace_view(void* zeroed, int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::wg_n_tiles(out_features);
  auto a256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  char* z = static_cast<char*>(zeroed);
  DraftFcWorkspace ws;
  ws.acc = reinterpret_cast<float*>(z);
  z += a256(taps * out_features * kWgPitch * 4);
  ws.tile_sum_sq = reinterpret_cast<float*>(z);
  z += a256(n_tiles * taps * kWgPitch * 4);
  ws.counters = reinterpret_cast<unsigned*>(z);
  return ws;
}

bool draft_fc_wgmma_supported() {
  // (current_device_attribute treats 0 as a failed query, and the minor version here is 0.)
  int dev = 0, major = 0, minor = -1;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

bool draft_fc_wgmma_applies(const DraftFcParams& p) {
  return p.rows >= 1 && p.rows <= kDraftFcWgmmaMaxRows && p.elem_size == 2 && p.hidden % 8 == 0 &&
         p.taps <= cuda::kernels::kWgMaxTaps &&
         reinterpret_cast<uintptr_t>(p.weight) % 16 == 0 && p.weight_row_stride % 8 == 0 &&
         p.taps * p.hidden < (int64_t(1) << 31) && p.out_features < (int64_t(1) << 31);
}

int draft_fc_wgmma_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                        int splits_per_tap) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_wgmma_applies(p) || (dtype != DType::BF16 && dtype != DType::F16))
    return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::BF16) return cuda::kernels::launch_wgmma_typed<__nv_bfloat16>(p, ws, s, splits_per_tap);
  return cuda::kernels::launch_wgmma_typed<__half>(p, ws, s, splits_per_tap);
}

}  // namespace e3
