// The draft fc decode kernel fed by bulk asynchronous copies (cp.async.bulk + mbarrier, sm_90 and later).
//
// Why: the register-streaming kernel (draft_fc_cuda.cu) keeps every weight byte in flight as a per-thread 16-byte
// load, and Nsight Compute showed it limited by the L1's outstanding-miss tracking: 37% of DRAM bandwidth in
// isolation at N=896 with the warps stalled on those loads, where cuBLAS's bulk-copy GEMV reached 63%. Bulk copies
// move whole row slices into shared memory without per-thread loads, so a block keeps many stages in flight.
//
// Work: stream-K over units u = (column tile of 64 rows, tap, slice of kBulkSlice k elements); each block (one per
// SM) takes an equal run of units. A unit's stage holds the tile's 64 weight-row slices, the M <= 8 token rows'
// slices and the norm weight's slice, each one bulk copy issued by a lane of warp 0 and counted on the stage's
// mbarrier. The four warps read their MMA fragments from shared memory (the layout of draft_fc_device.cuh), and after
// each unit warp 0 refills the freed stage with the unit `stages` ahead. At the end of each (tile, tap) run the
// block adds its fp32 partials and sums of squares to the workspace and the unit count to the tile's counter; the
// block that completes a tile runs decode_tile_epilogue.
#include "draft_fc_bulk.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kBulkSlice = 128;                       // k elements per unit (256 bytes of a bf16/fp16 row)
constexpr int kBulkPitch = kBulkSlice * 2 + 64;       // bytes per shared row: = 64 (mod 128), so the two rows of
                                                      // an 8-lane phase of a 16-byte shared load use distinct banks
constexpr int kBulkXRow = kFcRowsPerBlock;            // first token row in a stage (after the 64 weight rows)
constexpr int kBulkGRow = kBulkXRow + kWsTokens;      // the norm weight row
constexpr int kBulkStageBytes = (kBulkGRow + 1) * kBulkPitch;
constexpr int kBulkMaxStages = 8;
constexpr int kBulkBarrierBytes = 128;                // mbarriers ahead of the stages (16-byte aligned stages)
static_assert(kBulkStageBytes % 16 == 0 && kBulkMaxStages * 8 <= kBulkBarrierBytes, "stage layout");

struct BulkTiling {
  int64_t slices_per_tap;  // ceil(H / kBulkSlice)
  int64_t total;           // n_tiles * taps * slices_per_tap
  int64_t per_block;       // units per block
  int stages;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT;\n}" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// Global -> shared bulk copy completing on `bar` (16-byte aligned addresses, size a multiple of 16).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
#endif

