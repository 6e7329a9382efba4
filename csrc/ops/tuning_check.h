// The device's tuning (csrc/kernels/tuning.h) for the CUDA ops, with a malformed EAGLE3_CAPTURE_* override raised
// as an error naming the variable instead of running with values nobody asked for. CUDA builds only.
#pragma once

#include "../kernels/device.h"
#include "checks.h"

namespace e3ops {

inline const e3::Tuning& checked_device_tuning(int device) {
  const e3::Tuning& t = e3::device_tuning(device);
  E3_CHECK(t.error[0] == '\0', "eagle3_capture: ", t.error);
  return t;
}

}  // namespace e3ops
