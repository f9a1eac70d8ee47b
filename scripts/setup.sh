#!/usr/bin/env bash
# Installs what dlkern needs on a Debian/Ubuntu machine (idempotent; root or sudo for apt):
# - the kernel compiler: Debian's rustc-web + cargo-web + rust-web-src (a rustc with library
#   source, so `-Zbuild-std=core` can build `core` for nvptx64; see builder/);
# - a Python environment in .venv with ptxas (PyPI nvidia-cuda-nvcc, to check PTX without a
#   GPU), onnx, onnxruntime and numpy (the ONNX Runtime tests), and onnxruntime-genai (the
#   generation loop of the demo and the end-to-end tests; its CPU build, on top of onnxruntime),
#   at the versions scripts/constraints.txt pins.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
[ -x /usr/bin/rustc ] && [ -f /usr/lib/rustlib/src/rust/library/core/Cargo.toml ] || need_apt+=(rustc-web cargo-web rust-web-src)
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
# The packages below at the versions scripts/constraints.txt pins (onnxruntime is the release
# whose own kernels the drop-ins are compared against; the GPU host stages the same one).
packages=(nvidia-cuda-nvcc onnx onnxruntime onnxruntime-genai numpy pytest matplotlib onnx-ir apache-tvm-ffi)
if ! .venv/bin/python - scripts/constraints.txt "${packages[@]}" <<'PY'
import glob, importlib.metadata, importlib.util, os, sys
pins = dict(l.strip().split("==") for l in open(sys.argv[1]) if "==" in l and not l.startswith("#"))
norm = lambda n: n.lower().replace("_", "-")
pins = {norm(k): v for k, v in pins.items()}
stale = []
for name in sys.argv[2:]:
    try:
        if importlib.metadata.version(name) != pins[norm(name)]:
            stale.append(name)
    except importlib.metadata.PackageNotFoundError:
        stale.append(name)
spec = importlib.util.find_spec("nvidia")
if spec is None or not any(glob.glob(os.path.join(d, "*", "bin", "ptxas")) for d in spec.submodule_search_locations):
    stale.append("nvidia-cuda-nvcc (ptxas)")
if stale:
    print("setup: missing or not at the pinned version: " + ", ".join(stale))
sys.exit(1 if stale else 0)
PY
then
  echo "setup: pip install ${packages[*]} (pinned by scripts/constraints.txt) into .venv: a minute or two"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt "${packages[@]}"
fi
# The host crate's toolchain: rustup's cargo where there is one, else Debian's (scripts/env.sh);
# Cargo.toml's rust-version is the oldest that builds it.
. scripts/env.sh
need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
have=$($CARGO --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  echo "setup: $CARGO is $have; dlkern needs Rust $need or newer (Cargo.toml rust-version): install it with rustup" >&2
  exit 1
fi
echo "setup: ok (host Rust $have, kernel compiler $(/usr/bin/rustc --version | awk '{print $2}'), Python packages as scripts/constraints.txt pins)"
