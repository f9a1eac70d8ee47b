#!/usr/bin/env bash
# The main job: build libdlkern.so (kernels compiled from Rust to PTX on the way), then run the
# demo decoder step through ONNX Runtime with it (CUDA EP when onnxruntime-gpu and a GPU are
# present, else the CPU EP), check it against NumPy and print per-op timings.
# Extra arguments go to demo/decoder_step.py (e.g. --provider cpu, --dim 4096).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
bash scripts/setup.sh
. scripts/env.sh
$CARGO build --release
"$PYTHON" demo/decoder_step.py --lib "$root/target/release/libdlkern.so" "$@"
