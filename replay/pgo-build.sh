#!/usr/bin/env bash
# The fastest blis-replay: a release build optimised with a profile of its
# own runs (profile-guided optimisation, as the Rust compiler documents it:
# https://doc.rust-lang.org/rustc/profile-guided-optimization.html).
#
#   replay/pgo-build.sh            # writes target/pgo/release/blis-replay
#
# Three steps: an instrumented release build (target/pgo-gen), training
# runs of it on the workloads in examples/ (none of them a benchmark case:
# a prefix-sharing chat mix on 16 instances with weighted routing, the
# same with too few KV blocks and a CPU KV tier (preemptions, offloads,
# reloads), a ServeGen-style mix under the three latency models,
# multi-turn sessions, P/D disaggregation), then a release build that uses
# the merged profile. The binary gives byte-identical outputs to
# `cargo build --release` (only the code's layout and inlining differ).
# Code the training never ran is not made slower (docs/replay.md).
# With CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
# in the environment: a few % faster again, for twice the build time.
#
# Needs `llvm-profdata` of the compiler's own LLVM version:
# `rustup component add llvm-tools` (or LLVM_PROFDATA=/path/to/it).
# Takes two release builds' time (5–6 minutes on 2 cores) and 1 GB of
# disk under target/.
set -euo pipefail
cd "$(dirname "$0")/.."

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="${LLVM_PROFDATA:-$sysroot/lib/rustlib/$host/bin/llvm-profdata}"
if ! [ -x "$profdata" ]; then
    echo "pgo-build.sh: llvm-profdata not found at $profdata; run 'rustup component add llvm-tools' or set LLVM_PROFDATA" >&2
    exit 2
fi

data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

echo "pgo-build.sh: instrumented build (target/pgo-gen)" >&2
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$data/raw" \
    cargo build -q --release -p blis-replay --bin blis-replay --target-dir target/pgo-gen
gen=target/pgo-gen/release/blis-replay

echo "pgo-build.sh: training runs" >&2
train() {
    "$gen" run "$@" --out "$data/out" >/dev/null 2>"$data/err" || {
        echo "pgo-build.sh: training run failed: blis-replay run $*" >&2
        cat "$data/err" >&2
        exit 1
    }
}
qwen=(--model qwen/qwen2.5-7b-instruct --hardware H100 --tp 1)
train --workload-spec examples/chat-512.yaml --num-requests 20000 "${qwen[@]}" --num-instances 16 \
    --routing weighted --routing-scorers prefix-affinity:3,queue-depth:2,kv-utilization:2
train --workload-spec examples/chat-512.yaml --num-requests 20000 "${qwen[@]}" --num-instances 16 \
    --routing weighted --routing-scorers prefix-affinity:3,queue-depth:2 \
    --total-kv-blocks 700 --kv-cpu-blocks 10000 --no-itl
for model in roofline blis-physics trained-physics; do
    train --workload-spec examples/servegen-language.yaml --num-requests 5000 "${qwen[@]}" \
        --num-instances 4 --latency-model "$model"
done
train --workload-spec examples/chat-sessions.yaml --num-requests 5000 "${qwen[@]}" --num-instances 4
train --workload-spec examples/pd-long-prompts.yaml "${qwen[@]}" --architecture pd \
    --prefill-instances 2 --decode-instances 2

echo "pgo-build.sh: optimised build (target/pgo)" >&2
"$profdata" merge -o "$data/merged.profdata" "$data/raw"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$data/merged.profdata" \
    cargo build -q --release -p blis-replay --bin blis-replay --target-dir target/pgo
echo "target/pgo/release/blis-replay"
