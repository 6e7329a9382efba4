// The bulk-copy decode kernel of the draft fc (draft_fc_bulk_cuda.cu), for the dispatch in draft_fc_cuda.cu and the
// bench binary. Torch-free.
#pragma once

#include "draft_fc.h"

namespace e3 {

// Whether the current device runs the bulk-copy kernel (cp.async.bulk + mbarrier: sm_90 and later).
bool draft_fc_bulk_supported();

// M <= 8 rows. `stages` (>= 2): shared-memory stages per block; 0: as many as fit (at most 8). cudaError_t value.
int draft_fc_decode_bulk_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                              int stages = 0);

}  // namespace e3
