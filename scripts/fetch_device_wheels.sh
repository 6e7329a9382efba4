#!/usr/bin/env bash
# Download the wheels the GPU scripts install on the GPU machine (Python 3.12, x86-64, no registry there): SGLang
# (--no-deps) and the packages it imports that the machine's image lacks, one list for every release plus the
# release's own lines (scripts/gpu_sglang/device_wheels.txt: the one owner of that list).
#   usage: bash scripts/fetch_device_wheels.sh [--help] [DEST]   (DEST default: .whl; SGLANG=0.5.23|0.5.12|0.5.20,
#   default 0.5.23: the release whose wheels)
# DEST is emptied of *.whl first (two versions of one package stop the install). Prints the total size: the
# wheels travel with the working tree, 64 MiB a call in all (a call that carries more is refused). Not carried:
# sglang-kernel (CUDA, built for SGLang's torch), soundfile, IPython, flashinfer, flash_mla, cutlass, deep_gemm
# (scripts/gpu_sglang/standins stands in for each: import-only names, torch versions of what the path calls).
set -euo pipefail
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  -*) echo "fetch_device_wheels.sh: unknown option '$1'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
SGLANG=${SGLANG:-0.5.23}
LIST=scripts/gpu_sglang/device_wheels.txt
if ! grep -qx "\[$SGLANG\]" "$LIST"; then
  known=$(grep -o '^\[[^]]*\]' "$LIST" | tr -d '[]' | tr '\n' ' ')
  echo "fetch_device_wheels.sh: no wheel list for SGLang '$SGLANG' in $LIST (there: ${known% })" >&2
  exit 2
fi
DEST=${1:-.whl}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
# the common lines (before the first [section]) and the release's own section
mapfile -t WHEELS < <(awk -v rel="[$SGLANG]" '{ sub(/#.*/, ""); gsub(/^[ \t]+|[ \t]+$/, "") }
  /^\[/ { section = $0; next } $0 != "" && (section == "" || section == rel) { print }' "$LIST")
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f MiB", b / 1048576 }')
echo "SGLang $SGLANG: $(ls "$DEST"/*.whl | wc -l) wheels in $DEST, $mib"
if [ "$bytes" -gt $((64 * 1048576)) ]; then
  echo "fetch_device_wheels.sh: more than the 64 MiB a device call carries" >&2
  exit 1
fi
