#!/usr/bin/env bash
# On the GPU host: every test (GPU tests included), then the GPU tests under compute-sanitizer
# memcheck and racecheck. Logs go to $OUT (or /tmp) as gpu-tests.log and sanitizer.log.
# Usage: bash .gpu/gpu-check.sh [test-name filter for the sanitizer runs]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
status=0
for t in "$here"/tests/*; do
  [ -x "$t" ] || continue
  echo "=== $(basename "$t")" | tee -a "$out/gpu-tests.log"
  DLKERN_BUNDLE_LIB_DIR="$here/lib" timeout 300 "$t" --include-ignored >>"$out/gpu-tests.log" 2>&1 || echo "FAILED: $(basename "$t") exit $?" | tee -a "$out/gpu-tests.log"
  tail -n 30 "$out/gpu-tests.log" | grep -E "^test result" | tail -1
done
grep -q "FAILED\|panicked" "$out/gpu-tests.log" && status=1
echo "=== python: PyTorch over DLPack, nvcc plug-in"
root=$(cd "$here/.." && pwd)
(cd "$root" && DLKERN_LIB="$here/lib/libdlkern.so" timeout 600 python3 -m pytest -q -p no:cacheprovider tests/python 2>&1) \
  | tee "$out/python-tests.log" | tail -3
grep -qE "[0-9]+ passed" "$out/python-tests.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/python-tests.log" || status=1
filter=${1:-gpu_}
for tool in memcheck racecheck; do
  for t in "$here"/tests/rmsnorm-* "$here"/tests/probe-* "$here"/tests/paged_attention-* "$here"/tests/matmul_w4-*; do
    [ -x "$t" ] || continue
    args=(--include-ignored --test-threads=1)
    case "$(basename "$t")" in
      probe-*) ;;
      # The 65536-token case is the same code as the others, only 50x longer under the tools.
      paged_attention-*) args+=("$filter" --skip gpu_long_context) ;;
      # Both variants (the large one uses shared memory and barriers), split K, bf16.
      matmul_w4-*) args+=(gpu_variants_and_splits) ;;
      *) args+=("$filter") ;;
    esac
    echo "=== $tool $(basename "$t")"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" "${args[@]}" >"$out/san-$tool-$(basename "$t" | cut -d- -f1).log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$out/san-$tool-$(basename "$t" | cut -d- -f1).log" | tail -3
    [ $rc -eq 0 ] || { echo "  exit $rc"; status=1; }
  done
done
exit $status
