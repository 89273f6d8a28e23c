#!/usr/bin/env bash
# The replay's speed through the CLI with default outputs (issue 15, item 7):
#   replay/benches/speed-targets.sh [RUNS=5]   (OVERWRITE=1: every run overwrites one prefix)
# 1. the 9,000-request Llama-2-7B ground-truth run (trace, ITL in step form,
#    metrics every 100 ms, summary);
# 2. 100,000 requests of examples/chat-512.yaml (prefix-sharing chat, 512-token
#    mean prompts and outputs) on 16 instances with weighted routing;
# 3. the same with --no-itl;
# 4. the same as 2. with a CPU KV tier (issue 16): 2,400 GPU blocks per
#    instance, so that the GPU is under pressure, 20,000 CPU blocks,
#    on-evict offload at the default threshold;
# 5. the same as 2. autoscaled from 4 to 16 instances (target-utilization,
#    replicas ready 30 s after a scale-up);
# 6. the same as 2. split into 8 prefill + 8 decode instances (issue 16);
# and the size of the outputs of 2. Prints the median and range of each.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${1:-5}"
cargo build -q --release
R=target/release/blis-replay
GT=../shared/vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# time_runs NAME OUT COMMAND...: runs COMMAND --out OUT.N, each run
# writing new files (as a first run does; with OVERWRITE=1 every run
# overwrites the same prefix, which adds the file system's truncation of
# the previous files to the time).
time_runs() {
    local name=$1 out=$2
    shift 2
    local times=()
    "$@" --out "$out.warm" >/dev/null 2>&1 # warm-up
    for i in $(seq 1 "$RUNS"); do
        local t0 t1 prefix="$out.$i"
        [ "${OVERWRITE:-0}" = 1 ] && prefix="$out"
        t0=$(date +%s.%N)
        "$@" --out "$prefix" >/dev/null 2>&1
        t1=$(date +%s.%N)
        times+=("$(echo "$t1 - $t0" | bc -l)")
        [ "$prefix" = "$out" ] || rm -f "$prefix".*
    done
    printf '%s\n' "${times[@]}" | sort -n | awk -v name="$name" '
        { v[NR] = $1 }
        END { printf "%-44s median %.3f s (min %.3f, max %.3f, %d runs)\n", name, v[int((NR + 1) / 2)], v[1], v[NR], NR }'
}

time_runs "ground truth, 9,000 requests, default outputs" "$dir/gt" \
    $R run --import "vllm-gt:$GT"
chat=(run --workload-spec examples/chat-512.yaml --model meta-llama/Llama-3.1-8B-Instruct
    --num-requests 100000 --num-instances 16 --routing weighted)
time_runs "chat-512, 100K requests x 16, default outputs" "$dir/chat" $R "${chat[@]}"
time_runs "chat-512, 100K requests x 16, --no-itl" "$dir/chat-no-itl" $R "${chat[@]}" --no-itl
time_runs "chat-512, 100K x 16, CPU KV tier" "$dir/chat-tier" $R "${chat[@]}" \
    --total-kv-blocks 2400 --kv-cpu-blocks 20000
auto=(run --workload-spec examples/chat-512.yaml --model meta-llama/Llama-3.1-8B-Instruct
    --num-requests 100000 --num-instances 4 --routing weighted)
time_runs "chat-512, 100K, autoscaled 4-16" "$dir/chat-auto" $R "${auto[@]}" \
    --autoscaler target-utilization --autoscaler-min 4 --autoscaler-max 16 \
    --provisioning-delay-s 30 --warmup-s 0
pd=(run --workload-spec examples/chat-512.yaml --model meta-llama/Llama-3.1-8B-Instruct
    --num-requests 100000 --routing weighted --architecture pd --prefill-instances 8 --decode-instances 8)
time_runs "chat-512, 100K, 8 prefill + 8 decode" "$dir/chat-pd" $R "${pd[@]}"
echo "outputs of chat-512 with default outputs: $(du -cb "$dir"/chat.warm.* | tail -1 | cut -f1) bytes"
ls -l "$dir"/chat.warm.*
