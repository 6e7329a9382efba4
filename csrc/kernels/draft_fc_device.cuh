// Device-side pieces shared by the draft fc decode kernels (split-K in draft_fc_cuda.cu, cluster in
// draft_fc_cluster_cuda.cu): the MMA wrappers, the x * g helper, one warp's weight stream, and the split-K epilogue
// of one column tile. Torch-free.
//
// Fragment layout of every decode kernel. The weight W [N, K*H] is the MMA's A operand (16 rows of N per warp) and
// the activations are the B operand (8 token rows), so tensor cores serve M = 1..8 with no wasted weight bytes
// (mma.sync m16n8k16: sm_80 and later, so the same code serves sm_90a, sm_100a and sm_120a). Each lane holds 16
// contiguous bytes of a weight row; the k order inside a 32-wide chunk is permuted so those 8 elements are exactly
// the A fragment of two MMA steps, and the activation fragment uses the same permutation, so no shuffles are
// needed. The dot product is permutation-invariant, so the result is exact.
#pragma once

#include <type_traits>

#include "cuda_common.cuh"
#include "draft_fc.h"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kFcWarps = 4;                  // warps per block, 16 weight rows each
constexpr int kFcRowsPerBlock = kFcWarps * 16;
// Column tiles of kFcRowsPerBlock weight rows (output features) covering N: the decode kernels' tile grid and the
// workspace's counter and sums-of-squares arrays.
__host__ __device__ constexpr int64_t decode_n_tiles(int64_t out_features) {
  return (out_features + kFcRowsPerBlock - 1) / kFcRowsPerBlock;
}
constexpr int kFcChunk = 32;                 // k elements per lane group step (4 lanes x 8 elements)
constexpr int kMmaTokens = 8;                // token rows of one MMA (its B operand): one token group
constexpr int kWsTokens = kDraftFcDecodeMaxRows;  // workspace row pitch: every token group of the decode kernel
static_assert(kWsTokens % kMmaTokens == 0 && kWsTokens % 4 == 0, "workspace pitch: whole token groups, float4s");
// Resident blocks per SM the register decode kernels are built for (their __launch_bounds__): 4 (128 registers a
// thread) with one token group, 3 (168 registers) with two, whose activation vectors take the extra registers.
__host__ __device__ constexpr int decode_blocks_per_sm(int groups) { return groups == 1 ? 4 : 3; }
// Weight chunks in flight per warp (a step's loads precede its MMAs), as many as those registers hold: each chunk
// holds two weight vectors, one activation vector per token group and, with the norm, one norm-weight vector.
__host__ __device__ constexpr int decode_unroll(bool norm, int groups) {
  return groups == 1 ? (norm ? 6 : 8) : (norm ? 6 : 7);
}

// The one place a call maps to the register decode kernels' template arguments: calls
// f(std::integral_constant<bool, kNorm>{}, std::integral_constant<int, kGroups>{}) with kNorm = a norm weight is
// given and kGroups = the token groups of 8 that M needs (1, or 2 above 8 rows), and returns what f returns.
template <typename F>
__host__ auto with_norm_and_groups(const DraftFcParams& p, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  const bool two = p.rows > kMmaTokens;
  if (p.norm_weight != nullptr) return two ? f(std::true_type{}, Two{}) : f(std::true_type{}, One{});
  return two ? f(std::false_type{}, Two{}) : f(std::false_type{}, One{});
}

// One m16n8k16 MMA accumulating in place, d += A * B, with 16-bit operands of PTX type `ab` ("bf16" or "f16": the
// only part of the instruction that depends on T). No `volatile`: the MMA has outputs and no side effects, so the
// compiler may schedule loads around it.
#define E3_MMA_M16N8K16(ab, d, a0, a1, a2, a3, b0, b1)                                                         \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." ab "." ab ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "   \
      "{%0,%1,%2,%3};\n"                                                                                      \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                        \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "bf16 or fp16 operands");
  if constexpr (std::is_same<T, __nv_bfloat16>::value) E3_MMA_M16N8K16("bf16", d, a0, a1, a2, a3, b0, b1);
  else E3_MMA_M16N8K16("f16", d, a0, a1, a2, a3, b0, b1);
}
#undef E3_MMA_M16N8K16

// Two elements packed in one 32-bit word <-> floats.
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t w);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, 4);
  return __half22float2(h);
}
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &v, 4);
  return w;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &v, 4);
  return w;
}

