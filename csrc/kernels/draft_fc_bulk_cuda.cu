// The draft fc decode kernel fed by the tensor memory accelerator (TMA: cp.async.bulk.tensor + mbarrier, sm_90+).
//
// Why: the register-streaming kernel (draft_fc_cuda.cu) keeps every weight byte in flight as a per-thread 16-byte
// load, and Nsight Compute showed it limited by the L1's outstanding-miss tracking: 37% of DRAM bandwidth in
// isolation at N=896 with the warps stalled on those loads, where cuBLAS's TMA-fed GEMV reached 63%. Status: opt-in
// (DraftFcDecodeConfig::bulk, ops._set_draft_fc_decode_bulk), because on the H200 it is not faster yet (20.4 against
// 17.5 us at M=1 N=896, 107.6 against 91.4 at N=7168; benchmarks/NOTES.md has the versions: one 1-D copy per
// 256-byte row slice ran at 0.5 TB/s, 64x64 boxes at 0.9 TB/s, these 64x256 boxes at 1.9-2.9 TB/s, fastest with
// few stages, which points at DRAM page locality across 64 rows).
//
// Work: stream-K over units u = (column tile of 64 rows, tap, slice of kBulkSlice = 256 k elements); each block (one
// per SM) takes an equal run of units, `stages` of them in flight in shared memory, counted on one mbarrier per
// stage. A unit is one 2-D tensor copy of the 64 x 256 weight box, one of the 8 x 256 token box and one of the norm
// slice. The four warps read their MMA fragments (the layout of draft_fc_device.cuh) from the stage; after each unit
// thread 0 refills the freed stage with the unit `stages` ahead. The tensor copies zero-fill rows >= N, token rows
// >= M and columns past K*H; columns of the next tap inside a box are masked here. At the end of each (tile, tap) run
// the block adds its fp32 partials and sums of squares to the workspace and the unit count to the tile's counter;
// the block that completes a tile runs decode_tile_epilogue. Packed activations only (one tensor map).
#include <cuda.h>
#include <cudaTypedefs.h>

#include "draft_fc_bulk.h"
#include "draft_fc_device.cuh"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kBulkSlice = 256;                       // k elements per unit (the largest tensor-copy box row)
constexpr int kBulkRowBytes = kBulkSlice * 2;         // bytes of one box row in shared memory (bf16/fp16)
constexpr int kBulkWBytes = kFcRowsPerBlock * kBulkRowBytes;  // weight box: 64 rows
constexpr int kBulkXBytes = kMmaTokens * kBulkRowBytes;       // token box: 8 rows (one token group)
constexpr int kBulkGBytes = kBulkRowBytes;                    // norm-weight box
constexpr int kBulkStageBytes = (kBulkWBytes + kBulkXBytes + kBulkGBytes + 1023) / 1024 * 1024;
constexpr int kBulkMaxStages = 16;
constexpr int kBulkBarrierBytes = 1024;               // mbarriers ahead of the stages, stages 1024-aligned
static_assert(kBulkStageBytes % 1024 == 0 && kBulkMaxStages * 8 <= kBulkBarrierBytes, "stage layout");

struct BulkTiling {
  int64_t slices_per_tap;  // ceil(H / kBulkSlice)
  int64_t total;           // n_tiles * taps * slices_per_tap
  int64_t per_block;       // units per block
  int stages;
};

struct BulkMaps {
  CUtensorMap w;  // [N, K*H] weight, box 64 x kBulkSlice
  CUtensorMap x;  // [M, K*H] packed activations, box 8 x kBulkSlice
  CUtensorMap g;  // [K*H] norm weights, box kBulkSlice (unused without a norm)
};

// Byte offset of (row, byte) in a box (dense rows, no swizzle).
__device__ __forceinline__ int box_offset(int row, int byte) { return row * kBulkRowBytes + byte; }

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
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_1d(void* dst, const CUtensorMap* map, int c0, uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];" ::
                   "r"(smem_u32(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(smem_u32(bar))
               : "memory");
}
#endif

