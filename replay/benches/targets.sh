#!/usr/bin/env bash
# The replay's speed on the reference cases of ../shared/bench (the
# workloads raced against BLIS, the Go simulator), through the CLI with
# default outputs, as a user runs it:
#
#   replay/benches/targets.sh [RUNS=5]
#
# Each case: one warm-up, then RUNS runs (the 1M-request case: RUNS_BIG
# runs, default 1, no warm-up); prints the median, min and max wall time
# (bash's EPOCHREALTIME around the process; each run writes new files) and
# the peak resident memory (GNU time), then whether the median is within
# the case's aim (and, at 1M requests, the peak within 200 MB), with the
# machine's load average before and after. Engine settings
# are the bench README's: Qwen2.5-7B on an H100, TP 1; the race cases with
# 61,048 KV blocks, max_num_seqs 256, max_num_batched_tokens 2048,
# max_model_len 32768, block_size 16, no async scheduling, round-robin.
#
# Environment: CASES (a space-separated subset of the case names printed),
# RUNS_BIG (default 1), REPLAY (the binary to time instead of building
# target/release/blis-replay, e.g. target/pgo/release/blis-replay from
# replay/pgo-build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${1:-5}"
RUNS_BIG="${RUNS_BIG:-1}"
B=../shared/bench
GT=../shared/vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen
[ -d "$B" ] || { echo "targets.sh: $B not found (the bench workloads live in ../shared/bench)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "targets.sh: needs GNU time (/usr/bin/time) for peak memory" >&2; exit 2; }
if [ -n "${REPLAY:-}" ]; then
    R=$REPLAY
    [ -x "$R" ] || { echo "targets.sh: REPLAY=$R is not an executable" >&2; exit 2; }
else
    cargo build -q --release
    R=target/release/blis-replay
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

source replay/benches/race-engine.sh
race=("${RACE_ENGINE[@]}")
cluster=(--model qwen/qwen2.5-7b-instruct --hardware H100 --tp 1 --num-instances 16
    --routing weighted --latency-model roofline)
sed -e "s/^aggregate_rate: .*/aggregate_rate: $((22 * 64)).0/" \
    -e "s/^num_requests: .*/num_requests: 1000000/" "$B/race-1k-x1.yaml" >"$dir/race-1m-x64.yaml"

# case NAME RUNS AIM_S PEAK_AIM_MB COMMAND...: times COMMAND --out
# DIR/out against its aims (a median of at most AIM_S seconds; a peak of
# at most PEAK_AIM_MB, 0 for none). Peak memory comes from a run under GNU
# time (the warm-up; without one, every timed run), the wall time from
# runs without it (its fork and exec would add a few ms to the small
# cases).
case_() {
    local name=$1 runs=$2 aim=$3 peak_aim=$4
    shift 4
    if [ -n "${CASES:-}" ] && ! [[ " $CASES " == *" $name "* ]]; then
        return
    fi
    local times=() peak=0 wrap=(/usr/bin/time -f '%M' -o "$dir/time")
    run_() {
        "$@" --out "$dir/out" >/dev/null 2>"$dir/err" || {
            echo "targets.sh: $name failed:" >&2
            cat "$dir/err" >&2
            exit 1
        }
        if [ "${1:-}" = /usr/bin/time ]; then
            local kb
            kb=$(tail -1 "$dir/time")
            [ "$kb" -gt "$peak" ] && peak=$kb
        fi
    }
    if [ "$runs" = "$RUNS" ]; then
        run_ "${wrap[@]}" "$@" # warm-up
        rm -f "$dir"/out.*
        wrap=()
    fi
    for _ in $(seq 1 "$runs"); do
        local t0 t1
        t0=$EPOCHREALTIME
        run_ "${wrap[@]}" "$@"
        t1=$EPOCHREALTIME
        times+=("$(echo "$t1 - $t0" | bc -l)")
        rm -f "$dir"/out.*
    done
    printf '%s\n' "${times[@]}" | sort -n | awk -v name="$name" -v peak="$peak" \
        -v aim="$aim" -v peak_aim="$peak_aim" '
        { v[NR] = $1 }
        END {
            med = v[int((NR + 1) / 2)]
            met = med <= aim && (peak_aim == 0 || peak / 1024 <= peak_aim)
            limit = sprintf("<= %g s", aim)
            if (peak_aim > 0) limit = limit sprintf(", <= %d MB", peak_aim)
            printf "%-34s median %8.3f s (min %.3f, max %.3f, %d runs), peak %4d MB; aim %s: %s\n",
                name, med, v[1], v[NR], NR, peak / 1024, limit, met ? "met" : "not met"
        }'
}

echo "# $R, $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
case_ race-1k-x1/roofline "$RUNS" 0.010 0 $R run --workload-spec $B/race-1k-x1.yaml --num-instances 1 \
    "${race[@]}" --latency-model roofline
case_ race-10k-x4/roofline "$RUNS" 0.033 0 $R run --workload-spec $B/race-10k-x4.yaml --num-instances 4 \
    "${race[@]}" --latency-model roofline
case_ race-100k-x16/roofline "$RUNS" 0.49 0 $R run --workload-spec $B/race-100k-x16.yaml --num-instances 16 \
    "${race[@]}" --latency-model roofline
case_ race-100k-x16/blis-physics "$RUNS" 0.58 0 $R run --workload-spec $B/race-100k-x16.yaml --num-instances 16 \
    "${race[@]}" --latency-model blis-physics
case_ race-100k-x16/trained-physics "$RUNS" 0.58 0 $R run --workload-spec $B/race-100k-x16.yaml --num-instances 16 \
    "${race[@]}" --latency-model trained-physics
case_ cluster-100k/weighted "$RUNS" 0.8 0 $R run --workload-spec $B/cluster-100k.yaml "${cluster[@]}" \
    --routing-scorers prefix-affinity:3,queue-depth:2,kv-utilization:2
case_ cluster-100k/tiered "$RUNS" 1.5 0 $R run --workload-spec $B/cluster-100k.yaml "${cluster[@]}" \
    --routing-scorers prefix-affinity:3,queue-depth:2 --total-kv-blocks 4000 --kv-cpu-blocks 40000 --no-itl
case_ ground-truth-9k "$RUNS" 0.060 0 $R run --import "vllm-gt:$GT"
case_ race-1m-x64/roofline "$RUNS_BIG" 8 200 $R run --workload-spec "$dir/race-1m-x64.yaml" --num-instances 64 \
    "${race[@]}" --latency-model roofline
echo "# done $(date -u +%H:%MZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
