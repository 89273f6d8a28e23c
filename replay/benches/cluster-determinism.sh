#!/usr/bin/env bash
# Acceptance of the cluster: 100 runs with one seed are byte-identical.
#   replay/benches/cluster-determinism.sh [RUNS=100]
# Each run replays examples/policy_search/shared-prefixes.yaml (1 minute of
# it) on 8 instances with weighted routing, a token bucket and periodic
# signal refresh, and the checksums of all outputs are compared; then as
# many runs of the same workload autoscaled from 2 to 8 instances
# (redirect drains) with a CPU KV tier, flow control and a 2 s client
# timeout (preemptions and cancellations), and of a P/D split (3 + 5).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${1:-100}"
cargo build -q --release  # the whole workspace: the same artifacts as every other build
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
first=""
for i in $(seq 1 "$RUNS"); do
  target/release/blis-replay run --workload-spec examples/policy_search/shared-prefixes.yaml \
      --model meta-llama/Llama-3.1-8B-Instruct --horizon-s 60 --total-kv-blocks 6000 \
      --num-instances 8 --routing-scorers prefix-affinity:3,queue-depth:2,kv-utilization:2,no-hit-lru:1 \
      --snapshot-refresh-interval-us 50000 --admission token-bucket \
      --token-bucket-capacity 300000 --token-bucket-refill-rate 150000 \
      --fitness-weights throughput:0.3,p99_ttft:0.4,mean_e2e:0.3 --out "$dir/run" >/dev/null 2>&1
  sum=$(cat "$dir"/run.yaml "$dir"/run.csv "$dir"/run.itl.csv "$dir"/run.steps.csv "$dir"/run.metrics.csv "$dir"/run.summary.json | sha256sum | cut -d' ' -f1)
  if [ -z "$first" ]; then first=$sum; fi
  if [ "$sum" != "$first" ]; then
    echo "run $i differs: $sum != $first" >&2
    exit 1
  fi
done
echo "$RUNS runs byte-identical (sha256 $first)"

advanced() {
  local name=$1
  shift
  local first=""
  for i in $(seq 1 "$RUNS"); do
    target/release/blis-replay run --workload-spec examples/policy_search/shared-prefixes.yaml \
        --model meta-llama/Llama-3.1-8B-Instruct --horizon-s 60 --routing weighted "$@" \
        --out "$dir/adv" >/dev/null 2>&1
    sum=$(cat "$dir"/adv.yaml "$dir"/adv.csv "$dir"/adv.itl.csv "$dir"/adv.steps.csv "$dir"/adv.metrics.csv "$dir"/adv.summary.json | sha256sum | cut -d' ' -f1)
    if [ -z "$first" ]; then first=$sum; fi
    if [ "$sum" != "$first" ]; then
      echo "$name: run $i differs: $sum != $first" >&2
      exit 1
    fi
  done
  echo "$name: $RUNS runs byte-identical (sha256 $first)"
}
advanced "autoscaled 2-8, CPU tier, flow control, 2 s timeout" \
    --num-instances 2 --autoscaler target-utilization --autoscaler-min 2 --autoscaler-max 8 \
    --autoscaler-interval-s 5 --provisioning-delay-s 5 --warmup-s 5 --drain-policy redirect \
    --total-kv-blocks 1500 --kv-cpu-blocks 6000 --flow-control --client-timeout-s 2
advanced "P/D 3+5, CPU tier" --architecture pd --prefill-instances 3 --decode-instances 5 \
    --total-kv-blocks 3000 --kv-cpu-blocks 6000
