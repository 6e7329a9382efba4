#!/usr/bin/env bash
# Download the wheels scripts/gpu_sglang.sh installs on the GPU machine (Python 3.12, x86-64, no registry there):
# SGLang 0.5.23 (--no-deps) and the pure-Python / small compiled packages it imports that the machine's image lacks
# (prometheus-client: SGLang imports it only with --enable-metrics, which compare.py's plugin_metrics server runs).
#   usage: bash scripts/fetch_device_wheels.sh [--help] [DEST]      (DEST default: .whl in the repository root)
# DEST is emptied of *.whl first (two versions of one package stop the install). Prints the total size: the
# wheels travel with the working tree, 64 MiB a call in all. Not carried: sglang-kernel (373 MB, CUDA, built for
# torch 2.14.1; scripts/gpu_sglang/standins stands in for it), soundfile (without cffi it breaks transformers'
# audio import), IPython (a two-name stand-in in scripts/gpu_sglang/standins). Versions are the CPU venv's
# (requirements-sglang.txt and its resolution); the image already has torch, triton, transformers, numpy,
# anyio, httpx, requests, psutil, pyyaml, aiohttp, huggingface-hub, safetensors, cuda-bindings, nvidia-ml-py.
set -euo pipefail
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  -*) echo "fetch_device_wheels.sh: unknown option '$1'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl

WHEELS=(
  sglang==0.5.23
  apache-tvm-ffi==0.1.11 xgrammar==0.2.7
  msgspec==0.23.0 orjson==3.13.0 pyzmq==27.3.0 setproctitle==1.3.8 pybase64==1.5.1 zstandard==0.25.0
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34 watchfiles==1.3.0
  partial-json-parser==0.2.1.1.post7 interegular==0.3.3 distro==1.9.0 dill==0.4.1
  compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0
  openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2
  opentelemetry-api==1.45.2 importlib-metadata==10.2.0 truststore==0.10.5
  jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
  prometheus-client==0.26.0
)
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
echo "$(ls "$DEST"/*.whl | wc -l) wheels in $DEST, $(du -cb "$DEST"/*.whl | tail -1 | awk '{printf "%.1f MB", $1 / 1e6}')"
