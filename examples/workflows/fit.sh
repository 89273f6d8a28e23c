#!/usr/bin/env bash
# Fit latency coefficients to an observed trace (70% fit, 30% held out), then
# replay with them.
#   examples/workflows/fit.sh [REAL.yaml] [MODEL] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
REAL="${1:-out/observe/real.yaml}"
MODEL="${2:-meta-llama/Llama-3.1-8B-Instruct}"
OUT="${3:-out/fit}"
mkdir -p "$OUT"
"$BLIS_BIN/blis-calibrate" fit --trace "$REAL" --model "$MODEL" \
    --out "$OUT/coefficients.yaml" --holdout-fraction 0.3
"$BLIS_BIN/blis-replay" run --trace "$REAL" --coefficients "$OUT/coefficients.yaml" \
    --latency-model blackbox --model "$MODEL" --out "$OUT/sim"
