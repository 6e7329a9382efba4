// What the devices of this machine report (device_cuda.cu): each device's facts and the tuning derived from them
// (tuning.h), and what the runtime says about the link between two devices. Host code; torch-free.
#pragma once

#include "tuning.h"

namespace e3 {

// The facts of `device` from cudaDeviceGetAttribute. A failed query leaves that field at the H200's value
// (DeviceFacts' defaults) and sets *error (when given) to the first failing cudaError_t value.
DeviceFacts query_device_facts(int device, int* error = nullptr);

// tuning_for_with_env(query_device_facts(device)), computed at the first call for each device and kept: the
// environment overrides are read once per process and device. `device` < 0: the current device.
const Tuning& device_tuning(int device = -1);

// cudaDeviceGetP2PAttribute between two devices of this process. `error`: the first failing cudaError_t value (0:
// every query answered; a failed query leaves its field 0). partial_atomics: the link supports only some atomic
// operations (CUDA 13's cudaDevP2PAttrOnlyPartialNativeAtomicSupported; 0 where the runtime does not know it).
struct PeerLinkFacts {
  int access = 0;
  int native_atomics = 0;
  int partial_atomics = 0;
  int performance_rank = 0;
  int error = 0;
};
PeerLinkFacts query_peer_link(int src, int dst);

// The PCI bus id of a device ("0000:17:00.0"), so processes that see the GPUs under different indices can name the
// same one. Returns a cudaError_t value.
int device_pci_bus_id(int device, char* out, int len);

}  // namespace e3
