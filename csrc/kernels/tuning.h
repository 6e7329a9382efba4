// Device-derived tuning of the launchers, in one place: the constants that were chosen on the H200 and move with
// the device (SM count, threads and shared memory per SM, L2 size, and the architecture's memory class), with an
// environment override for each. Pure host C++ (no CUDA, no torch), so the CPU tests evaluate it for fake devices
// through eagle3_capture._C.tuning_for; device_tuning() (device.h) applies it to the devices present.
//
// Which value was measured where (docs/performance.md has the table):
// - sm_90 (H200, 132 SMs, NVLink): every entry measured (docs/performance.md).
// - sm_100: the H200 entries, the SM-count relations applied; not measured.
// - sm_120 / 12.x (RTX PRO 6000 Blackwell: 188 SMs, 1536 threads and 100 KB of shared memory per SM, 128 MB L2,
//   GDDR7 ~1.8 TB/s; GPUs on PCIe): reasoned from those figures, not measured.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace e3 {

// What a device reports (cudaDeviceGetAttribute), or what a test pretends it reports.
struct DeviceFacts {
  int cc_major = 9, cc_minor = 0;
  int sms = 132;
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
  int smem_per_sm = 233472;             // bytes a multiprocessor has for its blocks (H200: 228 KB)
  int smem_per_block_optin = 232448;    // bytes one block may request with the opt-in attribute (H200: 227 KB)
  int smem_reserved_per_block = 1024;   // bytes the driver reserves per block (sm_80+: 1 KB)
  int64_t l2_bytes = 60ll << 20;
};

// The H200 the measured entries come from.
constexpr int kTunedSms = 132;
// draft fc Auto: the cluster kernel where the split grid cuts each tap into at least this many pieces, on kTunedSms
// SMs. Measured there: cluster 1.0-2.1 us faster at N <= 1792 (H = 7168, K = 3: 10 and 6 pieces), a tie or slower at
// N = 3584 (3 pieces) and 7168 (docs/performance.md).
constexpr int64_t kTunedClusterMinSplits = 4;
// draft fc: rows at or below which the decode kernels run, measured on the H200 (two token groups, M = 9..16,
// lost to normalise + cuBLAS by 5% at N = 7168 and won by 2% at N = 896: docs/performance.md).
constexpr int64_t kTunedDecodeMaxRows = 8;
// Bytes one benchmark rotation of inputs must span at least, as a multiple of L2 (so no timing sits in L2).
constexpr int kBenchRotationL2Multiple = 4;

// Tuning values a launcher reads. Every field is what the device's row of the table gives, unless the environment
// variable beside it overrides it (then its bit in `overridden` is set).
struct Tuning {
  // EAGLE3_CAPTURE_DECODE_MAX_ROWS (0..16): draft fc rows at or below which CUDA bf16/fp16 calls take the decode
  // kernels (one token group up to 8, two up to 16), normalise + cuBLAS above.
  int64_t decode_max_rows = kTunedDecodeMaxRows;
  // EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS (>= 1): draft fc Auto takes the cluster kernel where the split-K grid would
  // cut each tap into at least this many pieces (and the cluster grid fits one wave).
  int64_t cluster_min_splits = kTunedClusterMinSplits;
  // EAGLE3_CAPTURE_GATHER_BLOCKS (1..1024, sets both): the p2p gather's grid over NVLink-class links (every pair
  // with native peer atomics) and over PCIe-class links.
  int gather_blocks_nvlink = 2 * kTunedSms;
  int gather_blocks_pcie = 64;
  // EAGLE3_CAPTURE_FUSED_NORM_THREADS (32..1024, a multiple of 32; 0 = derived per call by fused_norm_threads):
  // the fused add + RMSNorm + capture kernel's block size.
  int fused_norm_threads = 0;
  // Bytes a benchmark's rotating input copies span at least: kBenchRotationL2Multiple x L2, and no less than the
  // 256 MB the H200 benchmarks used.
  int64_t bench_rotation_bytes = 256ll << 20;
  // Which row of the table the values come from, in words.
  const char* basis = "";
  unsigned overridden = 0;  // kOverride* bits
  char error[200] = {0};    // a malformed override: what was expected and what came (the values are then unusable)
};

