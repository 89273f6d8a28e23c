#!/usr/bin/env bash
# Load-generator precision: the highest open-loop rate of short streaming
# requests that blis-loadgen sustains against blis-mockserver on this
# machine with the achieved rate within 1% of the planned one and a p99
# send lag of at most 2 ms, and the client's CPU time per request.
#
#   loadgen/benches/precision.sh [RATE ...]      (default: 2000 5000 8000 10000 12000 14000)
#
# Both run as release binaries in separate processes on the same host (so
# they share its cores); the mock runs 1000x faster than real time, so the
# server's engine is never the bottleneck. Each rate runs 3 times for about
# 5 s each (REPEAT=N to change); a rate passes when every run does.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q  # the whole workspace: the same artifacts as every other build
bin=target/release
out=$(mktemp -d)
trap 'kill $mock 2>/dev/null || true; rm -rf "$out"' EXIT
# One HTTP worker for the mock (MOCK_WORKERS=N to change; tokio reads
# TOKIO_WORKER_THREADS): on a 2-core machine a second one only adds context
# switches between the two processes (compare the mock CPU column).
TOKIO_WORKER_THREADS=${MOCK_WORKERS:-1} "$bin/blis-mockserver" --port 0 --time-scale 1000 >"$out/mock.log" 2>&1 &
mock=$!
for _ in $(seq 50); do grep -q listening "$out/mock.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$out/mock.log")
model=meta-llama/Llama-3.1-8B-Instruct
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(2000 5000 8000 10000 12000 14000)
printf '| planned req/s | achieved req/s | within 1%% | send lag p50 ms | p99 ms | max ms | ok | CPU µs/request | mock CPU µs/request | verdict |\n'
printf '|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n'
# The mock's user + system CPU time, clock ticks (Linux /proc).
mock_ticks() { awk '{print $14 + $15}' "/proc/$mock/stat"; }
hz=$(getconf CLK_TCK)
for rate in "${rates[@]}"; do
 for _ in $(seq "${REPEAT:-3}"); do
  n=$((rate * 5))
  t0=$(mock_ticks)
  "$bin/blis-loadgen" run --server-url "$url" --model "$model" --rate "$rate" \
    --num-requests "$n" --input-tokens 16 --output-tokens 2 --scrape-interval-ms 1000 \
    --max-send-lag-ms 2 --json --out "$out/r$rate" >"$out/s.json" 2>"$out/err.log" || true
  t1=$(mock_ticks)
  python3 - "$out/s.json" "$((t1 - t0))" "$hz" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
mock_us = int(sys.argv[2]) / int(sys.argv[3]) * 1e6 / max(s["requests"]["planned"], 1)
sc, r = s["schedule"], s["requests"]
planned, achieved = sc["requested_rate"], sc["achieved_rate"]
within = abs(achieved - planned) / planned <= 0.01
print(f"| {planned:.0f} | {achieved:.0f} | {'yes' if within else 'no'} | {sc['send_lag_p50_ms']:.3f} | "
      f"{sc['send_lag_p99_ms']:.3f} | {sc['send_lag_max_ms']:.3f} | {r['ok']}/{r['planned']} | "
      f"{s['client']['cpu_us_per_request']:.1f} | {mock_us:.1f} | {s['verdict'].split(':')[0]} |")
PY
 done
done
