#!/usr/bin/env bash
# The benchmarks of the default paths on a GPU machine, each with its baseline measured in the same run, about 8
# minutes on one H200 (kind nvidia-h200; nvidia-h200-x2 adds the gather).
#   usage: bash scripts/gpu_bench.sh [--name NAME] [--help]   (from the repository root or anywhere)
#   --name NAME  write the results to benchmarks/results/NAME/ (default: gpu_bench-<gpu>, e.g. gpu_bench-h200,
#                gpu_bench-h200x2 with two or more GPUs)
# Every JSON holds the machine, the torch version, the command, the baseline and the floor of its run. Logs and
# summary.txt go to $OUT when set (and the results are copied to $OUT/NAME/, so a device machine returns them),
# else to benchmarks/results/NAME/logs/.
# 1. build the extension for the GPU's arch and the CMake bench binaries (build/bench)
# 2. bench_draft_fc.py: the op at M = 1..4096, N = 896 and 7168 (decode kernels, normalise + cuBLAS) against
#    (a) K rms_norm + cat + linear and (b) linear on the pre-normed input -> draft_fc.json, draft_fc.png
# 3. bench_capture.py: capture and fused add + RMSNorm + capture at T = 1..8192 against torch's add + copy_ (and
#    add + rms_norm + copy_) -> capture.json, capture.png
# 4. the bench binaries: bench_draft_fc (auto, with --probe 1: a plain streaming read of the same weight bytes) and
#    bench_capture -> bench_binaries.txt
# 5. bench_gather.py (two GPUs: p2p gather against NCCL all_gather at T = 1..8192, powers of two) -> gather.json; with
#    one GPU a SKIP line says so
# Success: exit status 0, no summary line starts with FAIL; compare the figures with docs/performance.md.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
NAME=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) [ $# -ge 2 ] || { echo "gpu_bench.sh: --name needs a value" >&2; exit 2; }; NAME=$2; shift 2 ;;
    --name=*) NAME=${1#--name=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if [ -z "$NAME" ]; then
  # "NVIDIA H200" -> h200; with two or more GPUs, x<count> after it.
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | sed -n 1p | tr 'A-Z' 'a-z' | sed 's/^nvidia //; s/[^a-z0-9]\{1,\}/-/g; s/-$//')
  NAME="gpu_bench-$gpu$([ "$GPUS" -ge 2 ] && echo "x$GPUS" || true)"
fi
case "$NAME" in */*|.*|"") echo "gpu_bench.sh: --name must be a plain directory name, got '$NAME'" >&2; exit 2 ;; esac
RESULTS="benchmarks/results/$NAME"
mkdir -p "$RESULTS"
BUDGET_S=${BUDGET_S:-560}
start_run "${OUT:-$RESULTS/logs}"

# The bench binaries compile while the extension does (both before any timing).
cc=$(gpu_cc)
(cmake -S . -B build/bench -DE3_CUDA_ARCHS="${cc}a" && cmake --build build/bench -j "$(nproc)") \
  > "$LOGS/cmake.log" 2>&1 &
cmake_pid=$!
build_extension
step bench binaries build
rc=0
wait "$cmake_pid" || rc=$?
if [ $rc = 0 ]; then result "PASS bench binaries build (${cc}a)"
else tail -20 "$LOGS/cmake.log"; result "FAIL bench binaries build (rc=$rc)"; fi
python3 -c "import json; from eagle3_capture import tuning; print(json.dumps(tuning.for_device(0), indent=1))" \
  > "$RESULTS/device_tuning.json" 2>&1 || true

# One Python benchmark: name, cap in seconds, its log, then the command; PASS when it exits 0.
bench_py() {
  local name=$1 limit=$2 log=$3; shift 3
  step "$name"
  have_time "$name" || return 0
  local rc=0
  timeout "$(cap "$limit")" "$@" > "$log" 2>&1 || rc=$?
  grep -E "^\|" "$log" || true
  if [ $rc = 0 ]; then result "PASS $name ($*)"; else tail -5 "$log"; result "FAIL $name (rc=$rc; $*)"; fi
}

bench_py "bench draft fc op" 200 "$LOGS/bench_draft_fc.log" \
  python3 benchmarks/bench_draft_fc.py --M 1,4,8,16,64,512,4096 --N 896,7168 --samples 15 \
  --out "$RESULTS/draft_fc.json" --plot "$RESULTS/draft_fc.png"
bench_py "bench capture ops" 120 "$LOGS/bench_capture.log" \
  python3 benchmarks/bench_capture.py --out "$RESULTS/capture.json" --plot "$RESULTS/capture.png"

step bench binaries run
# One bench binary run into the file: the command as a comment line, then its output (header and result lines).
bench_bin() {  # file command...
  local file=$1; shift
  echo "# $*" >> "$file"
  timeout "$(cap 60)" "$@" >> "$file" 2>&1
}
if [ ! -x build/bench/bench_draft_fc ] || [ ! -x build/bench/bench_capture ]; then
  result "SKIP bench binaries (not built: $LOGS/cmake.log)"
elif have_time "bench binaries"; then
  rc=0
  txt="$RESULTS/bench_binaries.txt"
  # A device machine gets a copy of the working tree whose .git may be older than it: E3_COMMIT names the tree
  # when given, else git describes it (-dirty when files differ from that commit).
  echo "# $(head -1 "$LOGS/gpu.txt"), commit ${E3_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}" > "$txt"
  for n in 896 7168; do
    for m in 1 8; do bench_bin "$txt" ./build/bench/bench_draft_fc --M $m --N $n --probe 1 || rc=$?; done
  done
  for t in 64 8192; do bench_bin "$txt" ./build/bench/bench_capture --T $t || rc=$?; done
  cat "$txt"
  if [ $rc = 0 ]; then result "PASS bench binaries (bench_binaries.txt)"; else result "FAIL bench binaries (rc=$rc)"; fi
fi

if [ "$GPUS" -ge 2 ]; then
  bench_py "bench gather" 150 "$LOGS/bench_gather.log" \
    python3 benchmarks/bench_gather.py --T 1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192 --out "$RESULTS/gather.json"
else
  step bench gather
  result "SKIP bench gather (one GPU here; bench_gather.py needs two: run this script on nvidia-h200-x2)"
fi

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/$NAME"
  find "$RESULTS" -maxdepth 1 -type f -exec cp {} "$OUT/$NAME/" \;
fi
step done
summary_status FAIL
