// bench_draft_fc: times the draft fc decode kernel alone (no torch): M rows of K packed taps of H through an
// [N, K*H] fc with per-tap RMSNorm, rotating among weight copies larger than L2. Prints bytes, time and the
// weight-streaming bandwidth; checks a few outputs against a float64 host computation first.
#include <cmath>
#include <cstdio>
#include <vector>

#include "../kernels/draft_fc.h"
#include "../kernels/draft_fc_device.cuh"
#include "bench_util.cuh"

namespace {

// The read probe: a plain streaming read of the same weight bytes with the decode kernel's load instruction
// (16 bytes a lane, 8 loads in flight per thread, 4 blocks of 128 threads per SM), folded into one word per block.
// What one launch of this size can take at best here: the decode kernel's fixed costs (split-K tail, MMAs,
// activations) are the difference.
__global__ void __launch_bounds__(128, 4) read_probe_kernel(const uint4* w, size_t n_vec, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const size_t j = i + u * stride;
      v[u] = j < n_vec ? e3::cuda::kernels::load_weight16(w + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // keeps the loads; practically never stores
}

void usage() {
  std::printf(
      "usage: bench_draft_fc [--M 8] [--N 896] [--H 7168] [--K 3] [--norm 1] [--blocks-per-sm 4] [--iters 50]\n"
      "                      [--samples 15] [--kernel cluster] [--splits 0] [--probe 0]\n"
      "                      [--cluster-min-splits 0]\n"
      "  bf16, decode kernels. Weight copies rotate so one rotation spans 4 x L2 (at least 256 MB).\n"
      "  --kernel auto (default: cluster for small N, else split), cluster (sm_90+, K <= 8: K-splits reduced in a\n"
      "  thread-block cluster) or split (partials in an L2 workspace; --splits K-splits per tap).\n"
      "  --blocks-per-sm: the register kernels' one-wave grid size (0: as built). M up to 16 (two token groups).\n"
      "  --probe 1: also time a plain streaming read of the same weight bytes (the floor of one launch this size).\n"
      "  --cluster-min-splits S: auto's switch to the cluster kernel (0: the device's tuning, tuning.h).\n"
);
}

float bf16_host(uint16_t b) { return e3::bf16_to_float(e3::bf16_t{b}); }

}  // namespace

int main(int argc, char** argv) {
  if (bench::has_flag(argc, argv, "--help") || bench::has_flag(argc, argv, "-h")) { usage(); return 0; }
  const long M = bench::arg_long(argc, argv, "--M", 8), N = bench::arg_long(argc, argv, "--N", 896);
  const long H = bench::arg_long(argc, argv, "--H", 7168), K = bench::arg_long(argc, argv, "--K", 3);
  const bool norm = bench::arg_long(argc, argv, "--norm", 1) != 0;
  const int iters = static_cast<int>(bench::arg_long(argc, argv, "--iters", 50));
  const int samples = static_cast<int>(bench::arg_long(argc, argv, "--samples", 15));
  if (M < 1 || M > e3::kDraftFcDecodeMaxRows || N < 1 || H < 8 || H % 8 || K < 1) { usage(); return 2; }
  const size_t w_elems = size_t(N) * K * H, w_bytes = w_elems * 2;
  const int ncopies = bench::rotation_copies(w_bytes);
  std::vector<void*> weights(ncopies);
  for (int i = 0; i < ncopies; ++i) {
    E3_CHECK(cudaMalloc(&weights[i], w_bytes));
    bench::fill(weights[i], w_elems, 2, 100 + i);
  }
  void *x, *g, *out, *ws_buffer;
  E3_CHECK(cudaMalloc(&x, size_t(M) * K * H * 2));
  E3_CHECK(cudaMalloc(&g, size_t(K) * H * 2));
  E3_CHECK(cudaMalloc(&out, size_t(M) * N * 2));
  bench::fill(x, size_t(M) * K * H, 2, 7);
  bench::fill(g, size_t(K) * H, 2, 8);
  const int64_t ws_bytes = e3::draft_fc_decode_workspace_bytes(static_cast<int>(K), N);
  E3_CHECK(cudaMalloc(&ws_buffer, ws_bytes));
  E3_CHECK(cudaMemset(ws_buffer, 0, ws_bytes));
  const e3::DraftFcWorkspace wsv = e3::draft_fc_decode_workspace_view(ws_buffer, static_cast<int>(K), N);
  e3::DraftFcDecodeConfig cfg;
  cfg.blocks_per_sm = static_cast<int>(bench::arg_long(argc, argv, "--blocks-per-sm", cfg.blocks_per_sm));
  const std::string kname = bench::arg_str(argc, argv, "--kernel", "auto");
  if (kname == "auto") cfg.kernel = e3::DraftFcDecodeKernel::Auto;
  else if (kname == "cluster") cfg.kernel = e3::DraftFcDecodeKernel::Cluster;
  else if (kname == "split") cfg.kernel = e3::DraftFcDecodeKernel::Split;
  else { usage(); return 2; }
  cfg.splits_per_tap = static_cast<int>(bench::arg_long(argc, argv, "--splits", cfg.splits_per_tap));
  cfg.cluster_min_splits = bench::arg_long(argc, argv, "--cluster-min-splits", cfg.cluster_min_splits);

  e3::DraftFcParams p{};
  p.x_base = x; p.x_tap_stride = H; p.x_row_stride[0] = K * H; p.taps = static_cast<int>(K); p.hidden = H;
  p.rows = M; p.weight_row_stride = K * H; p.out_features = N; p.norm_weight = norm ? g : nullptr; p.eps = 1e-6f;
  p.out = out; p.out_row_stride = N; p.elem_size = 2;
  auto run = [&](int i) {
    p.weight = weights[i % ncopies];
    E3_CHECK(e3::draft_fc_decode_cuda(p, e3::DType::BF16, wsv, nullptr, cfg));
  };

  // Spot check: outputs (row 0 and M-1, a few columns) against float64 on the host.
  run(0);
  E3_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> hx(size_t(M) * K * H), hg(size_t(K) * H), hy(size_t(M) * N), hw(size_t(K) * H);
  E3_CHECK(cudaMemcpy(hx.data(), x, hx.size() * 2, cudaMemcpyDeviceToHost));
  E3_CHECK(cudaMemcpy(hg.data(), g, hg.size() * 2, cudaMemcpyDeviceToHost));
  E3_CHECK(cudaMemcpy(hy.data(), out, hy.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (long m : {0L, M - 1}) {
    for (long n : {0L, N / 2, N - 1}) {
      E3_CHECK(cudaMemcpy(hw.data(), static_cast<char*>(weights[0]) + size_t(n) * K * H * 2, hw.size() * 2,
                          cudaMemcpyDeviceToHost));
      double y = 0, mag = 0;
      for (long k = 0; k < K; ++k) {
        double ss = 0;
        for (long j = 0; j < H; ++j) { const double v = bf16_host(hx[(m * K + k) * H + j]); ss += v * v; }
        const double r = norm ? 1.0 / std::sqrt(ss / H + 1e-6) : 1.0;
        for (long j = 0; j < H; ++j) {
          const double v = bf16_host(hx[(m * K + k) * H + j]) * r * (norm ? bf16_host(hg[k * H + j]) : 1.0);
          y += v * bf16_host(hw[k * H + j]);
          mag += std::fabs(v * bf16_host(hw[k * H + j]));
        }
      }
      worst = std::max(worst, std::fabs(bf16_host(hy[m * N + n]) - y) / (mag / std::sqrt(double(K * H)) + 1e-30));
    }
  }
  std::printf("check: 6 outputs vs float64 host: worst error %.2e of the term scale %s\n", worst,
              worst < 2e-2 ? "(ok)" : "(TOO LARGE)");
  if (!(worst < 2e-2)) return 1;

  const double t = bench::time_us(run, iters, samples);
  const double bytes = double(w_bytes) + double(M) * K * H * 2 + double(M) * N * 2;
  const char* kernel = kname.c_str();
  std::printf("%-6s %5s %6s %6s %3s %4s %6s %12s %10s %12s\n", "kernel", "M", "N", "H", "K", "bpsm", "splits",
              "bytes", "time_us", "weight_GB/s");
  std::printf("%-6s %5ld %6ld %6ld %3ld %4d %6d %12.0f %10.2f %12.1f\n", kernel, M, N, H, K,
              cfg.blocks_per_sm, cfg.splits_per_tap, bytes, t, w_bytes / t / 1e3);
  if (bench::arg_long(argc, argv, "--probe", 0) != 0) {
    unsigned* sink;
    const int blocks = 4 * e3::cuda::sm_count();
    E3_CHECK(cudaMalloc(&sink, blocks * sizeof(unsigned)));
    auto probe = [&](int i) {
      read_probe_kernel<<<blocks, 128>>>(static_cast<const uint4*>(weights[i % ncopies]), w_bytes / 16, sink);
      E3_CHECK(cudaGetLastError());
    };
    const double tp = bench::time_us(probe, iters, samples);
    std::printf("%-6s %5s %6ld %6ld %3ld %4d %6s %12.0f %10.2f %12.1f\n", "probe", "-", N, H, K, 4, "-",
                double(w_bytes), tp, w_bytes / tp / 1e3);
  }
  return 0;
}
