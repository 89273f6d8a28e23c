#!/usr/bin/env bash
# Workflow 1-2 (design §12): pure simulation of a workload spec, no server.
#   examples/workflows/simulate.sh [SPEC] [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
SPEC="${1:-examples/chat-service.yaml}"
OUT="${2:-out/simulate}"
"$BLIS_BIN/blis-replay" run --workload-spec "$SPEC" \
    --model meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 128 --out "$OUT"
echo "predicted trace: $OUT.yaml (summary: $OUT.summary.json)"
