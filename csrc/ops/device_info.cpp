// JSON for eagle3_capture._C's device and tuning queries (device_info.h). Numbers go through std::to_string, not
// ostreams (checks.h says why).
#include "device_info.h"

#include <cstdlib>

#ifdef EAGLE3_WITH_CUDA
#include <cuda_runtime_api.h>

#include "../kernels/capture.h"
#include "../kernels/device.h"
#include "../kernels/draft_fc_cluster.h"
#include "../kernels/gather.h"
#endif

namespace e3ops {
namespace {

struct Json {
  std::string s = "{";
  bool first = true;
  void key(const char* k) {
    s += first ? "\"" : ", \"";
    s += k;
    s += "\": ";
    first = false;
  }
  void num(const char* k, long long v) {
    key(k);
    s += std::to_string(v);
  }
  void str(const char* k, const std::string& v) {
    key(k);
    s += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    s += '"';
  }
  void raw(const char* k, const std::string& v) {
    key(k);
    s += v;
  }
  std::string done() { return s + "}"; }
};

std::string tuning_fields(const e3::Tuning& t) {
  Json j;
  j.num("decode_max_rows", t.decode_max_rows);
  j.num("cluster_min_splits", t.cluster_min_splits);
  j.num("gather_blocks_nvlink", t.gather_blocks_nvlink);
  j.num("gather_blocks_pcie", t.gather_blocks_pcie);
  j.num("fused_norm_threads", t.fused_norm_threads);
  j.num("bench_rotation_bytes", t.bench_rotation_bytes);
  j.str("basis", t.basis);
  std::string over = "[";
  const char* names[] = {"decode_max_rows", "cluster_min_splits", "gather_blocks", "fused_norm_threads"};
  bool first = true;
  for (int b = 0; b < 4; ++b) {
    if (!(t.overridden & (1u << b))) continue;
    over += first ? "\"" : ", \"";
    over += names[b];
    over += '"';
    first = false;
  }
  j.raw("overridden", over + "]");
  j.str("error", t.error);
  return j.done();
}

}  // namespace

std::string facts_json(const e3::DeviceFacts& f) {
  Json j;
  j.num("cc_major", f.cc_major);
  j.num("cc_minor", f.cc_minor);
  j.num("sms", f.sms);
  j.num("max_threads_per_sm", f.max_threads_per_sm);
  j.num("max_blocks_per_sm", f.max_blocks_per_sm);
  j.num("smem_per_sm", f.smem_per_sm);
  j.num("smem_per_block_optin", f.smem_per_block_optin);
  j.num("smem_reserved_per_block", f.smem_reserved_per_block);
  j.num("l2_bytes", f.l2_bytes);
  return j.done();
}

std::string tuning_json(const e3::DeviceFacts& f) {
  Json j;
  j.raw("facts", facts_json(f));
  j.raw("tuning", tuning_fields(e3::tuning_for_with_env(f)));
  return j.done();
}

#ifdef EAGLE3_WITH_CUDA

std::string device_tuning_json(int device) {
  int err = 0;
  const e3::DeviceFacts f = e3::query_device_facts(device, &err);
  Json j;
  j.raw("facts", facts_json(f));
  j.num("facts_error", err);
  j.raw("tuning", tuning_fields(e3::device_tuning(device)));
  return j.done();
}

std::string device_report_json(int device) {
  Json j;
  j.num("device", device);
  char bus[32] = {0};
  const int bus_err = e3::device_pci_bus_id(device, bus, static_cast<int>(sizeof(bus)));
  j.str("pci_bus_id", bus_err == 0 ? bus : "");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  std::string links = "[";
  for (int d = 0; d < count; ++d) {
    if (d == device) continue;
    const e3::PeerLinkFacts l = e3::query_peer_link(device, d);
    char peer_bus[32] = {0};
    const int peer_err = e3::device_pci_bus_id(d, peer_bus, static_cast<int>(sizeof(peer_bus)));
    Json k;
    k.num("device", d);
    k.str("pci_bus_id", peer_err == 0 ? peer_bus : "");
    k.num("access", l.access);
    k.num("native_atomics", l.native_atomics);
    k.num("partial_atomics", l.partial_atomics);
    k.num("performance_rank", l.performance_rank);
    k.num("error", l.error);
    links += (links.size() > 1 ? ", " : "") + k.done();
  }
  j.raw("links", links + "]");
  return j.done();
}

std::string launch_smem_json(long long hidden, long long optin) {
  Json j;
  j.num("fused_add_rmsnorm_capture_max_cols", e3::fused_add_rmsnorm_capture_max_cols_for(optin));
  Json d;
  d.num("fused_add_rmsnorm_capture_kernel", e3::fused_add_rmsnorm_capture_smem_bytes(hidden));
  // The largest cluster: 8 blocks of 4 row groups, two token groups, with the norm's sums of squares.
  d.num("draft_fc_decode_cluster_kernel", e3::draft_fc_cluster_dynamic_smem_bytes(8, 4, 2, true));
  j.raw("dynamic", d.done());
  return j.done();
}

int gather_flag_words() { return e3::kGatherFlagWords; }

#else

std::string device_tuning_json(int) { return ""; }
std::string device_report_json(int) { return ""; }
std::string launch_smem_json(long long, long long) { return ""; }

#endif

}  // namespace e3ops
