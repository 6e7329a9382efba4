// The wide decode kernel of the draft fc (draft_fc_wide_cuda.cu): M = 9..64 rows, for the dispatch in
// draft_fc_cuda.cu and the bench binary. Torch-free.
#pragma once

#include "draft_fc.h"

namespace e3 {

// The wide kernel's workspace: the same zero-at-rest buffer as the other decode kernels (at
// draft_fc_decode_zeroed_bytes, which covers both layouts), laid out for kDraftFcWideMaxRows token slots per row and
// 128-row column tiles.
DraftFcWorkspace draft_fc_wide_workspace_view(void* zeroed, int taps, int64_t out_features);
int64_t draft_fc_wide_zeroed_bytes(int taps, int64_t out_features);

// M <= kDraftFcWideMaxRows rows, any K, bf16/fp16. `ws` from draft_fc_wide_workspace_view. cudaError_t value.
int draft_fc_decode_wide_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream);

}  // namespace e3
