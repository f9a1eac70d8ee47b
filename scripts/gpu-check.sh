#!/usr/bin/env bash
# On the GPU host: every test (GPU tests included), then the GPU tests under compute-sanitizer
# memcheck and racecheck. Test binaries, and the sanitizer runs, go concurrently (correctness
# only: nothing here is timed), so the whole check fits a short device lease. Logs go to $OUT
# (or /tmp): gpu-tests.log, python-tests.log, san-<tool>-<test>.log.
# Usage: bash .gpu/gpu-check.sh [test-name filter for the sanitizer runs]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp}; mkdir -p "$out"
logs=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
status=0
for t in "$here"/tests/*; do
  [ -x "$t" ] || continue
  (DLKERN_BUNDLE_LIB_DIR="$here/lib" timeout 300 "$t" --include-ignored >"$logs/$(basename "$t").log" 2>&1 \
    || echo "FAILED: $(basename "$t") exit $?" >>"$logs/$(basename "$t").log") &
done
wait
for l in "$logs"/*.log; do
  echo "=== $(basename "$l" .log)" | tee -a "$out/gpu-tests.log"
  cat "$l" >>"$out/gpu-tests.log"
  grep -E "^test result|^FAILED" "$l" | tail -2
done
grep -q "FAILED\|panicked" "$out/gpu-tests.log" && status=1
echo "=== python: PyTorch over DLPack, nvcc plug-in (and ORT's CUDA EP when staged)"
root=$(cd "$here/.." && pwd)
# (The serving soak appends its summary, memory at warm-up and at the end, to soak.jsonl.)
(cd "$root" && DLKERN_LIB="$here/lib/libdlkern.so" DLKERN_SOAK_REPORT="$out/soak.jsonl" timeout 600 python3 -m pytest -q -rs -p no:cacheprovider tests/python 2>&1) \
  | tee "$out/python-tests.log" | tail -3
grep -qE "[0-9]+ passed" "$out/python-tests.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/python-tests.log" || status=1
filter=${1:-gpu_}
for tool in memcheck racecheck; do
  for t in "$here"/tests/rmsnorm-* "$here"/tests/probe-* "$here"/tests/paged_attention-* "$here"/tests/matmul_nbits-* \
    "$here"/tests/attention-* "$here"/tests/matmul_w8a8-* "$here"/tests/group_query_attention-* \
    "$here"/tests/capture-*; do
    [ -x "$t" ] || continue
    args=(--include-ignored --test-threads=1)
    case "$(basename "$t")" in
      probe-*) ;;
      # The 65536-token case is the same code as the others, only 50x longer under the tools.
      paged_attention-*) args+=("$filter" --skip gpu_long_context) ;;
      # Both variants (the large one uses shared memory and barriers), split K, bf16; the
      # repacked decode (mma.sync and Hopper wgmma), the device packer, a call site's repacking and
      # the Hopper wgmma kernel; chains of calls, plain and replayed from a CUDA graph.
      matmul_nbits-*) args+=(gpu_variants_and_splits gpu_packed_decode gpu_device_packing gpu_registry_kernel gpu_wgmma gpu_decode_chain gpu_chain_replays) ;;
      # Every head dim, GQA, causal, packed batches with uneven lengths; the long and random
      # cases repeat the same code paths at 20-100x the time under the tools.
      attention-*) args+=(gpu_matches_reference_across gpu_packed_batches) ;;
      # Every kernel (tiled, decode over both weight layouts, wgmma), both load paths, the
      # quantizer.
      matmul_w8a8-*) args+=(gpu_matches_exact_reference gpu_decode_kernel gpu_packed_decode gpu_wgmma gpu_quantizer_matches) ;;
      *) args+=("$filter") ;;
    esac
    log="$out/san-$tool-$(basename "$t" | cut -d- -f1).log"
    (timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" "${args[@]}" >"$log" 2>&1; echo "exit $?" >>"$log") &
  done
done
# The whole serving path once under memcheck: onnxruntime-genai-cuda generating a few tokens of a
# builder-made model retargeted to dlkern (ORT's CUDA EP, dlkern's kernels, IO-bound caches).
if python3 -c 'import onnxruntime_genai as og, sys; sys.exit(not og.is_cuda_available())' 2>/dev/null; then
  log="$out/san-memcheck-genai.log"
  (cd "$root" && timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 python3 demo/generate.py \
    --lib "$here/lib/libdlkern.so" --provider cuda --tokens 4 --profile-steps 1 >"$log" 2>&1; echo "exit $?" >>"$log") &
fi
wait
for log in "$out"/san-*.log; do
  echo "=== $(basename "$log" .log)"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$log" | tail -3
  tail -1 "$log" | grep -q "^exit 0$" || { tail -1 "$log"; status=1; }
done
exit $status
