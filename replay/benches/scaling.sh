#!/usr/bin/env bash
# How the replay's time and peak memory grow with requests and instances,
# through the CLI with default outputs (trace, per-token ITL, metrics,
# summary), as a user runs it:
#
#   replay/benches/scaling.sh [RUNS=3] [OUT=docs/scaling]
#
# Every case is the bench race workload (../shared/bench/race-1k-x1.yaml:
# Poisson arrivals, Gaussian 512±256 prompt and output tokens) at 22 req/s
# per instance, so that each instance carries the same load whatever the
# cluster size; the engine settings are the bench README's (Qwen2.5-7B on an
# H100, TP 1, 61,048 KV blocks, max_num_seqs 256, max_num_batched_tokens
# 2048, round-robin routing, no async scheduling).
#
# Cases up to 100K requests: the median of RUNS runs after a warm-up; 1M
# requests: RUNS_BIG runs (default 1), no warm-up. Wall time from the
# clock around the process, peak resident memory from GNU time. Writes OUT.tsv (one line per run),
# then OUT.md (the table of medians and the fitted exponents) and OUT.svg
# (the log-log plot) through `cargo run --example scaling_report`.
#
# Environment: SIZES (default "1000 10000 100000 1000000"), INSTANCES
# (default "1 4 16 64 256"), MODELS (default "roofline trained-physics"),
# RUNS_BIG (default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${1:-3}"
OUT="${2:-docs/scaling}"
SIZES="${SIZES:-1000 10000 100000 1000000}"
INSTANCES="${INSTANCES:-1 4 16 64 256}"
MODELS="${MODELS:-roofline trained-physics}"
RUNS_BIG="${RUNS_BIG:-1}"
SPEC=../shared/bench/race-1k-x1.yaml
[ -f "$SPEC" ] || { echo "scaling.sh: $SPEC not found (the bench workloads live in ../shared/bench)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "scaling.sh: needs GNU time (/usr/bin/time) for peak memory" >&2; exit 2; }
cargo build -q --release
R=target/release/blis-replay
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source replay/benches/race-engine.sh
engine=("${RACE_ENGINE[@]}")

mkdir -p "$(dirname "$OUT")"
printf 'model\trequests\tinstances\trun\twall_s\tpeak_kb\n' >"$OUT.tsv"
started="$(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $started" >&2
for model in $MODELS; do
    for n in $SIZES; do
        for inst in $INSTANCES; do
            spec="$dir/spec-$n-$inst.yaml"
            sed -e "s/^aggregate_rate: .*/aggregate_rate: $((22 * inst)).0/" \
                -e "s/^num_requests: .*/num_requests: $n/" "$SPEC" >"$spec"
            cmd=("$R" run --workload-spec "$spec" --num-instances "$inst" "${engine[@]}"
                --latency-model "$model" --out "$dir/out")
            runs=$RUNS
            if [ "$n" -ge 1000000 ]; then
                runs=$RUNS_BIG
            else
                "${cmd[@]}" >/dev/null 2>&1 # warm-up
            fi
            for i in $(seq 1 "$runs"); do
                t0=$(date +%s.%N)
                /usr/bin/time -f '%M' -o "$dir/time" "${cmd[@]}" >/dev/null 2>"$dir/err" || {
                    echo "scaling.sh: $model $n x $inst failed:" >&2
                    cat "$dir/err" >&2
                    exit 1
                }
                t1=$(date +%s.%N)
                wall=$(echo "$t1 - $t0" | bc -l)
                kb=$(tail -1 "$dir/time")
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$n" "$inst" "$i" "$wall" "$kb" >>"$OUT.tsv"
                printf '%-16s %8s x %-4s run %s: %6.2f s %8d KB\n' "$model" "$n" "$inst" "$i" "$wall" "$kb" >&2
                rm -f "$dir"/out.*
            done
        done
    done
done
ended="$(date -u +%H:%MZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# done $ended" >&2
cargo run -q --release -p blis-replay --example scaling_report -- "$OUT.tsv" "$OUT" \
    "Measured by \`replay/benches/scaling.sh $RUNS\` from $started to $ended; medians of $RUNS runs after a warm-up up to 100K requests, $RUNS_BIG run(s) at 1M."
