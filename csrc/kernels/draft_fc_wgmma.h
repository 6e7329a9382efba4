// The draft fc for 9..64 rows on Hopper (sm_90a): a weight-streaming split-K kernel on the warpgroup tensor-core
// instructions (draft_fc_wgmma_cuda.cu), for the dispatch in the ops layer and the bench binary. Torch-free.
//
// Why a kernel of its own: above 8 rows the register decode kernels load every token's activations once per warp
// (their mma.sync B fragments), so their time grows with M, and normalise + cuBLAS pays a second launch and a pass
// over x on top of the GEMV (benchmarks/NOTES.md, sixth round). Here a block's weight tile streams through shared
// memory by TMA, the block's activations are staged once per k step in shared memory (x * g applied and x^2 summed
// on the way), and one warpgroup's wgmma takes both operands from there.
#pragma once

#include "draft_fc.h"

namespace e3 {

constexpr int64_t kDraftFcWgmmaMaxRows = 64;

// The kernel's workspace: as the decode workspace (draft_fc.h), with a row pitch of 64 tokens. Zero at rest,
// self-cleaning; any buffer at least this large that is zero at rest serves (the decode kernels' too).
int64_t draft_fc_wgmma_zeroed_bytes(int taps, int64_t out_features);
DraftFcWorkspace draft_fc_wgmma_workspace_view(void* zeroed, int taps, int64_t out_features);

// Whether the current device runs the kernel: compute capability 9.0 (wgmma is sm_90a only) and the driver's
// tensor-map encoder found.
bool draft_fc_wgmma_supported();
// Whether the call suits it: 1..64 rows, a weight whose base and row pitch allow a tensor map (16-byte aligned),
// sizes under 2^31. The activations are read as 16-byte vectors (the ops check their alignment).
bool draft_fc_wgmma_applies(const DraftFcParams& p);

// bf16 or fp16. `splits_per_tap`: K-splits per tap (0: as many as fill one wave of resident blocks). cudaError_t
// value (0 = success).
int draft_fc_wgmma_cuda(const DraftFcParams& p, DType dtype, const DraftFcWorkspace& ws, void* stream,
                        int splits_per_tap = 0, int variant = 0);

}  // namespace e3