constexpr unsigned kOverrideDecodeMaxRows = 1u << 0;
constexpr unsigned kOverrideClusterMinSplits = 1u << 1;
constexpr unsigned kOverrideGatherBlocks = 1u << 2;
constexpr unsigned kOverrideFusedNormThreads = 1u << 3;

// The table: the H200's measured entries, with the relations that carry them to other SM counts, and the entries
// reasoned for the 12.x parts.
inline Tuning tuning_for(const DeviceFacts& d) {
  Tuning t;
  const int sms = d.sms > 0 ? d.sms : kTunedSms;
  // The split grid's pieces per tap grow with the SM count (about 4 blocks per SM are spread over N/64 tiles x K
  // taps), so a fixed count would move the switch to larger N on larger GPUs: on 188 SMs, N = 3584 would get 4
  // pieces and leave the split kernel. Scaling the count with the SMs keeps the N at which the H200 measured the
  // switch (rounded to the nearest whole piece; at least 2, below which the cluster has nothing to reduce).
  const int64_t scaled = (kTunedClusterMinSplits * sms + kTunedSms / 2) / kTunedSms;
  t.cluster_min_splits = scaled < 2 ? 2 : scaled;
  // NVLink: twice the SMs keeps enough 16-byte stores in flight (grid sweep on 2 x H200: 64 blocks 7% slower at
  // T = 8192, the same at T = 64). PCIe (53-56 GB/s a direction, ~0.4 us): 64 blocks of 256 threads keep 1 MB per
  // peer in flight, far above the ~60 KB bandwidth-delay product, and each block is one more flag a receiver polls
  // and one more system fence crossing the bus (reasoned, not measured).
  t.gather_blocks_nvlink = 2 * sms;
  t.gather_blocks_pcie = 2 * sms < 64 ? 2 * sms : 64;
  const int64_t rot = static_cast<int64_t>(kBenchRotationL2Multiple) * (d.l2_bytes > 0 ? d.l2_bytes : 0);
  t.bench_rotation_bytes = rot > (256ll << 20) ? rot : (256ll << 20);
  if (d.cc_major == 9) {
    t.basis = "sm_90: measured on the H200";
    t.decode_max_rows = kTunedDecodeMaxRows;
  } else if (d.cc_major == 12) {
    // GDDR7 at ~1.8 TB/s over 188 SMs is ~9.5 GB/s per SM against the H200's ~32: with ~4.5x more SM cycles per
    // weight byte (clock included), the two-token-group kernel's doubled MMA and activation work (which lost on the
    // H200 only because its stream was latency-bound) hides under the loads, and the decode kernel saves the
    // normalise pass and its launch (~2-4 us) at M = 9..16. Reasoned, not measured.
    t.basis = "sm_12x: reasoned for the RTX PRO 6000 Blackwell, not measured";
    t.decode_max_rows = 16;
  } else {
    t.basis = d.cc_major == 10 ? "sm_10x: the H200 entries with the SM-count relations, not measured"
                               : "unlisted architecture: the H200 entries with the SM-count relations, not measured";
    t.decode_max_rows = kTunedDecodeMaxRows;
  }
  return t;
}

