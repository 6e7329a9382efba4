// The bulk-copy decode kernel of the draft fc (draft_fc_bulk_cuda.cu), for the dispatch in draft_fc_cuda.cu and the
// bench binary. Torch-free.
#pragma once

#include <cstdint>

#include "draft_fc.h"

namespace e3 {

// Whether the current device runs the TMA kernel (sm_90 and later, and the driver's tensor-map encoder found).
bool draft_fc_bulk_supported();
// Whether the call's inputs suit it: packed activations (one tensor map), M <= 8.
bool draft_fc_bulk_applies(const DraftFcParams& p);

// Shared-memory stages a launch uses: `requested`, or as many as `optin_smem_bytes` (the device's opt-in limit per
// block) allows when 0 or more than fit (6 on sm_90/sm_100, 2 on sm_120's 99 KB); below 2 the kernel cannot run.
int draft_fc_bulk_stages(int requested, int optin_smem_bytes);
// Dynamic shared memory a launch with `stages` stages requests.
int64_t draft_fc_bulk_dynamic_smem_bytes(int stages);

// M <= 8 rows. `stages` (>= 2): shared-memory stages per block; 0: as many as fit (at most 16). cudaError_t value.
int draft_fc_decode_bulk_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                              int stages = 0);

}  // namespace e3
