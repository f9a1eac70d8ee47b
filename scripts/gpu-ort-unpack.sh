#!/usr/bin/env bash
# On the GPU host: assemble onnxruntime-gpu from /tmp/og (parts) and .ortgpu (this run's
# carried files) into /tmp/ogpy. Prints export lines; use: source <(bash .ortgpu/gpu-ort-unpack.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/og; cp -n "$here"/prov.xz.part* /tmp/og/ 2>/dev/null || true
cp -n "$here"/ortpy.tar.xz /tmp/og/ 2>/dev/null || true
cp -n "$here"/genai.whl /tmp/og/ 2>/dev/null || true
if [ ! -f /tmp/ogpy/onnxruntime/capi/libonnxruntime_providers_cuda.so ]; then
  mkdir -p /tmp/ogpy
  xz -d -c /tmp/og/ortpy.tar.xz | tar xf - -C /tmp/ogpy
  cat /tmp/og/prov.xz.part* | xz -d -T0 > /tmp/ogpy/onnxruntime/capi/libonnxruntime_providers_cuda.so
fi
# onnxruntime-genai-cuda, when its wheel came along (import onnxruntime_genai).
if [ -f /tmp/og/genai.whl ] && [ ! -d /tmp/ogpy/onnxruntime_genai ]; then
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' /tmp/og/genai.whl /tmp/ogpy
fi
sp=$(python3 -c 'import site; print(site.getsitepackages()[0])')
echo "export PYTHONPATH=/tmp/ogpy\${PYTHONPATH:+:\$PYTHONPATH}"
echo "export LD_LIBRARY_PATH=$(ls -d "$sp"/nvidia/*/lib | tr '\n' ':')\${LD_LIBRARY_PATH:-}"
echo "export ORT_GPU_LIB_DIR=/tmp/ogpy/onnxruntime/capi"
