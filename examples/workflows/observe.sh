#!/usr/bin/env bash
# Workflow 3 (design §12): real mode. Send a workload spec to an
# OpenAI-compatible server on its exact schedule and record the trace.
#   examples/workflows/observe.sh URL MODEL [SPEC] [OUT]
# Without URL, a blis-mockserver is started on a free port for the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/workflows/bin.sh
URL="${1:-}"
MODEL="${2:-meta-llama/Llama-3.1-8B-Instruct}"
SPEC="${3:-examples/chat-service.yaml}"
OUT="${4:-out/observe/real}"
if [ -z "$URL" ]; then
  log=$(mktemp)
  "$BLIS_BIN"/blis-mockserver --port 0 >"$log" 2>&1 &
  mock=$!
  trap 'kill $mock 2>/dev/null || true; rm -f "$log"' EXIT
  for _ in $(seq 50); do grep -q listening "$log" && break; sleep 0.1; done
  URL=$(sed -n 's/^listening on //p' "$log")
fi
"$BLIS_BIN"/blis-loadgen run --server-url "$URL" --model "$MODEL" \
    --workload-spec "$SPEC" --duration-s 30 --out "$OUT"
