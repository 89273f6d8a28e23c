#!/usr/bin/env bash
# The README's main-job command from a fresh clone with nothing beside it
# (no ../shared): clones this checkout's HEAD into an empty temporary
# folder, builds it in release and runs `target/release/blis-loop` there.
#
#   tests/fresh-clone.sh
#
# CARGO_TARGET_DIR may point at an existing target folder to reuse its
# compiled dependencies (.ci/run passes the checkout's own). Exits non-zero,
# with the main job's output, when the build or the main job fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
git clone -q . "$root/blis"
if [ -e "$root/shared" ]; then
    echo "fresh-clone.sh: $root/shared exists" >&2
    exit 1
fi
cd "$root/blis"
t0=$(date +%s)
cargo build -q --release -p blis-loop
t1=$(date +%s)
bin="${CARGO_TARGET_DIR:-target}/release/blis-loop"
if ! "$bin" --out "$root/out" >"$root/loop.log" 2>&1; then
    echo "fresh-clone.sh: the main job failed in a clone without ../shared:" >&2
    cat "$root/loop.log" >&2
    exit 1
fi
t2=$(date +%s)
[ -s "$root/out/report.html" ] || {
    echo "fresh-clone.sh: no report.html" >&2
    exit 1
}
echo "fresh clone without ../shared: build $((t1 - t0)) s, main job $((t2 - t1)) s, report written"
tail -n 3 "$root/loop.log"
