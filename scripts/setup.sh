#!/usr/bin/env bash
# Installs what dlkern needs on a Debian/Ubuntu machine (idempotent; root or sudo for apt):
# - the kernel compiler: Debian's rustc-web + cargo-web + rust-web-src (a rustc with library
#   source, so `-Zbuild-std=core` can build `core` for nvptx64; see builder/);
# - a Python environment in .venv with ptxas (PyPI nvidia-cuda-nvcc, to check PTX without a
#   GPU), onnx, onnxruntime and numpy (the ONNX Runtime tests), and onnxruntime-genai (the
#   generation loop of the demo and the end-to-end tests; its CPU build, on top of onnxruntime).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
[ -x /usr/bin/rustc ] && [ -f /usr/lib/rustlib/src/rust/library/core/Cargo.toml ] || need_apt+=(rustc-web cargo-web rust-web-src)
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
if ! .venv/bin/python - <<'PY'
import glob, importlib.metadata, importlib.util, os, sys
missing = [m for m in ("onnx", "onnxruntime", "numpy", "pytest", "matplotlib", "onnx_ir", "onnxruntime_genai")
           if importlib.util.find_spec(m) is None]
# The ORT ops dlkern replaces are compared against ORT's own kernels of this release (the GPU
# host's onnxruntime-gpu is the same one), so its CPU build is pinned.
if "onnxruntime" not in missing and importlib.metadata.version("onnxruntime") != "1.31.1":
    missing.append("onnxruntime")
if "onnxruntime_genai" not in missing and importlib.metadata.version("onnxruntime-genai") != "0.18.0":
    missing.append("onnxruntime_genai")
spec = importlib.util.find_spec("nvidia")
if spec is None or not any(glob.glob(os.path.join(d, "*", "bin", "ptxas")) for d in spec.submodule_search_locations):
    missing.append("nvidia-cuda-nvcc")
sys.exit(1 if missing else 0)
PY
then
  echo "setup: pip install nvidia-cuda-nvcc onnx onnxruntime==1.31.1 onnxruntime-genai==0.18.0 numpy pytest matplotlib onnx_ir (into .venv)"
  .venv/bin/python -m pip install -q --disable-pip-version-check nvidia-cuda-nvcc onnx onnxruntime==1.31.1 \
    onnxruntime-genai==0.18.0 numpy pytest matplotlib onnx_ir
fi
echo "setup: ok"