template <typename T, bool kNorm>
__global__ void __launch_bounds__(kFcWarps * 32, 1) draft_fc_bulk_kernel(DraftFcParams p, BulkTiling t,
                                                                           DraftFcWorkspace ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(bulk_smem);
  unsigned char* stages = bulk_smem + kBulkBarrierBytes;
  __shared__ unsigned last_flag;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t u_begin = blockIdx.x * t.per_block;
  const int64_t u_end = u_begin + t.per_block < t.total ? u_begin + t.per_block : t.total;
  const int64_t per_tile = p.taps * t.slices_per_tap;

  if (threadIdx.x == 0) {
    for (int s = 0; s < t.stages; ++s) mbar_init(bars + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Warp 0: bulk copies of unit u into stage s, one row slice per lane at a time.
  auto issue = [&](int64_t u, int s) {
    const int64_t seg = u / t.slices_per_tap;
    const int64_t k0 = (u - seg * t.slices_per_tap) * kBulkSlice;
    const int64_t tile = seg / p.taps;
    const int tap = static_cast<int>(seg - tile * p.taps);
    const int64_t left_k = p.hidden - k0;
    const unsigned row_bytes = static_cast<unsigned>((left_k < kBulkSlice ? left_k : kBulkSlice) * sizeof(T));
    const int64_t left_n = p.out_features - tile * kFcRowsPerBlock;
    const int rows_w = static_cast<int>(left_n < kFcRowsPerBlock ? left_n : kFcRowsPerBlock);
    const int rows_x = static_cast<int>(p.rows);
    const int copies = rows_w + rows_x + (kNorm ? 1 : 0);
    unsigned char* st = stages + static_cast<int64_t>(s) * kBulkStageBytes;
    if (lane == 0) mbar_arrive_expect_tx(bars + s, static_cast<unsigned>(copies) * row_bytes);
    __syncwarp();
    for (int r = lane; r < copies; r += 32) {
      const T* src;
      unsigned char* dst;
      if (r < rows_w) {
        src = static_cast<const T*>(p.weight) + (tile * kFcRowsPerBlock + r) * p.weight_row_stride + tap * p.hidden + k0;
        dst = st + r * kBulkPitch;
      } else if (r < rows_w + rows_x) {
        const int m = r - rows_w;
        src = static_cast<const T*>(p.tap(tap)) + m * p.tap_row_stride(tap) + k0;
        dst = st + (kBulkXRow + m) * kBulkPitch;
      } else {
        src = static_cast<const T*>(p.norm_weight) + tap * p.hidden + k0;
        dst = st + kBulkGRow * kBulkPitch;
      }
      bulk_copy(dst, src, row_bytes, bars + s);
    }
  };

  if (warp == 0)
    for (int s = 0; s < t.stages && u_begin + s < u_end; ++s) issue(u_begin + s, s);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float sum_sq = 0.f;
  int64_t run_units = 0;
  for (int64_t u = u_begin, i = 0; u < u_end; ++u, ++i) {
    const int s = static_cast<int>(i % t.stages);
    const int64_t seg = u / t.slices_per_tap;
    const int64_t k0 = (u - seg * t.slices_per_tap) * kBulkSlice;
    const int64_t tile = seg / p.taps;
    const int tap = static_cast<int>(seg - tile * p.taps);
    const int64_t len = p.hidden - k0 < kBulkSlice ? p.hidden - k0 : kBulkSlice;
    const int64_t row_a = tile * kFcRowsPerBlock + warp * 16 + g;
    const bool has_a = row_a < p.out_features, has_b = row_a + 8 < p.out_features, has_x = g < p.rows;
    const unsigned char* st = stages + static_cast<int64_t>(s) * kBulkStageBytes;
    mbar_wait(bars + s, static_cast<unsigned>((i / t.stages) & 1));
#pragma unroll
    for (int j = 0; j < kBulkSlice / kFcChunk; ++j) {
      if (j * kFcChunk >= len) break;  // warp-uniform: the slice ends (H not a multiple of kBulkSlice)
      const int kl = j * kFcChunk + 8 * c;
      const bool in = kl < len;        // H is a multiple of 8: a lane's 8 elements are all in or all out
      const int off = kl * static_cast<int>(sizeof(T));
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 wa = in && has_a ? *reinterpret_cast<const uint4*>(st + (warp * 16 + g) * kBulkPitch + off) : zero;
      const uint4 wb = in && has_b ? *reinterpret_cast<const uint4*>(st + (warp * 16 + g + 8) * kBulkPitch + off) : zero;
      uint4 xv = in && has_x ? *reinterpret_cast<const uint4*>(st + (kBulkXRow + g) * kBulkPitch + off) : zero;
      if (kNorm && in)
        xv = scale8<T>(xv, *reinterpret_cast<const uint4*>(st + kBulkGRow * kBulkPitch + off), sum_sq, warp == 0);
      // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of the weight and activation vectors.
      Mma<T>::run(acc, wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
      Mma<T>::run(acc, wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
    }
    ++run_units;
    __syncthreads();  // every warp is done with stage s
    if (warp == 0 && u + t.stages < u_end) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads before the async refill
      issue(u + t.stages, s);
    }
    if (u + 1 < u_end && (u + 1) / t.slices_per_tap == seg) continue;

    // End of this block's run of (tile, tap): partials to the workspace.
    float* ws_acc = ws.acc + static_cast<int64_t>(tap) * p.out_features * kWsTokens;
    const int64_t t0 = 2 * c;
    if (has_a) {
      if (t0 < p.rows) atomicAdd(ws_acc + row_a * kWsTokens + t0, acc[0]);
      if (t0 + 1 < p.rows) atomicAdd(ws_acc + row_a * kWsTokens + t0 + 1, acc[1]);
    }
    if (has_b) {
      if (t0 < p.rows) atomicAdd(ws_acc + (row_a + 8) * kWsTokens + t0, acc[2]);
      if (t0 + 1 < p.rows) atomicAdd(ws_acc + (row_a + 8) * kWsTokens + t0 + 1, acc[3]);
    }
    if (kNorm && warp == 0) {
      // Lanes 4g..4g+3 hold parts of token g's sum over this run's k range.
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, 1);
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, 2);
      if (c == 0 && has_x) atomicAdd(ws.tile_sum_sq + (tile * p.taps + tap) * kWsTokens + g, sum_sq);
    }
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    sum_sq = 0.f;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned add = static_cast<unsigned>(run_units);
      last_flag = atomicAdd(ws.counters + tile, add) + add == static_cast<unsigned>(per_tile) ? 1u : 0u;
    }
    run_units = 0;
    __syncthreads();
    if (last_flag) {
      __threadfence();
      decode_tile_epilogue<T, kNorm>(p, ws, tile);
    }
  }
#else
  __trap();  // launched only on sm_90 and later (draft_fc_bulk_supported)
#endif
}

