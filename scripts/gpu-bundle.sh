#!/usr/bin/env bash
# Builds the release test and bench executables and libdlkern.so into .gpu/ (stripped, without
# proc-macro libraries), with .gpu/run-tests.sh, .gpu/run-benches.sh, gpu-check.sh and
# gpu-bench.sh, and packs it all into .gpu.tar.xz for a GPU host without a Rust toolchain.
# There: tar -xJf .gpu.tar.xz && bash .gpu/gpu-check.sh (or gpu-bench.sh); with onnxruntime-gpu
# staged by scripts/gpu-ort-stage.sh the ORT CUDA EP tests run too.
# Usage: scripts/gpu-bundle.sh [extra cargo args]
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
bash scripts/setup.sh
. scripts/env.sh
out="$root/.gpu"
# (In a worktree .git is a file: ask git where the exclude file is.)
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf "$out"; mkdir -p "$out/tests" "$out/benches" "$out/lib"
# One profile for all three builds (the same settings each time, so a second bundle rebuilds
# only what changed): no debug info, stripped; the executables embed the kernels' PTX.
export CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols
export CARGO_PROFILE_BENCH_DEBUG=false CARGO_PROFILE_BENCH_STRIP=symbols

# Copies what cargo's JSON messages (stdin) name into $1: test/bench executables, and every
# cdylib (into lib/).
collect() {
  python3 -c '
import json, os, shutil, sys
dest = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact":
        continue
    exe = m.get("executable")
    if exe and m.get("profile", {}).get("test"):
        shutil.copy2(exe, dest)
    for f in m.get("filenames", []):
        if f.endswith(".so") and "cdylib" in m.get("target", {}).get("kind", []):
            shutil.copy2(f, os.path.join(os.path.dirname(dest), "lib"))
' "$1"
}

t0=$(date +%s)
echo "gpu-bundle: building the release test executables (several minutes on 2 cores the first time)"
$CARGO test --release --no-run --message-format=json "$@" | collect "$out/tests"
echo "gpu-bundle: building the bench executables"
$CARGO bench --no-run --message-format=json "$@" | collect "$out/benches"
echo "gpu-bundle: building libdlkern.so"
$CARGO build --release --message-format=json "$@" | collect "$out/tests"

cat > "$out/run-tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test executable, ignored (GPU) tests included. Extra args go to each.
here=$(cd "$(dirname "$0")" && pwd); export DLKERN_BUNDLE_LIB_DIR="$here/lib"
status=0
for t in "$here"/tests/*; do
  [ -x "$t" ] || continue
  echo "=== $(basename "$t")"
  "$t" --include-ignored "$@" || status=1
done
exit $status
RUN
cat > "$out/run-benches.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled bench executable (criterion) with --bench. Extra args go to each.
here=$(cd "$(dirname "$0")" && pwd); export DLKERN_BUNDLE_LIB_DIR="$here/lib"
for b in "$here"/benches/*; do
  [ -x "$b" ] || continue
  echo "=== $(basename "$b")"; "$b" --bench "$@"
done
RUN
chmod +x "$out"/*.sh
cp scripts/gpu-check.sh scripts/gpu-bench.sh "$out/"
# The executables embed the kernels' PTX text, which compresses ~10x: the archive is what fits
# the GPU host's transfer limit.
echo "gpu-bundle: packing .gpu.tar.xz"
tar -cf - .gpu | xz -T0 -6 > .gpu.tar.xz
echo "gpu-bundle: done in $(( $(date +%s) - t0 )) s: $(ls "$out/tests" | wc -l) test and $(ls "$out/benches" | wc -l) bench executables, $(du -sh .gpu.tar.xz | cut -f1) in .gpu.tar.xz"
