// TP shard gathering straight into every rank's packed [rows, K*H] buffer, over peer-mapped GPU memory. Torch-free.
//
// Each rank pushes its own rows (or its column shards) into every rank's registered output buffer, then tells each
// peer through a counter in the peer's flag area; no host sync, so the call is CUDA-graph capturable. Per rank
// flag area (u64, written by peers with system-scope reductions, read with acquire loads):
//   entered[r]  how many gathers rank r has entered (so this rank's previous output is no longer being read)
//   arrived[r]  kGatherArriveUnit times the gathers of rank r that finished writing into this rank's output
// and a local word (completed gathers). Counters only grow, so nothing is reset between calls and replays of a
// captured graph keep counting.
//
// Protocol of gather n on rank me (grid of B blocks; B may differ across ranks and calls):
//   1. block 0 adds 1 to entered[me] at every peer; every block with rows to copy issues its first loads, then
//      waits until entered[p] >= n for all peers p, i.e. every peer has started gather n and so finished with its
//      output of gather n-1.
//   2. every block copies its share of this rank's rows into every rank's output, fences (release, system scope)
//      and adds its share of kGatherArriveUnit to arrived[me] at every peer: the B shares sum to exactly one unit,
//      so a peer sees arrived[me] >= n * kGatherArriveUnit only once every block of gather n has written.
//   3. block 0 waits until arrived[p] >= n * kGatherArriveUnit for all peers, then records n.
// No block waits for another block of its own rank: the last store to land is followed by one fence round trip and
// one one-way signal (an earlier version funnelled every block through a local counter and a second fence).
// A wait longer than the timeout stops the kernel and writes {code, peer, step, n} to a host-mapped error word.
#pragma once

#include <cstdint>

namespace e3 {

constexpr int kGatherMaxRanks = 16;
constexpr int kGatherMaxSegments = 16;

// Flag area layout (u64 words) inside each rank's registered buffer.
constexpr int kGatherFlagEntered = 0;                     // [kGatherMaxRanks]
constexpr int kGatherFlagArrived = kGatherMaxRanks;       // [kGatherMaxRanks]
constexpr int kGatherFlagCompleted = 2 * kGatherMaxRanks; // local: gathers completed
constexpr int kGatherFlagWords = 2 * kGatherMaxRanks + 1;
// One gather's worth of arrival: the blocks of a grid split it among themselves (any grid of up to 2^20 blocks).
constexpr unsigned long long kGatherArriveUnit = 1ull << 20;

// Error word codes written to GatherParams::error[0].
constexpr int kGatherErrEnterTimeout = 1;   // a peer did not enter the gather
constexpr int kGatherErrArriveTimeout = 2;  // a peer entered but its rows did not arrive

struct GatherParams {
  int world;
  int rank;
  void* out[kGatherMaxRanks];                 // every rank's output buffer (peer-mapped), row pitch out_row_stride
  unsigned long long* flags[kGatherMaxRanks]; // every rank's flag area (peer-mapped)
  int64_t out_row_stride;                     // elements
  const void* local;                          // this rank's [local_rows, local_cols] rows
  int64_t local_row_stride;
  int64_t local_rows;
  int64_t dst_row_offset;                     // where this rank's rows land in every output
  // Column segments: local columns [src_col[s], src_col[s] + seg_len) go to output columns [dst_col[s], ...).
  int segments;
  int64_t seg_len;
  int64_t src_col[kGatherMaxSegments];
  int64_t dst_col[kGatherMaxSegments];
  int elem_size;                              // bytes
  int blocks;                                 // at most this many blocks (fewer when there are fewer work units)
  unsigned long long timeout_ns;
  int* error;                                 // host-mapped int[4]: code, peer, step, gather number
};

// Launches the gather kernel (grid p.blocks). Returns a cudaError_t value; 0 = launched.
int gather_p2p_cuda(const GatherParams& p, void* stream);

}  // namespace e3