template <typename T, bool kNorm>
cudaError_t launch_bulk_kernel(const DraftFcParams& p, const BulkTiling& t, int64_t grid, const DraftFcWorkspace& ws,
                               cudaStream_t s) {
  const size_t smem = kBulkBarrierBytes + static_cast<size_t>(t.stages) * kBulkStageBytes;
  // The opt-in shared-memory size is a per-device function attribute: set it once per device and size.
  static size_t set_for[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev >= 64 || set_for[dev] < smem) {
    e = cudaFuncSetAttribute(draft_fc_bulk_kernel<T, kNorm>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    if (dev < 64) set_for[dev] = smem;
  }
  draft_fc_bulk_kernel<T, kNorm><<<static_cast<unsigned>(grid), kFcWarps * 32, smem, s>>>(p, t, ws);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda

bool draft_fc_bulk_supported() {
  return cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9;
}

int draft_fc_decode_bulk_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                              int stages) {
  using namespace cuda::kernels;
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (p.rows > kWsTokens) return static_cast<int>(cudaErrorInvalidValue);
  // As many stages as the opt-in shared memory allows (8 on sm_90/sm_100, 4 on sm_120's 99 KB), or `stages`.
  const int optin = cuda::current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
  int fit = (optin - kBulkBarrierBytes - 1024) / kBulkStageBytes;
  fit = fit > kBulkMaxStages ? kBulkMaxStages : fit;
  BulkTiling t;
  t.stages = stages > 0 && stages < fit ? stages : fit;
  if (t.stages < 2) return static_cast<int>(cudaErrorInvalidConfiguration);
  const int64_t n_tiles = (p.out_features + kFcRowsPerBlock - 1) / kFcRowsPerBlock;
  t.slices_per_tap = (p.hidden + kBulkSlice - 1) / kBulkSlice;
  t.total = n_tiles * p.taps * t.slices_per_tap;
  const int64_t sms = cuda::current_device_attribute(cudaDevAttrMultiProcessorCount, 132);
  t.per_block = (t.total + sms - 1) / sms;
  const int64_t grid = (t.total + t.per_block - 1) / t.per_block;
  auto s = static_cast<cudaStream_t>(stream);
  const bool norm = p.norm_weight != nullptr;
  switch (dtype) {
    case DType::BF16:
      return norm ? launch_bulk_kernel<__nv_bfloat16, true>(p, t, grid, ws, s)
                  : launch_bulk_kernel<__nv_bfloat16, false>(p, t, grid, ws, s);
    case DType::F16:
      return norm ? launch_bulk_kernel<__half, true>(p, t, grid, ws, s) : launch_bulk_kernel<__half, false>(p, t, grid, ws, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace e3