// x * g on 8 elements (one 16-byte vector), rounded back to T; adds sum(x^2) to sum_sq when `count`.
template <typename T>
__device__ __forceinline__ uint4 scale8(uint4 xv, uint4 gv, float& sum_sq, bool count) {
  const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = unpack2<T>(xw[i]), b = unpack2<T>(gw[i]);
    if (count) sum_sq += a.x * a.x + a.y * a.y;
    o[i] = pack2<T>(a.x * b.x, a.y * b.y);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Weight stream: read once through the read-only path, not kept in L1, and fetched into L2 in 256-byte blocks (a
// warp step reads 384-512 contiguous bytes of each of its 16 rows). The 256-byte fetch measured 4-5% faster than
// 32-byte sector fetches at N=7168 on the H200 (bench_draft_fc, docs/performance.md); the eviction hint made no
// difference.
__device__ __forceinline__ uint4 load_weight16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp's weight stream, shared by the register decode kernels (split-K and cluster): the warp's 16 weight rows
// (row_a = its first row + lane / 4, and row_a + 8) over k in [k_begin, k_end) of tap `tap`, kUnroll 32-wide chunks
// per step (the kernel's choice for its register budget), all of a step's loads issued before its MMAs; each
// weight fragment feeds one MMA per token group of 8 (acc[q]: rows row_a, row_a + 8 x tokens 8q + 2c, 8q + 2c + 1).
// kNorm: g multiplies the activations as they are loaded, and with count_sq the lane adds token (8q + lane / 4)'s
// x^2 over its elements to sum_sq[q].
template <typename T, bool kNorm, int kGroups, int kUnroll>
__device__ __forceinline__ void decode_stream(const DraftFcParams& p, int tap, int64_t row_a, int64_t k_begin,
                                              int64_t k_end, bool count_sq, float (&acc)[kGroups][4],
                                              float (&sum_sq)[kGroups]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t row_b = row_a + 8;
  const bool has_a = row_a < p.out_features, has_b = row_b < p.out_features;
  const T* w_a = static_cast<const T*>(p.weight) + row_a * p.weight_row_stride + tap * p.hidden;
  const T* w_b = static_cast<const T*>(p.weight) + row_b * p.weight_row_stride + tap * p.hidden;
  const T* x[kGroups];  // this lane's token rows: g, g + 8
  bool has_x[kGroups];
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int tok = q * kMmaTokens + g;
    has_x[q] = tok < p.rows;
    x[q] = static_cast<const T*>(p.tap(tap)) + (has_x[q] ? tok : 0) * p.tap_row_stride(tap);
  }
  const T* gw = static_cast<const T*>(p.norm_weight) + tap * p.hidden;

  for (int64_t k0 = k_begin; k0 < k_end; k0 += kFcChunk * kUnroll) {
    // Every load of the step (weights, activations, norm weights) is issued before its first MMA: a norm-weight
    // load left next to its use serialised one L2 round trip per chunk (a 30% slower kernel on the H200).
    uint4 wa[kUnroll], wb[kUnroll], xv[kUnroll][kGroups], gv[kNorm ? kUnroll : 1];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * kFcChunk + 8 * c;  // this lane's 8 contiguous elements
      const bool in = k < k_end;
      wa[u] = in && has_a ? load_weight16(w_a + k) : make_uint4(0, 0, 0, 0);
      wb[u] = in && has_b ? load_weight16(w_b + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < kGroups; ++q)
        xv[u][q] = in && has_x[q] ? __ldg(reinterpret_cast<const uint4*>(x[q] + k)) : make_uint4(0, 0, 0, 0);
      if (kNorm) gv[u] = in ? __ldg(reinterpret_cast<const uint4*>(gw + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        uint4 xu = xv[u][q];
        if (kNorm) xu = scale8<T>(xu, gv[kNorm ? u : 0], sum_sq[q], count_sq);
        // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of the weight and activation vectors.
        mma_m16n8k16<T>(acc[q], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xu.x, xu.y);
        mma_m16n8k16<T>(acc[q], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xu.z, xu.w);
      }
    }
  }
}

// A token's sum of x^2 over a warp: lanes 4g..4g+3 hold parts of token g's (their k elements); after this every
// lane of the quad holds the quad's total.
__device__ __forceinline__ float quad_sum(float s) {
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  return s + __shfl_xor_sync(0xffffffffu, s, 2);
}

// Split-K epilogue of one column tile, run by every thread of the block that finished the tile last (after it
// acquired the tile's counter): y = sum_tap rrms(tap) * acc(tap) + bias, rounded once into out; the tile's workspace
// (partial sums, sums of squares, counter) is zeroed again for the next call. Each thread owns 4 tokens of one row
// (a float4 of the [row][kWsTokens] workspace) and issues every load (all taps' partials and sums of squares)
// before any store: loads and stores interleaved per tap and per (row, token) would make the epilogue a chain of
// dependent L2 round trips growing with M (docs/performance.md).
template <typename T, bool kNorm>
__device__ void decode_tile_epilogue(const DraftFcParams& p, const DraftFcWorkspace& ws, int64_t tile) {
  constexpr int kQuads = kWsTokens / 4;  // float4s per workspace row
  const float4* ss = reinterpret_cast<const float4*>(ws.tile_sum_sq + tile * p.taps * kWsTokens);
  const int64_t left = p.out_features - tile * kFcRowsPerBlock;
  const int64_t rows_here = left < kFcRowsPerBlock ? left : kFcRowsPerBlock;
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  const float inv_h = 1.0f / static_cast<float>(p.hidden);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = threadIdx.x; i < rows_here * kQuads; i += blockDim.x) {
    const int64_t n = tile * kFcRowsPerBlock + i / kQuads;
    const int quad = static_cast<int>(i % kQuads);
    const int tok0 = quad * 4;
    if (tok0 >= p.rows) continue;  // tokens never written: their partial sums are still zero
    const float b = bias != nullptr ? to_f(bias[n]) : 0.f;
    float4* acc = reinterpret_cast<float4*>(ws.acc + n * kWsTokens + tok0);
    const int64_t tap_pitch = p.out_features * kQuads;  // float4s per tap
    float y[4] = {b, b, b, b};
#pragma unroll 4
    for (int tp = 0; tp < p.taps; ++tp) {  // loads only: the taps' round trips overlap
      const float4 a = __ldcg(acc + tp * tap_pitch);
      if (kNorm) {
        const float4 q = __ldcg(ss + tp * kQuads + quad);
        y[0] += rsqrtf(q.x * inv_h + p.eps) * a.x;
        y[1] += rsqrtf(q.y * inv_h + p.eps) * a.y;
        y[2] += rsqrtf(q.z * inv_h + p.eps) * a.z;
        y[3] += rsqrtf(q.w * inv_h + p.eps) * a.w;
      } else {
        y[0] += a.x;
        y[1] += a.y;
        y[2] += a.z;
        y[3] += a.w;
      }
    }
    for (int tp = 0; tp < p.taps; ++tp) __stcg(acc + tp * tap_pitch, zero);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (tok0 + j < p.rows) out[(tok0 + j) * p.out_row_stride + n] = from_f<T>(y[j]);
  }
  if (kNorm) {
    __syncthreads();  // every read of this tile's sums done before they are cleared
    float* tile_ss = ws.tile_sum_sq + tile * p.taps * kWsTokens;
    for (int64_t i = threadIdx.x; i < p.taps * kWsTokens; i += blockDim.x) __stcg(tile_ss + i, 0.f);
  }
  if (threadIdx.x == 0) ws.counters[tile] = 0;
}

