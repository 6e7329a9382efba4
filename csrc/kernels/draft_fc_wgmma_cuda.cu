// The draft fc kernel for 9..64 rows on Hopper (sm_90a): weights streamed by TMA, activations staged in shared
// memory, the warpgroup tensor-core instruction (wgmma) on both. Torch-free.
//
// Layout. Grid (n_tiles, taps * splits_per_tap): a block (one warpgroup, 128 threads) owns 128 weight rows (two
// wgmma M = 64 halves; rows are output features) and a k range inside one tap, walked in steps of 64 k (one
// 128-byte row of a 128B-swizzled tile). Every step's operands go through a ring of wg_stages(kTok) shared-memory
// stages, stages - 1 steps in flight ahead of the one consumed:
// - the weight tile [128 rows x 64 k] by one 3-D tensor copy ({H, K, N}: columns past a tap's end are zero, never
//   the next tap's), counted on the stage's mbarrier, issued by thread 0;
// - the activations [kTok tokens x 64 k] and the norm weights of the step by cp.async from every thread (zero-filled
//   past M and past the tap), stored 128B-swizzled (the wgmma B operand, K-major).
// When a step is consumed, each thread multiplies its own activation vectors by g in place (rounded to the
// activation type, x^2 summed on the way: a block owns the sums of its k range), and the warpgroup runs 2 x 4 wgmma
// m64 n{kTok} k16 into fp32 registers. The block then adds its partial (and its sums of x^2) to the workspace with
// L2 atomics, and the block that completes a column tile applies each tap's rsqrt(mean(x^2) + eps), sums the taps,
// adds the bias, writes the tile and re-zeroes its workspace (the split-K kernel's scheme, draft_fc.h, at a pitch
// of 64 tokens).
// Why this shape (benchmarks/NOTES.md, seventh round): a first form with 64-row tiles and activations loaded into
// registers one step ahead was latency-bound (every step waited for an L2 round trip) and, at M = 64, moved as
// many activation bytes from L2 as weight bytes.
// Numerics as the decode kernels: round(x * g) in the activation type, fp32 accumulation, rrms applied in fp32 to
// each tap's dot product.
#include "draft_fc_device.cuh"
#include "draft_fc_wgmma.h"
#include "tma.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kWgThreads = 128;                   // one warpgroup
constexpr int kWgK = 64;                          // k elements per box: one 128-byte swizzle row
constexpr int kWgPitch = static_cast<int>(kDraftFcWgmmaMaxRows);  // workspace tokens per row
constexpr int kWgHeadBytes = 1024;                // mbarriers; the stages start 1024-aligned after them
constexpr int kWgMaxTaps = 64;                    // the epilogue's rsqrt table (K x 64 floats) in the idle stages
constexpr int kWgMinRows = 64;                    // the workspace's tile arrays are sized for the smallest tile

// A stage geometry: kRows weight rows per block (64 or 128: one or two wgmma M = 64 halves) and kBoxes 64-wide k
// boxes per stage (each row's kBoxes * 128 bytes requested together), kTok token columns; as many stages as fit two
// blocks per SM with at least three stages each, else one block (at most 8).
template <int kTok, int kRows, int kBoxes>
struct WgGeom {
  static constexpr int kBoxBytes = kRows * 128;                     // one weight box
  static constexpr int kWBytes = kBoxes * kBoxBytes;                // weights of a stage
  static constexpr int kXBytes = kBoxes * kTok * 128;               // activations of a stage
  static constexpr int kGBytes = kBoxes * 128;                      // norm weights of a stage
  static constexpr int kStageBytes = kWBytes + kXBytes + kGBytes;
  static constexpr int kBudget = 220 * 1024;
  static constexpr int kBlocks = 2 * 3 * kStageBytes <= kBudget ? 2 : 1;
  static constexpr int kFit = kBudget / kBlocks / kStageBytes;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  static constexpr int kSmem = 1024 + kWgHeadBytes + kStages * kStageBytes;
  static constexpr int kStepK = kBoxes * kWgK;
  static_assert(kStages >= 2 && kBoxBytes % 1024 == 0 && (kTok * 128) % 1024 == 0, "stage layout");
  static_assert(kWgMaxTaps * kWgPitch * 4 <= 2 * kWBytes, "the rsqrt table fits the weight stages");
};
__host__ __device__ constexpr int64_t wg_n_tiles(int64_t out_features, int rows) { return (out_features + rows - 1) / rows; }

