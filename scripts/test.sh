#!/usr/bin/env bash
# The test command: installs what is missing, then runs formatting and lint checks and every
# CPU test (GPU tests are reported as ignored; run them on a GPU host, see README).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
bash scripts/setup.sh
. scripts/env.sh
echo "== cargo fmt --check"
$CARGO fmt --all --check
(cd kernels-gpu && $CARGO fmt --check)
if $CARGO clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy"
  $CARGO clippy --workspace --all-targets -- -D warnings
else
  echo "== cargo clippy: not installed with this toolchain, skipped"
fi
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" $CARGO doc --workspace --no-deps --quiet
echo "== cargo test"
$CARGO test --workspace
echo "== cargo bench --no-run (GPU benches must build)"
$CARGO bench --workspace --no-run
echo "== python tests (C ABI through ctypes; GPU ones skip without torch and a GPU)"
$CARGO build --workspace
DLKERN_LIB="$root/target/debug/libdlkern.so" "$PYTHON" -m pytest -q -p no:cacheprovider tests/python