// Adds `units` to a tile's counter at gpu scope with release and acquire semantics, returning the old value. Called
// by one thread after a __syncthreads(): the release covers every thread's partial-sum atomics before the barrier
// (cumulativity), the acquire every read of the epilogue after the next barrier, so no thread needs its own fence
// (each __threadfence() was an sc fence).
__device__ __forceinline__ unsigned counter_add_acq_rel(unsigned* counter, unsigned units) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(units) : "memory");
  return old;
}

// The end of a block's run over one (column tile, tap), shared by both decode kernels; every thread of the block
// calls it. Adds the MMA partials (acc[q]: rows row_a and row_a + 8, tokens 8q + 2c and 8q + 2c + 1 of this lane)
// to the workspace and, with the norm, warp 0's sums of x^2 (lanes 4g..4g+3 hold parts of token 8q + g's) to the
// tile's sums of squares; then adds `units` to the tile's counter, and the block that brings it to `tile_units` runs
// the epilogue.
template <typename T, bool kNorm, int kGroups>
__device__ void decode_add_partials(const DraftFcParams& p, const DraftFcWorkspace& ws, int64_t tile, int tap,
                                    int64_t row_a, const float (&acc)[kGroups][4], const float (&sum_sq)[kGroups],
                                    unsigned units, unsigned tile_units) {
  static_assert(kGroups * kMmaTokens <= kWsTokens, "the workspace holds every token group");
  __shared__ unsigned last_flag;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  float* ws_acc = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWsTokens;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int64_t t0 = q * kMmaTokens + 2 * c;
    if (row_a < p.out_features) {
      if (t0 < p.rows) atomicAdd(ws_acc + row_a * kWsTokens + t0, acc[q][0]);
      if (t0 + 1 < p.rows) atomicAdd(ws_acc + row_a * kWsTokens + t0 + 1, acc[q][1]);
    }
    if (row_a + 8 < p.out_features) {
      if (t0 < p.rows) atomicAdd(ws_acc + (row_a + 8) * kWsTokens + t0, acc[q][2]);
      if (t0 + 1 < p.rows) atomicAdd(ws_acc + (row_a + 8) * kWsTokens + t0 + 1, acc[q][3]);
    }
    if (kNorm && warp == 0) {
      const float s = quad_sum(sum_sq[q]);
      const int tok = q * kMmaTokens + g;
      if (c == 0 && tok < p.rows) atomicAdd(ws.tile_sum_sq + (tile * p.taps + tap) * kWsTokens + tok, s);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) last_flag = counter_add_acq_rel(ws.counters + tile, units) + units == tile_units ? 1u : 0u;
  __syncthreads();
  if (last_flag == 0u) return;
  decode_tile_epilogue<T, kNorm>(p, ws, tile);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace e3
