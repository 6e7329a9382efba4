# Sourced by every scripts/device_*.sh: the shared environment of a device-machine run.
# NVLink multicast stays off everywhere (it can take a shared host's GPUs out of service).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/e3out}; mkdir -p "$OUT"
step() { echo; echo "=== $* ($(date +%T))"; }
