#!/usr/bin/env bash
# On the GPU host: runs every criterion bench (ceilings first) and the PyTorch comparison, then
# gathers everything into $OUT/results.json and renders $OUT/BENCHMARKS.md and $OUT/plots/
# with python/bench_report.py (commit results.json as benches/results/latest.json and rerun
# the generator here to update the repository's copies).
# Usage: bash .gpu/gpu-bench.sh   (from the repository root, after scripts/gpu-bundle.sh here)
# DLKERN_BENCH_SECONDS="warm-up measurement" shortens (or lengthens) every bench (default "1 2").
# A partial run (one family with its baselines, same process environment):
#   DLKERN_BENCHES="ceilings matmul_nbits" picks the bench executables by name,
#   DLKERN_BENCH_FILTER='REGEX' passes criterion a filter, DLKERN_BENCH_TORCH=0 skips PyTorch
#   (DLKERN_TORCH_FAMILIES=attention,... runs some of its baselines),
#   DLKERN_BENCH_ORT=0 the ORT drop-in comparison; "e2e" in DLKERN_BENCHES (or no DLKERN_BENCHES)
#   runs the end-to-end generation through onnxruntime-genai-cuda when it is staged
#   (benches/e2e_genai.py, a few minutes: e.g. DLKERN_BENCHES=e2e DLKERN_BENCH_TORCH=0 DLKERN_BENCH_ORT=0).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/.." && pwd); cd "$root"
out=${OUT:-/tmp}; mkdir -p "$out"; work=$(mktemp -d)
export CRITERION_HOME="$work/criterion" DLKERN_BENCH_META="$work/meta.jsonl"
# (Empty when no criterion bench runs, e.g. DLKERN_BENCHES=e2e.)
: > "$work/meta.jsonl"
export DLKERN_LIB="$here/lib/libdlkern.so"
read -r warm measure <<<"${DLKERN_BENCH_SECONDS:-1 2}"
filter=(); [ -n "${DLKERN_BENCH_FILTER:-}" ] && filter=("$DLKERN_BENCH_FILTER")
for b in "$here"/benches/ceilings-* $(ls "$here"/benches/* | grep -v -e '/ceilings-' -e '/dlkern-'); do
  name=$(basename "$b"); name=${name%-*}
  if [ -n "${DLKERN_BENCHES:-}" ] && ! [[ " $DLKERN_BENCHES " == *" $name "* ]]; then continue; fi
  echo "=== $(basename "$b")"
  "$b" --bench --warm-up-time "$warm" --measurement-time "$measure" --noplot "${filter[@]}" 2>&1 | grep -E "time:|thrpt:|^[a-z]" || true
done
# The Python path's host cost (dlkern.call on torch tensors) beside the host_cost bench.
echo '{"criterion": [], "meta": []}' > "$work/python_call.json"
if { [ -z "${DLKERN_BENCHES:-}" ] || [[ " $DLKERN_BENCHES " == *" host_cost "* ]]; } \
  && python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "=== dlkern.call host cost"
  python3 benches/python_call_cost.py "$work/python_call.json"
fi
if [ "${DLKERN_BENCH_TORCH:-1}" = 0 ]; then
  echo '[]' > "$work/torch.json"
else
  echo "=== PyTorch comparison"
  python3 benches/compare_torch.py "$work/torch.json"
fi
# The ORT drop-ins against onnxruntime-gpu's own nodes, where it is staged (scripts/gpu-ort-stage.sh).
if python3 -c 'import onnxruntime, sys; sys.exit("CUDAExecutionProvider" not in onnxruntime.get_available_providers())' 2>/dev/null \
  && [ "${DLKERN_BENCH_ORT:-1}" != 0 ]; then
  echo "=== ORT drop-ins against onnxruntime-gpu"
  python3 benches/compare_ort.py "$work/ort.json" 2>&1 | grep -v -e "plugin EP" -e "kernels:" -e "_warn_once" -e UserWarning
else
  echo '[]' > "$work/ort.json"
fi
# A Llama-3-8B-shaped int4 model through onnxruntime-genai-cuda, on ORT's kernels and on dlkern's.
echo '{}' > "$work/e2e.json"
if { [ -z "${DLKERN_BENCHES:-}" ] || [[ " $DLKERN_BENCHES " == *" e2e "* ]]; } \
  && python3 -c 'import onnxruntime_genai as og, sys; sys.exit(not og.is_cuda_available())' 2>/dev/null; then
  echo "=== end to end through onnxruntime-genai"
  python3 benches/e2e_genai.py "$work/e2e.json" 2>&1 | grep -v -e "plugin EP" -e "_warn_once" -e UserWarning
fi
python3 - "$work" "$out/results.json" "$warm" "$measure" <<'PY'
import glob, json, os, subprocess, sys, datetime
work, dest, warm, measure = sys.argv[1:5]
crit = []
for est in glob.glob(os.path.join(work, "criterion", "**", "new", "estimates.json"), recursive=True):
    bench = json.load(open(os.path.join(os.path.dirname(est), "benchmark.json")))
    crit.append({"id": bench["full_id"], "median_ns": json.load(open(est))["median"]["point_estimate"]})
meta = [json.loads(l) for l in open(os.path.join(work, "meta.jsonl"))]
python_call = json.load(open(os.path.join(work, "python_call.json")))
crit += python_call["criterion"]
meta += python_call["meta"]
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
import torch
json.dump({"date": datetime.date.today().isoformat(), "gpu": smi.split(",")[0].strip(), "driver": smi.split(",")[-1].strip(),
           "torch": torch.__version__, "command": "scripts/gpu-bundle.sh here; " + "".join(f"{k}='{os.environ[k]}' " for k in ("DLKERN_BENCHES", "DLKERN_BENCH_FILTER", "DLKERN_BENCH_TORCH", "DLKERN_TORCH_FAMILIES", "DLKERN_BENCH_ORT", "DLKERN_ORT_OPS", "DLKERN_ORT_NBITS_M", "DLKERN_ORT_NBITS_SETS", "DLKERN_ORT_NBITS_SHAPES") if k in os.environ) + f"DLKERN_BENCH_SECONDS='{warm} {measure}' bash .gpu/gpu-bench.sh on the GPU host",
           "criterion": sorted(crit, key=lambda r: r["id"]), "meta": meta,
           "comparison": json.load(open(os.path.join(work, "torch.json"))),
           "ort_comparison": json.load(open(os.path.join(work, "ort.json"))),
           "e2e": json.load(open(os.path.join(work, "e2e.json")))}, open(dest, "w"), indent=1)
print("wrote", dest, len(crit), "criterion results")
PY
mkdir -p "$out/plots"
python3 python/bench_report.py "$out/results.json" --out "$out/BENCHMARKS.md" --plots "$out/plots"