template <typename T, bool kNorm>
__global__ void __launch_bounds__(kFcWarps * 32, 1) draft_fc_bulk_kernel(const __grid_constant__ BulkMaps maps,
                                                                           DraftFcParams p, BulkTiling t,
                                                                           DraftFcWorkspace ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) unsigned char bulk_smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(bulk_smem);
  unsigned char* stages = bulk_smem + kBulkBarrierBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t u_begin = blockIdx.x * t.per_block;
  const int64_t u_end = u_begin + t.per_block < t.total ? u_begin + t.per_block : t.total;
  const int64_t per_tile = p.taps * t.slices_per_tap;
  const unsigned unit_bytes = static_cast<unsigned>(kBulkWBytes + kBulkXBytes + (kNorm ? kBulkGBytes : 0));

  if (threadIdx.x == 0) {
    for (int s = 0; s < t.stages; ++s) mbar_init(bars + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Thread 0: the tensor copies of unit u into stage s.
  auto issue = [&](int64_t u, int s) {
    const int64_t seg = u / t.slices_per_tap;
    const int k0 = static_cast<int>((u - seg * t.slices_per_tap) * kBulkSlice);
    const int64_t tile = seg / p.taps;
    const int col = static_cast<int>(seg - tile * p.taps) * static_cast<int>(p.hidden) + k0;
    unsigned char* st = stages + static_cast<int64_t>(s) * kBulkStageBytes;
    mbar_arrive_expect_tx(bars + s, unit_bytes);
    tma_2d(st, &maps.w, col, static_cast<int>(tile * kFcRowsPerBlock), bars + s);
    tma_2d(st + kBulkWBytes, &maps.x, col, 0, bars + s);
    if (kNorm) tma_1d(st + kBulkWBytes + kBulkXBytes, &maps.g, col, bars + s);
  };
  if (threadIdx.x == 0)
    for (int s = 0; s < t.stages && u_begin + s < u_end; ++s) issue(u_begin + s, s);

  float acc[1][4] = {};  // one token group (M <= 8)
  float sum_sq[1] = {};
  int64_t run_units = 0;
  const int wrow = warp * 16 + g;  // this lane's weight rows in the box: wrow, wrow + 8
  for (int64_t u = u_begin, i = 0; u < u_end; ++u, ++i) {
    const int s = static_cast<int>(i % t.stages);
    const int64_t seg = u / t.slices_per_tap;
    const int64_t k0 = (u - seg * t.slices_per_tap) * kBulkSlice;
    const int64_t tile = seg / p.taps;
    const int tap = static_cast<int>(seg - tile * p.taps);
    const int64_t len = p.hidden - k0 < kBulkSlice ? p.hidden - k0 : kBulkSlice;  // past it: the next tap's columns
    const unsigned char* st = stages + static_cast<int64_t>(s) * kBulkStageBytes;
    mbar_wait(bars + s, static_cast<unsigned>((i / t.stages) & 1));
#pragma unroll
    for (int j = 0; j < kBulkSlice / kFcChunk; ++j) {
      const int kl = j * kFcChunk + 8 * c;
      const int b = kl * static_cast<int>(sizeof(T));
      uint4 wa = *reinterpret_cast<const uint4*>(st + box_offset(wrow, b));
      uint4 wb = *reinterpret_cast<const uint4*>(st + box_offset(wrow + 8, b));
      uint4 xv = *reinterpret_cast<const uint4*>(st + kBulkWBytes + box_offset(g, b));
      if (kl >= len) wa = wb = xv = make_uint4(0, 0, 0, 0);  // H a multiple of 8: a lane is all in or all out
      if (kNorm)
        xv = scale8<T>(xv, *reinterpret_cast<const uint4*>(st + kBulkWBytes + kBulkXBytes + b), sum_sq[0], warp == 0);
      // Step s uses this lane's elements [4s, 4s+4): words 2s, 2s+1 of the weight and activation vectors.
      Mma<T>::run(acc[0], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
      Mma<T>::run(acc[0], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
    }
    ++run_units;
    __syncthreads();  // every warp is done with stage s
    if (threadIdx.x == 0 && u + t.stages < u_end) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads before the async refill
      issue(u + t.stages, s);
    }
    if (u + 1 < u_end && (u + 1) / t.slices_per_tap == seg) continue;

    // End of this block's run of (tile, tap): the tile is complete after all its taps * slices_per_tap units.
    decode_add_partials<T, kNorm, 1>(p, ws, tile, tap, tile * kFcRowsPerBlock + wrow, acc, sum_sq,
                                     static_cast<unsigned>(run_units), static_cast<unsigned>(per_tile));
    acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
    sum_sq[0] = 0.f;
    run_units = 0;
  }
#else
  __trap();  // launched only on sm_90 and later (draft_fc_bulk_supported)
#endif
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major [rows, cols] map (row pitch `pitch_bytes`) with a box of box_rows x kBulkSlice elements, no swizzle;
// or 1-D over `cols` when rows == 0.
bool encode_map(CUtensorMap* m, CUtensorMapDataType type, const void* base, uint64_t cols, uint64_t rows,
                uint64_t pitch_bytes, uint32_t box_rows) {
  auto fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {pitch_bytes};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBulkSlice), box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const bool one_d = rows == 0;
  return fn(m, type, one_d ? 1u : 2u, const_cast<void*>(base), dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, bool kNorm>
cudaError_t launch_bulk_kernel(const BulkMaps& maps, const DraftFcParams& p, const BulkTiling& t, int64_t grid,
                               const DraftFcWorkspace& ws, cudaStream_t s) {
  const size_t smem = static_cast<size_t>(draft_fc_bulk_dynamic_smem_bytes(t.stages));
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
  draft_fc_bulk_kernel<T, kNorm><<<static_cast<unsigned>(grid), kFcWarps * 32, smem, s>>>(maps, p, t, ws);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda

int draft_fc_bulk_stages(int requested, int optin_smem_bytes) {
  using namespace cuda::kernels;
  // What the opt-in size leaves after the barriers and up to 1 KB of the kernel's static shared memory.
  int fit = (optin_smem_bytes - kBulkBarrierBytes - 1024) / kBulkStageBytes;
  fit = fit > kBulkMaxStages ? kBulkMaxStages : fit;
  return requested > 0 && requested < fit ? requested : fit;
}

int64_t draft_fc_bulk_dynamic_smem_bytes(int stages) {
  using namespace cuda::kernels;
  return kBulkBarrierBytes + static_cast<int64_t>(stages) * kBulkStageBytes;
}

bool draft_fc_bulk_supported() {
  return cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9 &&
         cuda::kernels::encode_fn() != nullptr;
}

bool draft_fc_bulk_applies(const DraftFcParams& p) {
  // One tensor map for the activations: the packed input; every base and pitch 16-byte aligned (the ops check it).
  return p.x_base != nullptr && p.rows <= cuda::kernels::kMmaTokens && p.taps * p.hidden < (int64_t(1) << 31) &&
         p.out_features < (int64_t(1) << 31);
}

int draft_fc_decode_bulk_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                              int stages) {
  using namespace cuda::kernels;
  if (p.rows == 0 || p.out_features == 0) return 0;
  if (!draft_fc_bulk_applies(p) || (dtype != DType::BF16 && dtype != DType::F16))
    return static_cast<int>(cudaErrorInvalidValue);
  const int optin = cuda::current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
  BulkTiling t;
  t.stages = draft_fc_bulk_stages(stages, optin);
  if (t.stages < 2) return static_cast<int>(cudaErrorInvalidConfiguration);
  const int64_t n_tiles = decode_n_tiles(p.out_features);
  t.slices_per_tap = (p.hidden + kBulkSlice - 1) / kBulkSlice;
  t.total = n_tiles * p.taps * t.slices_per_tap;
  const int64_t sms = cuda::sm_count();
  t.per_block = (t.total + sms - 1) / sms;
  const int64_t grid = (t.total + t.per_block - 1) / t.per_block;

  const CUtensorMapDataType type =
      dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const uint64_t width = static_cast<uint64_t>(p.taps * p.hidden);
  BulkMaps maps;
  memset(&maps, 0, sizeof(maps));
  if (!encode_map(&maps.w, type, p.weight, width, static_cast<uint64_t>(p.out_features),
                  static_cast<uint64_t>(p.weight_row_stride) * 2, kFcRowsPerBlock) ||
      !encode_map(&maps.x, type, p.x_base, width, static_cast<uint64_t>(p.rows),
                  static_cast<uint64_t>(p.x_row_stride[0]) * 2, kMmaTokens) ||
      (p.norm_weight != nullptr && !encode_map(&maps.g, type, p.norm_weight, width, 0, 0, 1)))
    return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  const bool norm = p.norm_weight != nullptr;
  switch (dtype) {
    case DType::BF16:
      return norm ? launch_bulk_kernel<__nv_bfloat16, true>(maps, p, t, grid, ws, s)
                  : launch_bulk_kernel<__nv_bfloat16, false>(maps, p, t, grid, ws, s);
    default:
      return norm ? launch_bulk_kernel<__half, true>(maps, p, t, grid, ws, s)
                  : launch_bulk_kernel<__half, false>(maps, p, t, grid, ws, s);
  }
}

}  // namespace e3
