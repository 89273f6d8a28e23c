#!/usr/bin/env bash
# Workflow 5 (design §12): compare the real and the predicted trace.
#   examples/workflows/calibrate.sh [REAL.yaml] [SIM.yaml] [REPORT]
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
REAL="${1:-out/observe/real.yaml}"
SIM="${2:-out/replay/sim.yaml}"
REPORT="${3:-out/calibrate/report}"
"$BLIS_BIN/blis-calibrate" compare --real "$REAL" --sim "$SIM" --out "$REPORT" --html
echo "open $REPORT.html"