struct WgTiling {
  int steps_per_tap;    // ceil(H / 64)
  int steps_per_split;  // steps per block
  int splits_per_tap;
};

// A shared-memory matrix descriptor of a K-major, 128B-swizzled tile whose 8-row groups are 1024 bytes apart (the
// layout a 128B-swizzle tensor copy writes, and the one the activations are stored in). The start address advances
// by 32 bytes (2 in the descriptor) per k16 step inside the swizzle row: the swizzle is a function of the address.
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint64_t addr = tma::smem_u32(p);
  return ((addr >> 4) & 0x3FFF) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

template <typename T, int kTok> struct Wgmma;
template <> struct Wgmma<__nv_bfloat16, 16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7"
        "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__nv_bfloat16, 64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 16> {
  __device__ __forceinline__ static void run(float (&d)[8], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7"
        "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 32> {
  __device__ __forceinline__ static void run(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(1));
  }
};
template <> struct Wgmma<__half, 64> {
  __device__ __forceinline__ static void run(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
  }
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
#endif
// Pins the accumulators after a wait: no read of them may be scheduled before the asynchronous MMAs completed.
template <int kN>
__device__ __forceinline__ void fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The column tile's epilogue, run by the block that completed it: y = sum_tap rrms(tap) * acc(tap) + bias. Each
// thread owns up to kItems (row, 4-token quad) items, rows fastest across threads (coalesced output stores); a
// tap's loads of all of a thread's items are issued together, one L2 round trip per tap. `scratch` holds K x 64
// floats (the weight stages, idle by now).
template <typename T, bool kNorm, int kTok, int kWgRows>
__device__ void wgmma_tile_epilogue(const DraftFcParams& p, const DraftFcWorkspace& ws, int64_t tile,
                                    float* scratch) {
  constexpr int kItems = kWgRows * (kTok / 4) / kWgThreads > 0 ? kWgRows * (kTok / 4) / kWgThreads : 1;
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// 16 bytes global -> shared, bypassing L1; zero-filled when !in (nothing is read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(tma::smem_u32(dst)), "l"(src),
               "r"(in ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
#endif

template <typename T, bool kNorm, int kTok, int kRows, int kBoxes>
__global__ void __launch_bounds__(kWgThreads) draft_fc_wgmma_kernel(const __grid_constant__ CUtensorMap wmap,
                                                                     DraftFcParams p, WgTiling t,
                                                                     DraftFcWorkspace ws) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using G = WgGeom<kTok, kRows, kBoxes>;
  constexpr int kS = G::kStages;
  constexpr int kXBytes = G::kXBytes;
  constexpr int kAtom = kTok * 128;      // one activation atom: kTok rows of 128 bytes
  constexpr int kHalves = kRows / 64;
  constexpr int kP = kWgThreads / kTok;  // threads per token row: 8, 4 or 2
  constexpr int kV = 8 * kBoxes / kP;    // 16-byte vectors per thread and step
  static_assert(kWgThreads % kTok == 0 && (8 * kBoxes) % kP == 0, "activation copy mapping");
  extern __shared__ unsigned char wg_smem_raw[];
  __shared__ unsigned last_flag;
  unsigned char* smem = wg_smem_raw + ((1024 - (tma::smem_u32(wg_smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  unsigned char* wring = smem + kWgHeadBytes;
  unsigned char* xring = wring + kS * G::kWBytes;
  unsigned char* gring = xring + kS * kXBytes;

  const int tid = threadIdx.x;
  const int64_t tile = blockIdx.x;
  const int tap = static_cast<int>(blockIdx.y) / t.splits_per_tap;
  const int step0 = (static_cast<int>(blockIdx.y) % t.splits_per_tap) * t.steps_per_split;
  const int n_steps = t.steps_per_tap - step0 < t.steps_per_split ? t.steps_per_tap - step0 : t.steps_per_split;

  if (tid == 0) {
    for (int s = 0; s < kS; ++s) tma::mbar_init(full + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Thread tid copies token row tok's 16-byte vectors part, part + kP, ... of each step; threads 0..7 the step's
  // norm weights.
  const int tok = tid / kP, part = tid % kP;
  const bool has_tok = tok < p.rows;
  const T* xrow = static_cast<const T*>(p.tap(tap)) + (has_tok ? tok : 0) * p.tap_row_stride(tap);
  const T* grow = static_cast<const T*>(p.norm_weight) + tap * p.hidden;
  // Step i's copies into stage i % kS: the weight tile (thread 0), this thread's activations and norm weights; one
  // cp.async group per step and thread, committed even when empty so that group counts stay aligned with steps.
  auto issue = [&](int i) {
    if (i < n_steps) {
      const int s = i % kS;
      const int64_t kb = static_cast<int64_t>(step0 + i) * G::kStepK;
      if (tid == 0) {
        tma::mbar_arrive_expect_tx(full + s, G::kWBytes);
        for (int a = 0; a < kBoxes; ++a)
          tma::copy_3d(wring + s * G::kWBytes + a * G::kBoxBytes, &wmap, static_cast<int>(kb) + a * kWgK, tap,
                       static_cast<int>(tile * kRows), full + s);
      }
      unsigned char* xrow_s = xring + s * kXBytes + tok * 128;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int col = part + kP * v;
        const int64_t k = kb + col * 8;
        const bool in = has_tok && k < p.hidden;  // H is a multiple of 8: a vector is all in or all out
        cp_async16(xrow_s + (col >> 3) * kAtom + (((col & 7) ^ (tok & 7)) << 4), in ? xrow + k : xrow, in);
      }
      if (kNorm && tid < 8 * kBoxes) {
        const int64_t k = kb + tid * 8;
        cp_async16(gring + s * G::kGBytes + tid * 16, k < p.hidden ? grow + k : grow, k < p.hidden);
      }
    }
    cp_async_commit();
  };
  for (int i = 0; i < kS - 1; ++i) issue(i);

  float acc[kHalves][kTok / 2];
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int j = 0; j < kTok / 2; ++j) acc[h][j] = 0.f;
  float sum_sq = 0.f;
  const uint64_t wdesc = sw128_desc(wring), xdesc = sw128_desc(xring);
  for (int i = 0; i < n_steps; ++i) {
    const int s = i % kS;
    cp_async_wait<kS - 2>();  // this thread's copies of step i have landed
    if (kNorm) {
      __syncthreads();  // ... and everyone's (the norm weights)
      // x * g in place on this thread's own vectors, rounded to T; x^2 summed.
      unsigned char* xrow_s = xring + s * kXBytes + tok * 128;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int col = part + kP * v;
        uint4* px = reinterpret_cast<uint4*>(xrow_s + (col >> 3) * kAtom + (((col & 7) ^ (tok & 7)) << 4));
        *px = scale8<T>(*px, *reinterpret_cast<const uint4*>(gring + s * G::kGBytes + col * 16), sum_sq, true);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes, visible to the tensor cores
    __syncthreads();
    tma::mbar_wait(full + s, static_cast<unsigned>((i / kS) & 1));
    wgmma_fence();
#pragma unroll
    for (int a = 0; a < kBoxes; ++a) {
#pragma unroll
      for (int kk = 0; kk < kWgK / 16; ++kk) {
        const uint64_t xd = xdesc + ((s * kXBytes + a * kAtom) >> 4) + 2 * kk;
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
          Wgmma<T, kTok>::run(acc[h], wdesc + ((s * G::kWBytes + a * G::kBoxBytes + h * 8192) >> 4) + 2 * kk, xd);
      }
    }
    wgmma_commit();
    wgmma_wait_all();
#pragma unroll
    for (int h = 0; h < kHalves; ++h) fence_operands(acc[h]);
    // Stage (i - 1) % kS was consumed by every thread before this step's barrier: refill it with step i + kS - 1.
    issue(i + kS - 1);
  }
  cp_async_wait<0>();

  // This block's partial into the workspace: thread (warp w, lane l) holds rows 64h + 16w + l/4 (+ 8) of the tile
  // and tokens 8j + 2(l%4) (+ 1), j < kTok / 8 (the wgmma accumulator layout, per half h).
  const int warp = tid >> 5, lane = tid & 31;
  float* wsa = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWgPitch;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int64_t row = tile * kRows + h * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int c = 8 * j + 2 * (lane & 3);
      if (c >= p.rows) continue;
      const bool pair = c + 1 < p.rows;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t n = row + 8 * e;
        if (n >= p.out_features) continue;
        float* dst = wsa + n * kWgPitch + c;
        const float lo = acc[h][4 * j + 2 * e], hi = acc[h][4 * j + 2 * e + 1];
        if (pair) atomicAdd(reinterpret_cast<float2*>(dst), make_float2(lo, hi));
        else atomicAdd(dst, lo);
      }
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
  wgmma_tile_epilogue<T, kNorm, kTok, kRows>(p, ws, tile, reinterpret_cast<float*>(wring));
#else
  __trap();  // launched only on compute capability 9.0 (draft_fc_wgmma_supported)
#endif
}

// The weight as a 3-D map {H, K, N} (elements), tap pitch H and row pitch weight_row_stride, box {64, 1, 64},
// 128B swizzle: a box never reads past its tap (columns past H are zero-filled), rows past N are zero-filled.
bool encode_weight_map(CUtensorMap* m, const DraftFcParams& p, DType dtype, int rows) {
  auto fn = tma::encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.hidden), static_cast<cuuint64_t>(p.taps),
                              static_cast<cuuint64_t>(p.out_features)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.hidden) * 2,
                                 static_cast<cuuint64_t>(p.weight_row_stride) * 2};
  const cuuint32_t box[3] = {kWgK, 1, static_cast<cuuint32_t>(rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(m, type, 3, const_cast<void*>(p.weight), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Resident blocks per SM of one instantiation (asked once per device), and its opt-in shared-memory size set.
template <typename T, bool kNorm, int kTok, int kRows, int kBoxes>
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
  using G = WgGeom<kTok, kRows, kBoxes>;
  auto kernel = draft_fc_wgmma_kernel<T, kNorm, kTok, kRows, kBoxes>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSmem);
  if (e != cudaSuccess) return e;
  int n = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWgThreads, G::kSmem);
  if (e != cudaSuccess) return e;
  if (n < 1) return cudaErrorInvalidConfiguration;
  if (dev < kDevices) cached[dev] = n;
  *blocks_per_sm = n;
  return cudaSuccess;
}

template <typename T, bool kNorm, int kTok, int kRows, int kBoxes>
cudaError_t launch_wgmma(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, cudaStream_t s,
                         int splits_per_tap) {
  using G = WgGeom<kTok, kRows, kBoxes>;
  CUtensorMap map;
  if (!encode_weight_map(&map, p, dtype, kRows)) return cudaErrorInvalidValue;
  int blocks_per_sm = 0;
  cudaError_t e = prepare_kernel<T, kNorm, kTok, kRows, kBoxes>(&blocks_per_sm);
  if (e != cudaSuccess) return e;
  // K-splits: as many as fill one wave of resident blocks, each a whole number of steps.
  const int64_t n_tiles = wg_n_tiles(p.out_features, kRows);
  WgTiling t;
  t.steps_per_tap = static_cast<int>((p.hidden + G::kStepK - 1) / G::kStepK);
  int64_t spt = splits_per_tap > 0 ? splits_per_tap
                                   : static_cast<int64_t>(blocks_per_sm) * sm_count() / (n_tiles * p.taps);
  spt = spt < 1 ? 1 : (spt > t.steps_per_tap ? t.steps_per_tap : spt);
  t.steps_per_split = static_cast<int>((t.steps_per_tap + spt - 1) / spt);
  t.splits_per_tap = (t.steps_per_tap + t.steps_per_split - 1) / t.steps_per_split;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(p.taps * t.splits_per_tap));
  draft_fc_wgmma_kernel<T, kNorm, kTok, kRows, kBoxes><<<grid, kWgThreads, G::kSmem, s>>>(map, p, t, ws);
  return cudaGetLastError();
}

// Geometry variants (experiment): 0: 128 rows x 1 box, 1: 64 rows x 4 boxes, 2: 64 x 2, 3: 128 x 2.
template <typename T, bool kNorm, int kTok>
cudaError_t launch_geom(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, cudaStream_t s, int splits,
                        int variant) {
  switch (variant) {
    case 1: return launch_wgmma<T, kNorm, kTok, 64, 4>(p, dtype, ws, s, splits);
    case 2: return launch_wgmma<T, kNorm, kTok, 64, 2>(p, dtype, ws, s, splits);
    case 3: return launch_wgmma<T, kNorm, kTok, 128, 2>(p, dtype, ws, s, splits);
    default: return launch_wgmma<T, kNorm, kTok, 128, 1>(p, dtype, ws, s, splits);
  }
}

template <typename T>
cudaError_t launch_wgmma_typed(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, cudaStream_t s,
                               int splits, int variant) {
  const bool norm = p.norm_weight != nullptr;
  if (p.rows <= 16) return norm ? launch_geom<T, true, 16>(p, dtype, ws, s, splits, variant)
                                : launch_geom<T, false, 16>(p, dtype, ws, s, splits, variant);
  if (p.rows <= 32) return norm ? launch_geom<T, true, 32>(p, dtype, ws, s, splits, variant)
                                : launch_geom<T, false, 32>(p, dtype, ws, s, splits, variant);
  return norm ? launch_geom<T, true, 64>(p, dtype, ws, s, splits, variant)
              : launch_geom<T, false, 64>(p, dtype, ws, s, splits, variant);
}

}  // namespace kernels
}  // namespace cuda

int64_t draft_fc_wgmma_zeroed_bytes(int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::wg_n_tiles(out_features, cuda::kernels::kWgMinRows);
  auto a256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  return a256(taps * out_features * kWgPitch * 4) + a256(n_tiles * taps * kWgPitch * 4) + a256(n_tiles * 4);
}

DraftFcWorkspace draft_fc_wgmma_workspace_view(void* zeroed, int taps, int64_t out_features) {
  using cuda::kernels::kWgPitch;
  const int64_t n_tiles = cuda::kernels::wg_n_tiles(out_features, cuda::kernels::kWgMinRows);
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
  return major == 9 && minor == 0 && cuda::tma::encode_fn() != nullptr;
}

bool draft_fc_wgmma_applies(const DraftFcParams& p) {
  return p.rows >= 1 && p.rows <= kDraftFcWgmmaMaxRows && p.elem_size == 2 && p.hidden % 8 == 0 &&
         p.taps <= cuda::kernels::kWgMaxTaps &&
         reinterpret_cast<uintptr_t>(p.weight) % 16 == 0 && p.weight_row_stride % 8 == 0 &&
         p.taps * p.hidden < (int64_t(1) << 31) && p.out_features < (int64_t(1) << 31);
}

int draft_fc_wgmma_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                        int splits_per_tap, int variant) {
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_wgmma_applies(p) || (dtype != DType::BF16 && dtype != DType::F16))
    return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::BF16)
    return cuda::kernels::launch_wgmma_typed<__nv_bfloat16>(p, dtype, ws, s, splits_per_tap, variant);
  return cuda::kernels::launch_wgmma_typed<__half>(p, dtype, ws, s, splits_per_tap, variant);
}

}  // namespace e3
