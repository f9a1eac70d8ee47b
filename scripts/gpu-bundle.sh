#!/usr/bin/env bash
# Builds the release test and bench executables and the cdylib into .gpu/ (via the shared
# bundle.sh), stripped and without proc-macro libraries, and packs them into .gpu.tar.xz, which
# fits the GPU host's transfer limit. Usage: scripts/gpu-bundle.sh [cargo args]
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
shared=${DLKERN_SHARED_DIR:-$root/../shared}
CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols \
  CARGO_PROFILE_BENCH_DEBUG=false CARGO_PROFILE_BENCH_STRIP=symbols \
  bash "$shared/gpu/bundle.sh" "$@" >/dev/null
# bundle.sh copies every .so cargo produced, proc-macro crates included; only ours is needed.
find .gpu/lib -name '*.so' ! -name 'libdlkern*' -delete
cp scripts/gpu-check.sh scripts/gpu-bench.sh .gpu/
# The executables embed the kernels' PTX text, which compresses ~10x: the archive is what fits
# the GPU host's transfer limit. There: tar -xJf .gpu.tar.xz && bash .gpu/gpu-check.sh
tar -cf - .gpu | xz -T0 -6 > .gpu.tar.xz
du -sh .gpu .gpu.tar.xz
