// TP shard gathering straight into every rank's packed [rows, K*H] buffer, over peer-mapped GPU memory. Torch-free.
//
// Each rank pushes its own rows (or its column shards) into every rank's registered output buffer, then tells each
// peer through words in the peer's flag area; no host sync, so the call is CUDA-graph capturable. Nothing is ever
// read from a peer: data and signals are stores into the peer, and every wait polls this rank's own memory (one-shot
// pull kernels have been reported never to complete over PCIe peer-to-peer). Per rank flag area (u64 words, read
// with acquire loads):
//   entered[r]  how many gathers rank r has entered (so this rank's previous output is no longer being read)
//   arrived[r]  (signal kGatherSignalAtomic) kGatherArriveUnit times the gathers of rank r that finished writing
//               into this rank's output, added to by every block of rank r with system-scope reductions
//   slot[r][b]  (signal kGatherSignalFlags) (n << 16) | B: block b of rank r's grid of B blocks finished writing
//               gather n into this rank's output; one writer per word, plain stores
// and two local words: ticket (kGatherArriveUnit times the gathers this rank's launches have started, plus a
// broken bit) and completed (gathers completed, a record for tests and diagnostics, never read by the kernel).
// Counters only grow, so nothing is reset between calls and replays of a captured graph keep counting.
//
// Protocol of gather n on rank me (grid of B blocks; B may differ across ranks and calls):
//   0. every block adds its share of kGatherArriveUnit to ticket (atomic, local) and takes n = old / unit + 1 from
//      the value it read: the B shares of one launch sum to exactly one unit and launches on a stream do not
//      overlap, so every block of a launch gets the same n whatever order its blocks start in, even when some start
//      only after others have finished (SMs held by another stream's kernels, MPS). Reading a "completed" word
//      written by block 0 at the end instead would give a block that starts after block 0 ended gather n+1.
//   1. block 0 tells every peer it entered gather n (atomic signal: adds 1 to entered[me]; flags signal: stores n,
//      the same value, since rank me is that word's only writer); every block with rows to copy issues its first
//      loads, then waits until entered[p] >= n for all peers p, i.e. every peer has started gather n and so finished
//      with its output of gather n-1.
//   2. every block copies its share of this rank's rows into every rank's output, fences (release, system scope)
//      and signals every peer: atomic: adds its share of kGatherArriveUnit to arrived[me] (the B shares sum to
//      exactly one unit, so a peer sees arrived[me] >= n * kGatherArriveUnit only once every block of gather n has
//      written); flags: stores (n << 16) | B into slot[me][b].
//   3. block 0 waits for every peer's blocks: atomic: arrived[p] >= n * kGatherArriveUnit; flags: its threads read
//      B_p from slot[p][0] and poll slot[p][0..B_p) in parallel until each holds n (a slot already past n means
//      rank p has finished gather n and started a later one). Then it records n in completed.
// The atomic signal needs native peer atomics on every link (system-scope reductions over PCIe are not guaranteed:
// cudaDevP2PAttrNativeAtomicSupported can be 0, and arrivals would be lost); the flags signal needs only ordered
// stores, at the price of B words per peer for the receiver to poll. eagle3_capture.gather_backend picks one from
// what the devices report.
// No block waits for another block of its own rank: the last store to land is followed by one fence round trip and
// one one-way signal (funnelling every block through a local counter would add a second fence to the critical path).
//
// A wait longer than the timeout writes {code, peer, step, n} to a host-mapped error word. A timed-out gather cannot
// be completed or undone from the device (a late peer may still write into this rank's output; the ranks' gather
// numbers no longer pair up), so it must never turn into rows that look gathered:
//   - trap (GatherParams::trap, what eagle3_capture.tp uses for every served gather): the kernel then executes a
//     trap. The CUDA context is lost and the next synchronising call of the process fails, as a collective timeout
//     under NCCL's watchdog ends the process; the error word, in host memory, still says which peer and step.
//   - report (the probe gather, and tests): the kernel gives up and sets ticket's broken bit; every later launch on
//     this rank then does nothing at all (no signal, no store) and the caller must read the error word (the probe
//     does, and moves every rank to NCCL).
#pragma once

#include <cstdint>

namespace e3 {

constexpr int kGatherMaxRanks = 16;
constexpr int kGatherMaxSegments = 16;

constexpr int kGatherMaxBlocks = 1024;  // the largest grid (the flags signal keeps one slot per block)

// Flag area layout (u64 words) inside each rank's registered buffer.
constexpr int kGatherFlagEntered = 0;                     // [kGatherMaxRanks]
constexpr int kGatherFlagArrived = kGatherMaxRanks;       // [kGatherMaxRanks]
constexpr int kGatherFlagCompleted = 2 * kGatherMaxRanks; // local: gathers completed (a record, never read)
constexpr int kGatherFlagTicket = 2 * kGatherMaxRanks + 1; // local: kGatherArriveUnit x gathers started | broken
constexpr int kGatherFlagSlots = 64;                      // [kGatherMaxRanks][kGatherMaxBlocks], 512-byte aligned
constexpr int kGatherFlagWords = kGatherFlagSlots + kGatherMaxRanks * kGatherMaxBlocks;
// One gather's worth of arrival: the blocks of a grid split it among themselves (any grid of up to 2^20 blocks).
constexpr unsigned long long kGatherArriveUnit = 1ull << 20;
// The ticket's broken bit: a gather of this rank gave up in report mode; later launches do nothing.
constexpr unsigned long long kGatherTicketBroken = 1ull << 63;
// A flags-signal slot: the gather number above kGatherSlotShift bits, the sender's grid size below.
constexpr int kGatherSlotShift = 16;
static_assert(kGatherMaxBlocks < (1 << kGatherSlotShift), "a slot holds the grid size in its low bits");

// How ranks signal arrival (GatherParams::signal).
constexpr int kGatherSignalAtomic = 0;  // system-scope reductions into one counter per peer: needs native atomics
constexpr int kGatherSignalFlags = 1;   // one plain-store flag per block and peer: needs only ordered stores

// Error word codes written to GatherParams::error[0].
constexpr int kGatherErrEnterTimeout = 1;   // a peer did not enter the gather
constexpr int kGatherErrArriveTimeout = 2;  // a peer entered but its rows did not arrive
constexpr int kGatherErrBadSlot = 3;        // a flags-signal slot names a grid outside 1..kGatherMaxBlocks
constexpr int kGatherErrBroken = 4;         // (report mode) launched after an earlier gather of this rank gave up

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
  int signal;                                 // kGatherSignalAtomic or kGatherSignalFlags, the same on every rank
  unsigned long long timeout_ns;
  int trap;                                   // 1: a timeout ends in a device trap; 0: report mode (see above)
  int* error;                                 // host-mapped int[4]: code, peer, step, gather number
};

// Launches the gather kernel (grid p.blocks). Returns a cudaError_t value; 0 = launched.
int gather_p2p_cuda(const GatherParams& p, void* stream);

}  // namespace e3
