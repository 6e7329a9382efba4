// bench_capture: times the capture kernels alone (no torch), K taps into a packed [T, K*H] buffer, rotating among
// input sets larger than L2. Prints shape, bytes moved, time and GB/s; checks a few rows against the CPU kernel.
#include <cstdio>
#include <vector>

#include "../kernels/capture.h"
#include "bench_util.cuh"

namespace {

void usage() {
  std::printf(
      "usage: bench_capture [--T 8192] [--H 7168] [--K 3] [--dtype bf16|fp32] [--iters 20] [--samples 15]\n"
      "  Times K capture_cuda calls (hidden+residual into slot k) and K fused add+RMSNorm+capture calls.\n");
}

struct Set { void *h, *r; };

}  // namespace

int main(int argc, char** argv) {
  if (bench::has_flag(argc, argv, "--help") || bench::has_flag(argc, argv, "-h")) { usage(); return 0; }
  const long T = bench::arg_long(argc, argv, "--T", 8192), H = bench::arg_long(argc, argv, "--H", 7168);
  const long K = bench::arg_long(argc, argv, "--K", 3);
  const int iters = static_cast<int>(bench::arg_long(argc, argv, "--iters", 20));
  const int samples = static_cast<int>(bench::arg_long(argc, argv, "--samples", 15));
  const std::string dts = bench::arg_str(argc, argv, "--dtype", "bf16");
  if (T < 1 || H < 1 || K < 1 || (dts != "bf16" && dts != "fp32")) { usage(); return 2; }
  const e3::DType dt = dts == "bf16" ? e3::DType::BF16 : e3::DType::F32;
  const int es = e3::dtype_size(dt);
  const size_t tap_bytes = size_t(T) * H * es;
  // Enough sets of K (hidden, residual) pairs that one rotation spans 4 x L2 (at least 256 MB): timings never sit
  // in L2.
  const size_t set_bytes = 2 * K * tap_bytes;
  const int nsets = bench::rotation_copies(set_bytes);
  std::vector<std::vector<Set>> sets(nsets, std::vector<Set>(K));
  unsigned seed = 1;
  for (auto& s : sets)
    for (auto& p : s) {
      E3_CHECK(cudaMalloc(&p.h, tap_bytes));
      E3_CHECK(cudaMalloc(&p.r, tap_bytes));
      bench::fill(p.h, size_t(T) * H, es, seed++);
      bench::fill(p.r, size_t(T) * H, es, seed++);
    }
  void *packed = nullptr, *weight = nullptr;
  E3_CHECK(cudaMalloc(&packed, K * tap_bytes));
  E3_CHECK(cudaMalloc(&weight, size_t(H) * es));
  bench::fill(weight, H, es, 999);
  E3_CHECK(cudaDeviceSynchronize());

  auto capture = [&](int i) {
    const auto& s = sets[i % nsets];
    for (long k = 0; k < K; ++k) {
      e3::CaptureParams p{static_cast<char*>(packed) + k * H * es, K * H, s[k].h, H, s[k].r, H, T, H};
      E3_CHECK(e3::capture_cuda(p, dt, nullptr));
    }
  };
  auto fused = [&](int i) {
    const auto& s = sets[i % nsets];
    for (long k = 0; k < K; ++k) {
      e3::FusedAddRmsnormCaptureParams p{s[k].h, H, s[k].r, H, weight, 1e-6f,
                                         static_cast<char*>(packed) + k * H * es, K * H, T, H};
      E3_CHECK(e3::fused_add_rmsnorm_capture_cuda(p, dt, nullptr));
    }
  };

  // Correctness spot check of the capture path against the CPU kernel on the first set.
  {
    capture(0);
    E3_CHECK(cudaDeviceSynchronize());
    const long rows = std::min<long>(T, 4);
    std::vector<char> hh(rows * H * es), rr(rows * H * es), got(rows * K * H * es), want(rows * K * H * es);
    bool ok = true;
    for (long k = 0; k < K && ok; ++k) {
      E3_CHECK(cudaMemcpy(hh.data(), sets[0][k].h, hh.size(), cudaMemcpyDeviceToHost));
      E3_CHECK(cudaMemcpy(rr.data(), sets[0][k].r, rr.size(), cudaMemcpyDeviceToHost));
      E3_CHECK(cudaMemcpy(got.data(), packed, got.size(), cudaMemcpyDeviceToHost));
      e3::CaptureParams p{want.data() + k * H * es, K * H, hh.data(), H, rr.data(), H, rows, H};
      e3::dispatch_host_dtype(dt, [&](auto tag) { e3::capture_rows_cpu<decltype(tag)>(p, 0, rows); });
      for (long t = 0; t < rows && ok; ++t)
        ok = std::memcmp(got.data() + (t * K + k) * H * es, want.data() + (t * K + k) * H * es, H * es) == 0;
    }
    std::printf("check: capture rows 0..%ld of every slot %s the CPU kernel\n", rows - 1, ok ? "match" : "DIFFER from");
    if (!ok) return 1;
  }

  const double t_cap = bench::time_us(capture, iters, samples);
  const double t_fused = bench::time_us(fused, iters, samples);
  const double b_cap = 3.0 * K * tap_bytes, b_fused = 5.0 * K * tap_bytes;
  std::printf("%-8s %6s %6s %3s %5s %12s %10s %9s\n", "case", "T", "H", "K", "dtype", "bytes", "time_us", "GB/s");
  std::printf("%-8s %6ld %6ld %3ld %5s %12.0f %10.2f %9.1f\n", "capture", T, H, K, dts.c_str(), b_cap, t_cap,
              b_cap / t_cap / 1e3);
  std::printf("%-8s %6ld %6ld %3ld %5s %12.0f %10.2f %9.1f\n", "fused", T, H, K, dts.c_str(), b_fused, t_fused,
              b_fused / t_fused / 1e3);
  return 0;
}
