// Device queries behind device.h: host code only (no kernels), built with the CUDA sources.
#include <cuda_runtime.h>

#include <mutex>

#include "device.h"

namespace e3 {

DeviceFacts query_device_facts(int device, int* error) {
  DeviceFacts f;
  int first_error = 0;
  auto get = [&](cudaDeviceAttr attr, int& field) {
    int v = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&v, attr, device);
    if (e == cudaSuccess) {
      field = v;
    } else {
      (void)cudaGetLastError();
      if (first_error == 0) first_error = static_cast<int>(e);
    }
  };
  get(cudaDevAttrComputeCapabilityMajor, f.cc_major);
  get(cudaDevAttrComputeCapabilityMinor, f.cc_minor);
  get(cudaDevAttrMultiProcessorCount, f.sms);
  get(cudaDevAttrMaxThreadsPerMultiProcessor, f.max_threads_per_sm);
  get(cudaDevAttrMaxBlocksPerMultiprocessor, f.max_blocks_per_sm);
  get(cudaDevAttrMaxSharedMemoryPerMultiprocessor, f.smem_per_sm);
  get(cudaDevAttrMaxSharedMemoryPerBlockOptin, f.smem_per_block_optin);
  get(cudaDevAttrReservedSharedMemoryPerBlock, f.smem_reserved_per_block);
  int l2 = static_cast<int>(f.l2_bytes);
  get(cudaDevAttrL2CacheSize, l2);
  f.l2_bytes = l2;
  if (error != nullptr) *error = first_error;
  return f;
}

const Tuning& device_tuning(int device) {
  constexpr int kDevices = 64;
  static std::once_flag once[kDevices];
  static Tuning tuned[kDevices];
  static const Tuning fallback = tuning_for_with_env(DeviceFacts{});
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return fallback;
  }
  if (device >= kDevices) return fallback;
  std::call_once(once[device], [device] { tuned[device] = tuning_for_with_env(query_device_facts(device)); });
  return tuned[device];
}

PeerLinkFacts query_peer_link(int src, int dst) {
  PeerLinkFacts l;
  auto get = [&](cudaDeviceP2PAttr attr, int& field) {
    int v = 0;
    const cudaError_t e = cudaDeviceGetP2PAttribute(&v, attr, src, dst);
    if (e == cudaSuccess) {
      field = v;
    } else {
      (void)cudaGetLastError();
      if (l.error == 0) l.error = static_cast<int>(e);
    }
  };
  get(cudaDevP2PAttrAccessSupported, l.access);
  get(cudaDevP2PAttrNativeAtomicSupported, l.native_atomics);
  get(cudaDevP2PAttrPerformanceRank, l.performance_rank);
  // Newer than the other three: a runtime or driver that does not know it answers with an error, which says
  // nothing about the link, so it does not count as the link's error.
  int partial = 0;
  if (cudaDeviceGetP2PAttribute(&partial, cudaDevP2PAttrOnlyPartialNativeAtomicSupported, src, dst) == cudaSuccess)
    l.partial_atomics = partial;
  else
    (void)cudaGetLastError();
  return l;
}

int device_pci_bus_id(int device, char* out, int len) {
  const cudaError_t e = cudaDeviceGetPCIBusId(out, len, device);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(e);
}

}  // namespace e3
