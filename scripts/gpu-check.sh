#!/usr/bin/env bash
# On the GPU host: every test (GPU tests included), then the GPU tests under compute-sanitizer
# memcheck and racecheck. Logs go to $OUT (or /tmp) as gpu-tests.log and sanitizer.log.
# Usage: bash .gpu/gpu-check.sh [test-name filter for the sanitizer runs]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
status=0
bash "$here/run-tests.sh" 2>&1 | tee "$out/gpu-tests.log" | grep -E "^(=== |test result)|FAILED|panicked" || true
grep -q "FAILED\|panicked" "$out/gpu-tests.log" && status=1
echo "=== python: PyTorch over DLPack, nvcc plug-in"
root=$(cd "$here/.." && pwd)
(cd "$root" && DLKERN_LIB="$here/lib/libdlkern.so" python3 -m pytest -q -p no:cacheprovider tests/python 2>&1) \
  | tee "$out/python-tests.log" | tail -3
grep -qE "[0-9]+ passed" "$out/python-tests.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/python-tests.log" || status=1
filter=${1:-gpu_}
for tool in memcheck racecheck; do
  for t in "$here"/tests/rmsnorm-* "$here"/tests/probe-*; do
    [ -x "$t" ] || continue
    args=(--include-ignored --test-threads=1)
    case "$(basename "$t")" in probe-*) ;; *) args+=("$filter") ;; esac
    echo "=== $tool $(basename "$t")"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" "${args[@]}" >"$out/san-$tool-$(basename "$t" | cut -d- -f1).log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$out/san-$tool-$(basename "$t" | cut -d- -f1).log" | tail -3
    [ $rc -eq 0 ] || { echo "  exit $rc"; status=1; }
  done
done
exit $status
