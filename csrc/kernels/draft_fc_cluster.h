// The cluster decode kernel of the draft fc (draft_fc_cluster_cuda.cu), for the dispatch in draft_fc_cuda.cu and
// the bench binary. Torch-free.
#pragma once

#include "draft_fc.h"

namespace e3 {

// Whether the current device launches thread-block clusters (sm_90 and later).
bool draft_fc_cluster_supported();
// Whether the call suits it: K <= 8 taps (one cluster holds every tap of a column tile), M <= 16 rows.
bool draft_fc_cluster_applies(const DraftFcParams& p);

// Dynamic shared memory a cluster launch requests: the leader's inbox for `cluster_blocks` blocks of `row_groups`
// 16-row groups, `groups` token groups of 8, with or without the per-tap norm's sums of squares. The largest any
// launch takes is (8, 4, 2, true); the CI resource gate (scripts/cubin_resources.py) checks it against sm_120's
// 99 KB per block.
int64_t draft_fc_cluster_dynamic_smem_bytes(int cluster_blocks, int row_groups, int groups, bool norm);

// No workspace: the K-splits of a column tile meet in distributed shared memory. cudaError_t value. With
// only_one_wave (auto's choice), it launches only if its grid fits one wave of co-resident clusters on the current
// device (a cluster's blocks share one GPC, so clusters of some sizes leave block slots unused), and returns 0
// without launching otherwise; *launched (when given) says whether it launched. The tiling is computed once either
// way.
int draft_fc_decode_cluster_cuda(const DraftFcParams& p, DType dtype, void* stream,
                                 const DraftFcDecodeConfig& cfg = DraftFcDecodeConfig(), bool only_one_wave = false,
                                 bool* launched = nullptr);

}  // namespace e3
