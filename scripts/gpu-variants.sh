#!/usr/bin/env bash
# Builds one test and one bench executable of a kernel family for several git refs (branches
# or commits) and packs them with a runner into .gpu-variants-FAMILY.tar.xz, so that one GPU run
# can test and time the variants side by side (same machine, same run, same inputs). Each family
# has its own archive, so several families can travel to one GPU run.
#
# Usage: scripts/gpu-variants.sh FAMILY REF [REF ...]
#   e.g. scripts/gpu-variants.sh attention main wip/attention-regs wip/attention-regs-causal
#   FAMILY names the test and bench targets; TEST:BENCH where they differ.
# There: tar -xJf .gpu-variants-FAMILY.tar.xz && bash .gpu-variants-FAMILY/run.sh [bench filter]
#   runs every variant's GPU tests, then each bench twice in alternating order (A B A B), and
#   prints one line per bench and variant.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
family=${1%%:*}; bench=${1##*:}; shift
root=$(git rev-parse --show-toplevel); cd "$root"
out="$root/.gpu-variants-$family"
rm -rf "$out"; mkdir -p "$out"
# One target directory for all variants: dependencies build once.
export CARGO_TARGET_DIR="$root/target/variants"
export CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols
export CARGO_PROFILE_BENCH_DEBUG=false CARGO_PROFILE_BENCH_STRIP=symbols
executable() { # target name -> path of its executable
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
for ref in "$@"; do
  name=$(echo "$ref" | tr '/' '-')
  tree=$(mktemp -d)
  git worktree add --quiet --detach "$tree" "$ref"
  (
    cd "$tree"
    echo "== $ref ($(git rev-parse --short HEAD))"
    cp "$(cargo build --release --test "$family" --message-format=json | executable "$family")" "$out/test-$name"
    cp "$(cargo build --release --bench "$bench" --message-format=json | executable "$bench")" "$out/bench-$name"
  )
  git worktree remove --force "$tree"
  echo "$name $ref" >> "$out/variants"
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# GPU tests of every variant, then every bench twice in alternating order.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
filter=${1:-}
while read -r name ref; do
  echo "== tests $ref"
  # A failure keeps its message (proptest prints the minimal failing case after the panic).
  timeout 300 "$here/test-$name" --include-ignored gpu_ 2>&1 | grep -E -A3 "^test result|panicked|FAILED" | head -40
done < "$here/variants"
for round in 1 2; do
  while read -r name ref; do
    timeout 300 "$here/bench-$name" --bench --warm-up-time 0.3 --measurement-time 1 --noplot $filter 2>&1 \
      | awk -v v="$ref" -v r="$round" '/^[a-z0-9_]+\//{id=$1}
          /time:/{for(i=1;i<=NF;i++) if($i=="time:") print r, v, id, $(i+3), $(i+4)}'
  done < "$here/variants"
done
RUN
tar -cf - -C "$root" ".gpu-variants-$family" | xz -T0 -6 > "$root/.gpu-variants-$family.tar.xz"
du -sh "$root/.gpu-variants-$family.tar.xz"
