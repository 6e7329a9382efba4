// The P2P packed gather kernel (protocol in gather.h). Never uses NVLink multicast.
#include "cuda_common.cuh"
#include "gather.h"

namespace e3 {
namespace cuda {
namespace kernels {

constexpr int kGatherThreads = 256;

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void red_add_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// A plain (non-atomic) store seen at system scope: the flags signal's only write to a peer's flag area.
__device__ __forceinline__ void store_relaxed_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Release fence at system scope: this thread's stores (peer memory included) are acknowledged before anything it
// writes next. acq_rel rather than __threadfence_system()'s sc: same guarantee for a release pattern, lighter barrier.
__device__ __forceinline__ void fence_release_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Gives up gather n after a failed wait: writes the error word once (the first failure wins; the fields before the
// code, so a host that sees the code sees them), then either traps (g.trap: the context is lost, so nothing this
// rank computed afterwards can be mistaken for gathered rows) or sets this rank's broken bit, after which every
// launch on this rank does nothing (gather.h). Threads that fail together may each get here: every write is a value
// a failure could report.
__device__ void report_timeout(const GatherParams& g, int code, int peer, unsigned long long n) {
  volatile int* e = g.error;
  if (e[0] == 0) {
    e[1] = peer;
    e[2] = code;
    e[3] = static_cast<int>(n);
    __threadfence_system();
    e[0] = code;
  }
  __threadfence_system();  // the error word is in host memory before the trap ends the context
  if (g.trap) __trap();
  atomicOr(g.flags[g.rank] + kGatherFlagTicket, kGatherTicketBroken);
}

// Spins until *p >= target; false on timeout. The short sleep keeps the poll from hammering L2 while adding at most
// a fraction of a microsecond to the wake-up. *seen: the last value read.
__device__ bool wait_at_least(const unsigned long long* p, unsigned long long target, unsigned long long timeout_ns,
                              unsigned long long* seen = nullptr) {
  unsigned long long v = load_acquire_sys(p);
  if (v < target) {
    const unsigned long long start = global_timer_ns();
    while ((v = load_acquire_sys(p)) < target) {
      if (global_timer_ns() - start > timeout_ns) {
        if (seen != nullptr) *seen = v;
        return false;
      }
      __nanosleep(32);
    }
  }
  if (seen != nullptr) *seen = v;
  return true;
}

// The waits of one thread, error reported on failure.
__device__ bool wait_or_report(const unsigned long long* p, unsigned long long target, const GatherParams& g,
                               int code, int peer, unsigned long long n) {
  if (wait_at_least(p, target, g.timeout_ns)) return true;
  report_timeout(g, code, peer, n);
  return false;
}

// Flags signal, step 3 (block 0, every thread): waits until every block of every peer's gather n has written into
// this rank's output. First one thread per peer reads the peer's grid size from its slot 0 (or finds the peer
// already past gather n: then all its gather-n blocks have signalled), then the block's threads share the
// (peer, block) slots. Returns the same value on every thread.
__device__ bool wait_flag_slots(const GatherParams& g, unsigned long long n) {
  __shared__ int peer_blocks[kGatherMaxRanks];
  const unsigned long long* slots = g.flags[g.rank] + kGatherFlagSlots;
  const unsigned long long want = n << kGatherSlotShift;
  bool ok = true;
  if (threadIdx.x < g.world) {
    const int p = threadIdx.x;
    int blocks = 0;
    if (p != g.rank) {
      unsigned long long v = 0;
      ok = wait_at_least(slots + p * kGatherMaxBlocks, want, g.timeout_ns, &v);
      if (!ok) {
        report_timeout(g, kGatherErrArriveTimeout, p, n);
      } else if ((v >> kGatherSlotShift) == n) {
        blocks = static_cast<int>(v & ((1ull << kGatherSlotShift) - 1));
        if (blocks < 1 || blocks > kGatherMaxBlocks) {
          report_timeout(g, kGatherErrBadSlot, p, n);
          ok = false;
        }
      }
    }
    // Slots 1.. of this peer still to poll (slot 0 is read; none if the peer is already past gather n).
    peer_blocks[p] = ok && blocks > 1 ? blocks - 1 : 0;
  }
  if (!__syncthreads_and(ok)) return false;
  int total = 0;
  for (int p = 0; p < g.world; ++p) total += peer_blocks[p];
  for (int i = threadIdx.x; i < total && ok; i += blockDim.x) {
    int p = 0, rest = i;  // item i -> (peer p, slot 1 + rest)
    while (rest >= peer_blocks[p]) rest -= peer_blocks[p++];
    ok = wait_or_report(slots + p * kGatherMaxBlocks + 1 + rest, want, g, kGatherErrArriveTimeout, p, n);
  }
  return __syncthreads_and(ok) != 0;
}

// Loads in flight per thread: each thread loads kGatherUnroll vectors of a row piece, then stores each of them to
// every rank's output. The source is read once for all destinations, and enough 16-byte stores are in flight per
// SM to keep NVLink busy (one load, then one store, per thread left it at about half of NCCL's rate).
constexpr int kGatherUnroll = 4;

// Work unit: a piece of one (row, segment) of at most blockDim * kGatherUnroll vectors; pieces of a segment are
// equal to within one vector, so small T still spreads over every block. Index math is per unit, not per vector.
struct GatherUnits {
  int64_t vec_per_seg, pieces, piece_len, count;
};
__host__ __device__ inline GatherUnits gather_units(const GatherParams& g, int64_t vec_elems, int64_t threads) {
  GatherUnits u;
  u.vec_per_seg = g.seg_len / vec_elems;
  const int64_t per_piece_max = threads * kGatherUnroll;
  u.pieces = (u.vec_per_seg + per_piece_max - 1) / per_piece_max;
  u.piece_len = u.pieces > 0 ? (u.vec_per_seg + u.pieces - 1) / u.pieces : 0;
  u.count = g.local_rows * g.segments * u.pieces;
  return u;
}

template <typename Vec, bool kFlags>
__global__ void __launch_bounds__(kGatherThreads) gather_p2p_kernel(GatherParams g, int64_t vec_elems) {
  __shared__ unsigned long long n_shared;
  __shared__ int go_shared;
  unsigned long long* my_flags = g.flags[g.rank];
  // Step 0 (gather.h): the gather number from this block's share of the ticket, the same for every block of this
  // launch whatever their start order; 0 when an earlier gather of this rank gave up. Only thread 0 holds n until
  // the block's first __syncthreads (in the first unit, or before the signals) shares it.
  unsigned long long n = 0;
  if (threadIdx.x == 0) {
    const unsigned long long share = kGatherArriveUnit / gridDim.x + (blockIdx.x < kGatherArriveUnit % gridDim.x);
    const unsigned long long old = atomicAdd(my_flags + kGatherFlagTicket, share);
    if (old & kGatherTicketBroken) {
      if (g.trap) report_timeout(g, kGatherErrBroken, g.rank, 0);  // traps
    } else {
      n = old / kGatherArriveUnit + 1;
    }
    n_shared = n;
    if (blockIdx.x == 0 && n != 0) {
      for (int p = 0; p < g.world; ++p) {
        if (p == g.rank) continue;
        if (kFlags) store_relaxed_sys(g.flags[p] + kGatherFlagEntered + g.rank, n);
        else red_add_sys(g.flags[p] + kGatherFlagEntered + g.rank, 1ull);
      }
    }
  }

  const GatherUnits units = gather_units(g, vec_elems, blockDim.x);
  const int64_t es = g.elem_size;
  bool entered = false;  // block-uniform: every peer has entered gather n (checked once, before the first store)
  for (int64_t unit = blockIdx.x; unit < units.count; unit += gridDim.x) {
    const int64_t rs = unit / units.pieces;
    const int64_t piece = unit - rs * units.pieces;
    const int64_t row = rs / g.segments;
    const int seg = static_cast<int>(rs - row * g.segments);
    const int64_t v_begin = piece * units.piece_len;
    const int64_t v_end = v_begin + units.piece_len < units.vec_per_seg ? v_begin + units.piece_len : units.vec_per_seg;
    const Vec* src = reinterpret_cast<const Vec*>(static_cast<const char*>(g.local) +
                                                  (row * g.local_row_stride + g.src_col[seg]) * es);
    const int64_t dst_off = ((g.dst_row_offset + row) * g.out_row_stride + g.dst_col[seg]) * es;
    Vec v[kGatherUnroll];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const int64_t i = v_begin + threadIdx.x + u * static_cast<int64_t>(blockDim.x);
      if (i < v_end) v[u] = src[i];
    }
    if (!entered) {
      // The first unit's loads are in flight while thread 0 waits for the peers to enter gather n (until then a
      // peer may still be reading its output of gather n-1).
      if (threadIdx.x == 0) {
        bool ok = n != 0;
        for (int p = 0; p < g.world && ok; ++p)
          if (p != g.rank) ok = wait_or_report(my_flags + kGatherFlagEntered + p, n, g, kGatherErrEnterTimeout, p, n);
        go_shared = ok ? 1 : 0;
      }
      __syncthreads();
      if (go_shared == 0) return;
      entered = true;
    }
    // Peers first (rank + 1, rank + 2, ...) so the ranks do not all aim at the same GPU at once; self last.
    for (int d = 1; d <= g.world; ++d) {
      const int dest = (g.rank + d) % g.world;
      Vec* dst = reinterpret_cast<Vec*>(static_cast<char*>(g.out[dest]) + dst_off);
#pragma unroll
      for (int u = 0; u < kGatherUnroll; ++u) {
        const int64_t i = v_begin + threadIdx.x + u * static_cast<int64_t>(blockDim.x);
        if (i < v_end) dst[i] = v[u];
      }
    }
  }

  // Every thread fences its own stores (each warp waits for its acknowledgements in parallel); then the block
  // signals every peer. Atomic: its share of one arrival unit, unit / B plus one for the first unit % B blocks.
  // Flags: its own slot, (n << 16) | B.
  fence_release_sys();
  __syncthreads();
  n = n_shared;
  if (n == 0) return;  // this rank is broken (report mode): nothing was written, nothing is signalled
  if (threadIdx.x == 0) {
    const unsigned long long share = kGatherArriveUnit / gridDim.x + (blockIdx.x < kGatherArriveUnit % gridDim.x);
    const unsigned long long slot = (n << kGatherSlotShift) | gridDim.x;
    for (int p = 0; p < g.world; ++p) {
      if (p == g.rank) continue;
      if (kFlags) store_relaxed_sys(g.flags[p] + kGatherFlagSlots + g.rank * kGatherMaxBlocks + blockIdx.x, slot);
      else red_add_sys(g.flags[p] + kGatherFlagArrived + g.rank, share);
    }
  }
  if (blockIdx.x != 0) return;
  // Block 0 ends the gather on this rank: every peer's blocks have all written into this rank's output. `completed`
  // is a record (tests, diagnostics): the gather number comes from the ticket.
  bool ok = true;
  if (kFlags) {
    ok = wait_flag_slots(g, n);
  } else if (threadIdx.x == 0) {
    for (int p = 0; p < g.world && ok; ++p)
      if (p != g.rank)
        ok = wait_or_report(my_flags + kGatherFlagArrived + p, n * kGatherArriveUnit, g, kGatherErrArriveTimeout,
                            p, n);
  }
  if (threadIdx.x == 0 && ok) *reinterpret_cast<volatile unsigned long long*>(my_flags + kGatherFlagCompleted) = n;
}

}  // namespace kernels

namespace {

bool aligned_for(const GatherParams& p, int bytes) {
  const int64_t e = bytes / p.elem_size;
  if (e <= 1) return true;
  if (reinterpret_cast<uintptr_t>(p.local) % bytes) return false;
  for (int r = 0; r < p.world; ++r)
    if (reinterpret_cast<uintptr_t>(p.out[r]) % bytes) return false;
  if (p.out_row_stride % e || p.local_row_stride % e || p.seg_len % e) return false;
  for (int s = 0; s < p.segments; ++s)
    if (p.src_col[s] % e || p.dst_col[s] % e) return false;
  return true;
}

}  // namespace
}  // namespace cuda

int gather_p2p_cuda(const GatherParams& p, void* stream) {
  using namespace cuda::kernels;
  auto s = static_cast<cudaStream_t>(stream);
  const int bytes = cuda::aligned_for(p, 16) ? 16 : cuda::aligned_for(p, 8) ? 8 : cuda::aligned_for(p, 4) ? 4 : 2;
  const int64_t vec_elems = bytes / p.elem_size;
  // No more blocks than work units (a block without units would only signal), at least one to signal.
  const int64_t units = gather_units(p, vec_elems, kGatherThreads).count;
  const int64_t blocks = units < p.blocks ? (units > 0 ? units : 1) : p.blocks;
  const dim3 grid(static_cast<unsigned>(blocks));
  const bool flags = p.signal == kGatherSignalFlags;
  if (!flags && p.signal != kGatherSignalAtomic) return static_cast<int>(cudaErrorInvalidValue);
  switch (bytes) {
    case 16:
      if (flags) gather_p2p_kernel<uint4, true><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      else gather_p2p_kernel<uint4, false><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      break;
    case 8:
      if (flags) gather_p2p_kernel<uint2, true><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      else gather_p2p_kernel<uint2, false><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      break;
    case 4:
      if (flags) gather_p2p_kernel<uint32_t, true><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      else gather_p2p_kernel<uint32_t, false><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      break;
    default:
      if (flags) gather_p2p_kernel<uint16_t, true><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      else gather_p2p_kernel<uint16_t, false><<<grid, kGatherThreads, 0, s>>>(p, vec_elems);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace e3
