#!/usr/bin/env bash
# Workflow 4 (design §12): predict an observed trace with the simulator.
#   examples/workflows/replay.sh [REAL.yaml] [OUT] [COEFFICIENTS.yaml]
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
REAL="${1:-out/observe/real.yaml}"
OUT="${2:-out/replay/sim}"
COEFFS="${3:-examples/coefficients.yaml}"
"$BLIS_BIN/blis-replay" run --trace "$REAL" --coefficients "$COEFFS" --out "$OUT"
