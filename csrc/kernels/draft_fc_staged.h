// The draft fc for 9..64 rows (experiment): the register decode kernels' weight stream with every token group's
// activations staged once per block in shared memory (draft_fc_staged_cuda.cu). Torch-free.
#pragma once

#include "draft_fc.h"

namespace e3 {

constexpr int64_t kDraftFcStagedMaxRows = 64;

// The kernel's workspace: as the decode workspace (draft_fc.h) at a row pitch of 64 tokens; zero at rest.
int64_t draft_fc_staged_zeroed_bytes(int taps, int64_t out_features);
DraftFcWorkspace draft_fc_staged_workspace_view(void* zeroed, int taps, int64_t out_features);

bool draft_fc_staged_supported();  // sm_80+ (mma.sync)
bool draft_fc_staged_applies(const DraftFcParams& p);

int draft_fc_staged_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                         int splits_per_tap = 0);

}  // namespace e3
