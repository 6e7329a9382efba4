// What eagle3_capture._C reports about devices and tuning, as JSON strings (eagle3_capture.tuning and
// eagle3_capture.gather_backend read them). tuning_json works in CPU-only builds (the table is pure C++); the
// device queries need a CUDA build and return "" without one.
#pragma once

#include <string>

#include "../kernels/tuning.h"

namespace e3ops {

std::string facts_json(const e3::DeviceFacts& f);
// The table's values for `f` with the EAGLE3_CAPTURE_* overrides as the environment has them now.
std::string tuning_json(const e3::DeviceFacts& f);
// The cached tuning the launchers use on `device` (read once per process and device), and the device's facts.
std::string device_tuning_json(int device);
// `device`'s PCI bus id and facts, and what the runtime says about its link to every other visible device.
std::string device_report_json(int device);
// For the CI resource gate, on a device whose opt-in shared memory per block is `optin` bytes: the largest H the
// fused add + RMSNorm launcher accepts there, and the dynamic shared memory each launcher requests (the fused kernel
// at `hidden` columns, fp32 and 16-bit rows alike; the largest any draft fc cluster launch asks).
std::string launch_smem_json(long long hidden, long long optin);
// e3::kGatherFlagWords (CUDA builds).
int gather_flag_words();

}  // namespace e3ops
