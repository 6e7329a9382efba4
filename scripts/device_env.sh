# Sourced by scripts/gpu_check.sh, gpu_check_x2.sh and gpu_bench.sh (after their `set -euo pipefail`): the
# environment of a GPU-machine run, the step and summary helpers, one deadline for the whole run, and the build of
# the extension for this machine's GPU. After its arguments, a script calls start_run LOGS_DIR: $LOGS is that
# directory, and $SUMMARY ($LOGS/summary.txt) gets one PASS / FAIL / SKIP line per step.

# NVLink multicast stays off everywhere (it can take a shared host's GPUs out of service).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# Every script runs from the repository root, wherever it was called from.
SCRIPT_PATH="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SCRIPT_PATH")/.."

# The script's usage: its header comment (every line from the second up to the first that is not a comment).
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SCRIPT_PATH"; }
# The arguments of a script that takes none but --help / -h (which prints the usage and exits 0).
no_arguments_but_help() {  # "$@" of the script
  [ $# -eq 0 ] && return 0
  case "$1" in -h|--help) usage; exit 0 ;; esac
  echo "$(basename "$SCRIPT_PATH"): unknown argument '$1'" >&2
  usage >&2
  exit 2
}

# One deadline for the run (BUDGET_S seconds from start_run, default 530, under the device machines' 10-minute
# call): each step gets min(its cap, what is left); a step with under 15 s left is reported SKIP, not a pass.
start_run() {  # logs_dir
  LOGS=$1
  mkdir -p "$LOGS"
  SUMMARY="$LOGS/summary.txt"
  : > "$SUMMARY"
  DEADLINE=$(( $(date +%s) + ${BUDGET_S:-530} ))
}
step() { echo; echo "=== $* ($(date +%T))"; }
result() { echo "$*" | tee -a "$SUMMARY"; }
cap() { local left=$(( DEADLINE - $(date +%s) )); echo $(( left < $1 ? left : $1 )); }
have_time() { [ "$(cap 15)" -ge 15 ] || { result "SKIP $1 (no time left)"; return 1; }; }

# pytest's last count line, PASS when it ran and nothing failed.
pytest_result() {  # name log rc
  local line; line=$(grep -E "(passed|failed|error)" "$2" | tail -1 || true)
  if [ "$3" = 0 ]; then result "PASS $1: $line"; else result "FAIL $1 (rc=$3): $line"; fi
}
# compute-sanitizer's summary line, PASS when it found nothing and the tests passed.
sanitizer_result() {  # name log rc
  local line; line=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$2" | sort -u | tr '\n' ' ' || true)
  if [ "$3" = 0 ]; then result "PASS $1: $line"
  else result "FAIL $1 (rc=$3): $line $(grep -E 'passed|failed' "$2" | tail -1 || true)"; fi
}
# Exit status of the run: 1 when any summary line starts with one of the given words (FAIL, SKIP), else 0.
summary_status() {
  local pattern; pattern="^($(IFS='|'; echo "$*")) "
  cat "$SUMMARY"
  if grep -qE "$pattern" "$SUMMARY"; then return 1; fi
  return 0
}

# The compute capability of GPU 0 without the dot ("90" on an H200): the kernels are built for its a-variant
# (sm_90a), the code the library ships for that GPU.
gpu_cc() { nvidia-smi --query-gpu=compute_cap --format=csv,noheader | sed -n 1p | tr -d ' .'; }

# The extension for GPU 0's arch (editable install); on failure the log's tail, a FAIL line, and exit 1.
build_extension() {
  local cc arch; cc=$(gpu_cc); arch="${cc%?}.${cc: -1}a"
  step build "$arch"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
  if TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" timeout "$(cap 240)" \
      python3 -m pip install -q --no-build-isolation --no-deps -e . > "$LOGS/build.log" 2>&1; then
    result "PASS build (TORCH_CUDA_ARCH_LIST=$arch)"
  else
    tail -30 "$LOGS/build.log"
    result "FAIL build"
    exit 1
  fi
}

# The carried wheels (SGLang and its light deps, scripts/fetch_device_wheels.sh) installed into /tmp/e3site
# (cleared first); on failure the log's tail, a FAIL line, and exit 1. The caller puts /tmp/e3site on PYTHONPATH.
install_wheels() {  # wheels_dir log
  step wheels
  if ! ls "$1"/*.whl > /dev/null 2>&1; then
    result "FAIL wheels: none in $1 (run scripts/fetch_device_wheels.sh and carry .whl)"
    exit 1
  fi
  rm -rf /tmp/e3site
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/e3site \
      "$1"/*.whl > "$2" 2>&1; then
    result "PASS wheels ($(ls "$1"/*.whl | wc -l) installed into /tmp/e3site)"
  else
    tail -20 "$2"
    result "FAIL wheels"
    exit 1
  fi
}
