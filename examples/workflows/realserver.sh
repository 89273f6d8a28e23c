#!/usr/bin/env bash
# The README's real-server numbers: llama.cpp's llama-server with a tiny
# random-weight model on this CPU (../shared/realserver).
#   1. the loop: observe examples/realserver-servegen.yaml, fit on the first
#      70%, replay all of it, compare the held-out 30%;
#   2. the server's own run-to-run spread: restart it, observe the same
#      workload again, and compare the two real traces (the floor for any
#      prediction), over the whole run and over the held-out requests alone
#      (the floor for the loop's held-out comparison).
#   examples/workflows/realserver.sh [OUT] [PORT]
#   LATENCY_MODEL=blackbox|trained-physics examples/workflows/realserver.sh
#   (step-table by default: this server's own step time per number of
#   decoding slots, fitted from its streamed tokens, the llama.cpp engine
#   profile's latency model; trained-physics uses the physics terms of the
#   model's config.json on this CPU's measured FLOP rate and bandwidth,
#   examples/realserver/; see the README)
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
OUT="${1:-out/realserver}"
PORT="${2:-8097}"
RS=../shared/realserver
SETTINGS="--max-num-seqs 4 --max-num-batched-tokens 2048 --block-size 16 --total-kv-blocks 2048 --max-model-len 8192"
LATENCY_MODEL="${LATENCY_MODEL:-step-table}"
if [ "$LATENCY_MODEL" = trained-physics ]; then
    SETTINGS="$SETTINGS --model-config examples/realserver/random-llama.json --hardware-config examples/realserver/cpu-hardware.json --hardware CPU --async-scheduling false"
fi
trap 'bash $RS/stop.sh $PORT >/dev/null 2>&1 || true' EXIT
mkdir -p "$OUT"

URL=$(bash $RS/start.sh "$PORT" 4)
"$BLIS_BIN"/blis-loop --server-url "$URL" --server-type llamacpp \
    --workload-spec examples/realserver-servegen.yaml --out "$OUT/loop" \
    --latency-model "$LATENCY_MODEL" --replay-args "$SETTINGS" >"$OUT/loop.md"
bash $RS/stop.sh "$PORT" >/dev/null

# A fresh server (cold prompt cache) for the second observation.
URL=$(bash $RS/start.sh "$PORT" 4)
"$BLIS_BIN"/blis-loadgen run --server-url "$URL" --model random-llama --server-type llamacpp \
    --workload-spec examples/realserver-servegen.yaml --out "$OUT/again" >/dev/null
"$BLIS_BIN"/blis-calibrate compare --real "$OUT/loop/real.yaml" --sim "$OUT/again.yaml" \
    --out "$OUT/spread" --html >/dev/null
# The floor for the held-out comparison: the same spread over the same
# requests (the loop's report leaves out the fitted part as its warm-up).
HELD_OUT_FROM=$(grep -o '"warmup": *[0-9]*' "$OUT/loop/report.json" | head -1 | grep -o '[0-9]*$')
"$BLIS_BIN"/blis-calibrate compare --real "$OUT/loop/real.yaml" --sim "$OUT/again.yaml" \
    --warmup "$HELD_OUT_FROM" --out "$OUT/spread-held-out" --html >/dev/null

echo "## The loop (held-out 30%): $OUT/loop/report.html"
grep -E '^\| (metric|TTFT|E2E|ITL|TPOT) ' "$OUT/loop/report.md" | head -5
echo
echo "## Run-to-run spread (real vs real): $OUT/spread.html"
grep -E '^\| (metric|TTFT|E2E|ITL|TPOT) ' "$OUT/spread.md" | head -5

echo
echo "## Run-to-run spread over the held-out requests only (requests after the first $HELD_OUT_FROM): $OUT/spread-held-out.html"
grep -E '^\| (metric|TTFT|E2E|ITL|TPOT) ' "$OUT/spread-held-out.md" | head -5