// Block size of the fused add + RMSNorm + capture kernel for a row of `chunks` vectors (plus tail elements) with
// `smem_bytes` of dynamic shared memory per block. Few rows (one wave of one block per row): one vector per thread,
// the row's latency. Many rows: the fewest vectors per thread (1..4) whose block size keeps >= 3/4 of the SM's
// threads resident, limited by threads, blocks and shared memory per SM. On the H200 at H = 7168 bf16 both give 896
// (2 blocks, 1792 of 2048 threads: measured, docs/performance.md); on sm_120 (1536 threads per SM) 896 would leave
// 1 block (58%), so many rows take 448 (3 blocks, 1344 threads, 3 x 29.8 KB of 100 KB shared): reasoned.
inline int fused_norm_threads(const DeviceFacts& d, int64_t chunks, int64_t rows, int64_t smem_bytes,
                              int override_threads) {
  if (override_threads > 0) return override_threads;
  auto block_for = [](int64_t per_thread_work) {
    int64_t t = (per_thread_work + 31) / 32 * 32;
    return static_cast<int>(t < 64 ? 64 : (t > 1024 ? 1024 : t));
  };
  const int one = block_for(chunks);
  if (rows <= d.sms || d.max_threads_per_sm <= 0) return one;
  int best = one;
  int64_t best_resident = -1;
  for (int per = 1; per <= 4; ++per) {
    const int t = block_for((chunks + per - 1) / per);
    int64_t blocks = d.max_threads_per_sm / t;
    if (d.max_blocks_per_sm > 0 && blocks > d.max_blocks_per_sm) blocks = d.max_blocks_per_sm;
    const int64_t per_block_smem = smem_bytes + d.smem_reserved_per_block;
    if (d.smem_per_sm > 0 && per_block_smem > 0 && blocks > d.smem_per_sm / per_block_smem)
      blocks = d.smem_per_sm / per_block_smem;
    const int64_t resident = blocks * t;
    if (4 * resident >= 3 * static_cast<int64_t>(d.max_threads_per_sm)) return t;
    if (resident > best_resident) {
      best_resident = resident;
      best = t;
    }
  }
  return best;
}

// Applies the EAGLE3_CAPTURE_* overrides that `get` (getenv, or a test's lookup) returns. A malformed value sets
// t.error (naming the variable, the allowed range and what came) and leaves the field as the table gave it.
template <typename Getenv>
void apply_tuning_overrides(Tuning& t, Getenv&& get) {
  auto read = [&](const char* name, long long lo, long long hi, bool mult32, unsigned bit, auto&& set) {
    const char* v = get(name);
    if (v == nullptr || *v == '\0') return;
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    if (end == v || *end != '\0' || x < lo || x > hi || (mult32 && x % 32 != 0)) {
      if (t.error[0] == '\0')
        std::snprintf(t.error, sizeof(t.error), "%s must be an integer in %lld..%lld%s, got '%.40s'", name, lo, hi,
                      mult32 ? " and a multiple of 32 (0 = derived)" : "", v);
      return;
    }
    set(x);
    t.overridden |= bit;
  };
  read("EAGLE3_CAPTURE_DECODE_MAX_ROWS", 0, 16, false, kOverrideDecodeMaxRows,
       [&](long long x) { t.decode_max_rows = x; });
  read("EAGLE3_CAPTURE_CLUSTER_MIN_SPLITS", 1, 1 << 20, false, kOverrideClusterMinSplits,
       [&](long long x) { t.cluster_min_splits = x; });
  read("EAGLE3_CAPTURE_GATHER_BLOCKS", 1, 1024, false, kOverrideGatherBlocks, [&](long long x) {
    t.gather_blocks_nvlink = static_cast<int>(x);
    t.gather_blocks_pcie = static_cast<int>(x);
  });
  read("EAGLE3_CAPTURE_FUSED_NORM_THREADS", 0, 1024, true, kOverrideFusedNormThreads,
       [&](long long x) { t.fused_norm_threads = static_cast<int>(x); });
}

inline Tuning tuning_for_with_env(const DeviceFacts& d) {
  Tuning t = tuning_for(d);
  apply_tuning_overrides(t, [](const char* name) -> const char* { return std::getenv(name); });
  return t;
}

}  // namespace e3
