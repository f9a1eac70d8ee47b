#!/usr/bin/env bash
# Makes the builder-made LLM test fixtures under tests/fixtures/llm/ (tiny random-weight
# Llama / Qwen2 / Phi checkpoints turned into ONNX by onnxruntime-genai 0.18.0's model builder).
# Idempotent: creates .venv-builder/ (torch CPU, transformers, the builder's deps) once, then
# runs python/make_llm_fixtures.py, which rewrites every fixture folder and verifies it.
#   scripts/make-llm-fixtures.sh                 # build all + verify + README tables
#   scripts/make-llm-fixtures.sh --verify-only   # only re-run the checks / README tables
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
venv=.venv-builder
py=$venv/bin/python

[ -x "$py" ] || python3 -m venv "$venv"
if ! "$py" - <<'PY'
import importlib.metadata as md, importlib.util, sys
need = {"torch": None, "transformers": None, "onnx_ir": None, "onnx": None, "numpy": None,
        "tokenizers": None, "onnxruntime": "1.31.1", "onnxruntime_genai": "0.18.0"}
dist = {"onnxruntime_genai": "onnxruntime-genai", "onnx_ir": "onnx-ir"}
for mod, ver in need.items():
    if importlib.util.find_spec(mod) is None:
        sys.exit(1)
    if ver and md.version(dist.get(mod, mod)) != ver:
        sys.exit(1)
PY
then
  pipq=("$py" -m pip install -q --disable-pip-version-check)
  if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "make-llm-fixtures: pip install torch (CPU wheel index, else PyPI)"
    "${pipq[@]}" --retries 1 --timeout 20 torch --index-url https://download.pytorch.org/whl/cpu \
      || "${pipq[@]}" torch
  fi
  echo "make-llm-fixtures: pip install transformers onnx_ir onnx onnxruntime==1.31.1 onnxruntime-genai==0.18.0 numpy tokenizers"
  "${pipq[@]}" transformers onnx_ir onnx onnxruntime==1.31.1 onnxruntime-genai==0.18.0 numpy tokenizers
fi
exec "$py" python/make_llm_fixtures.py "$@"
