#!/usr/bin/env bash
# The main job: build libdlkern.so (kernels compiled from Rust to PTX on the way), move the model
# builder's tiny int4 Llama onto dlkern's ops (python -m dlkern.retarget) and generate with it
# through onnxruntime-genai against the unmodified model (CUDA EP with onnxruntime-genai-cuda,
# onnxruntime-gpu and a GPU, else the CPU EP, which it says).
# Extra arguments go to demo/generate.py (e.g. --provider cpu, --model FOLDER, --tokens 64).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
bash scripts/setup.sh
. scripts/env.sh
$CARGO build --release
"$PYTHON" demo/generate.py --lib "$root/target/release/libdlkern.so" "$@"
