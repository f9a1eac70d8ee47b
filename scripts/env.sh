# Sourced by the scripts after setup.sh: the cargo for the host crate (rustup's if present,
# else Debian's), the project's Python, and ptxas for the PTX tests.
root=${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
if command -v cargo >/dev/null; then CARGO=${CARGO:-cargo}; else CARGO=${CARGO:-/usr/bin/cargo}; export RUSTC=${RUSTC:-/usr/bin/rustc}; fi
export CARGO
export PYTHON=${PYTHON:-$root/.venv/bin/python}
if [ -z "${DLKERN_PTXAS:-}" ]; then
  DLKERN_PTXAS=$("$PYTHON" - <<'PY'
import glob, os, nvidia
hits = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "bin", "ptxas"))]
print(hits[0] if hits else "")
PY
  )
  export DLKERN_PTXAS
fi
# apache-tvm-ffi's headers and libtvm_ffi (the TVM-FFI plug-in tests compile a library against them).
if [ -z "${DLKERN_TVM_FFI_DIR:-}" ]; then
  DLKERN_TVM_FFI_DIR=$("$PYTHON" -c 'import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))' 2>/dev/null || true)
  export DLKERN_TVM_FFI_DIR
fi
