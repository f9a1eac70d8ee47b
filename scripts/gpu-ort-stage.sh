#!/usr/bin/env bash
# Stages onnxruntime-gpu (CUDA 13 build) for a GPU host with no network, as parts of
# at most 48 MiB in .ortgpu/ (git-ignored). Cached under ~/.cache/ortgpu.
set -euo pipefail
ver=${ORT_GPU_VERSION:-1.31.1}
root=$(git rev-parse --show-toplevel); cd "$root"
# (In a worktree .git is a file: ask git where the exclude file is.)
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.ortgpu/' "$exclude" 2>/dev/null || echo '/.ortgpu/' >> "$exclude"
cache=~/.cache/ortgpu/$ver; mkdir -p "$cache"
if [ ! -f "$cache/done" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" "onnxruntime-gpu==$ver"
  (cd "$tmp" && unzip -q onnxruntime_gpu-*.whl 'onnxruntime/*')
  mv "$tmp/onnxruntime/capi/libonnxruntime_providers_cuda.so" "$tmp/prov.so"
  rm -f "$tmp/onnxruntime/capi/libonnxruntime_providers_tensorrt.so"
  (cd "$tmp" && tar cf - onnxruntime | xz -6 -T0 > "$cache/ortpy.tar.xz")
  xz -6 -T0 -c "$tmp/prov.so" > "$tmp/prov.xz"
  (cd "$cache" && split -b 48m -d "$tmp/prov.xz" prov.xz.part)
  rm -rf "$tmp"; touch "$cache/done"
fi
# onnxruntime-genai-cuda (the generation loop; needs the onnxruntime-gpu above), ~16 MiB.
gver=${ORT_GENAI_VERSION:-0.18.0}
if [ ! -f "$cache/genai-$gver.whl" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp" "onnxruntime-genai-cuda==$gver"
  mv "$tmp"/onnxruntime_genai_cuda-*.whl "$cache/genai-$gver.whl"; rm -rf "$tmp"
fi
rm -rf .ortgpu; mkdir -p .ortgpu
cp "$cache"/prov.xz.part* "$cache/ortpy.tar.xz" .ortgpu/
cp "$cache/genai-$gver.whl" .ortgpu/genai.whl
cp "$(dirname "$0")/gpu-ort-unpack.sh" .ortgpu/
ls -la .ortgpu
echo "send each .ortgpu/prov.xz.partNN in its own run (copy it to /tmp/og/), the last one"
echo "with .ortgpu/ortpy.tar.xz and .ortgpu/gpu-ort-unpack.sh; .ortgpu/genai.whl (onnxruntime-genai-cuda)"
echo "in a run of its own if you need it; then: source <(bash .ortgpu/gpu-ort-unpack.sh)"
