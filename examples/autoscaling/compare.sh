#!/usr/bin/env bash
# Fixed-size vs autoscaled serving of examples/burst.yaml (README,
# "Autoscaling"): p99 TTFT and GPU-hours side by side.
#   examples/autoscaling/compare.sh [BIN_DIR=target/release]
# Fixed-size GPU-hours: instances × the run (first send to last response);
# autoscaled: the replica-seconds the autoscaler billed (each slot from its
# scale-up decision, or time 0, until it is released or the run ends).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${1:-target/release}"
R="$BIN/blis-replay"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(run --workload-spec examples/burst.yaml --model meta-llama/Llama-3.1-8B-Instruct
    --routing least-loaded --no-itl --sample-interval-ms 0)
row() {
    local name=$1
    shift
    "$R" "${common[@]}" "$@" --out "$out/x" >/dev/null 2>&1
    python3 - "$name" "$out/x.summary.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
c = s.get("cluster") or {}
a = c.get("autoscale")
if a:
    gpu_h, ups = a["gpu_hours"], f'{a["scale_ups"]} up, {a["scale_downs"]} down, peak {a["peak_ready"]}'
else:
    n = c.get("num_instances", 1)
    gpu_h, ups = n * s["throughput"]["duration_s"] / 3600, "-"
t = s["ttft_ms"]
print(f"| {name} | {t['p50'] / 1e3:.2f} | {t['p99'] / 1e3:.2f} | {gpu_h:.2f} | {ups} |")
PY
}
echo "| deployment | p50 TTFT s | p99 TTFT s | GPU-hours | scaling |"
echo "|---|---|---|---|---|"
row "fixed, 1 instance (the base load)" --num-instances 1
row "fixed, 4 instances (the burst)" --num-instances 4
for startup in "30 0 60" "30 0 0" "5 0 0"; do
    read -r prov load warm <<<"$startup"
    t=$((prov + load + warm))
    row "autoscaled 1-6, threshold, ready ${t} s after a scale-up" --num-instances 1 \
        --autoscaler threshold --autoscaler-min 1 --autoscaler-max 6 \
        --provisioning-delay-s "$prov" --model-load-s "$load" --warmup-s "$warm"
    row "autoscaled 1-6, target-utilization, ready ${t} s after a scale-up" --num-instances 1 \
        --autoscaler target-utilization --autoscaler-min 1 --autoscaler-max 6 \
        --provisioning-delay-s "$prov" --model-load-s "$load" --warmup-s "$warm"
done
row "autoscaled 2-6, target-utilization, ready 90 s after a scale-up" --num-instances 2 \
    --autoscaler target-utilization --autoscaler-min 2 --autoscaler-max 6
# A gateway queue (flow control) holds what the replicas cannot take yet,
# so the replicas that come up take the backlog instead of the first one.
row "autoscaled 1-6, threshold, ready 90 s, gateway flow control" --num-instances 1 \
    --autoscaler threshold --autoscaler-min 1 --autoscaler-max 6 --flow-control
row "autoscaled 1-6, threshold, ready 30 s, gateway flow control" --num-instances 1 \
    --autoscaler threshold --autoscaler-min 1 --autoscaler-max 6 --flow-control \
    --provisioning-delay-s 30 --warmup-s 0
# P/D: one prefill instance; the decode pool fixed, or autoscaled (its
# replicas only; the prefill one is billed for the whole run).
row "P/D, 1 prefill + 2 decode, fixed" --architecture pd --prefill-instances 1 --decode-instances 2
row "P/D, 1 prefill + 4 decode, fixed" --architecture pd --prefill-instances 1 --decode-instances 4
row "P/D, 1 prefill + decode autoscaled 1-5, threshold, ready 30 s" --architecture pd \
    --prefill-instances 1 --decode-instances 1 \
    --autoscaler threshold --autoscaler-min 1 --autoscaler-max 5 \
    --provisioning-delay-s 30 --warmup-s 0
