#!/usr/bin/env bash
# Reads `blis-loadgen export --format aiperf` back with AIPerf's own
# per-request model (aiperf.common.models.MetricRecordInfo, AIPerf 0.13.0,
# installed into a throwaway virtual environment): a short run against the
# mock with 10% HTTP 500s, exported, every line validated, and AIPerf's
# view of the TTFT compared with ours.
#   loadgen/benches/aiperf-export-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q  # the whole workspace: the same artifacts as every other build
bin=target/release
out=$(mktemp -d)
trap 'kill $mock 2>/dev/null || true; rm -rf "$out"' EXIT
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q --disable-pip-version-check aiperf==0.13.0
"$bin/blis-mockserver" --port 0 --time-scale 100 --fault-500-rate 0.1 --seed 4 >"$out/mock.log" 2>&1 &
mock=$!
for _ in $(seq 50); do grep -q listening "$out/mock.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$out/mock.log")
"$bin/blis-loadgen" run --server-url "$url" --model meta-llama/Llama-3.1-8B-Instruct --rate 50 \
    --num-requests 300 --input-tokens 64 --output-tokens 16 --warmup-requests 20 \
    --out "$out/run" >/dev/null 2>&1
"$bin/blis-loadgen" export "$out/run" --format aiperf --out "$out/profile_export.jsonl"
"$out/venv/bin/python" - "$out/profile_export.jsonl" <<'PY'
import statistics, sys
from importlib.metadata import version
from aiperf.common.models import MetricRecordInfo
recs = [MetricRecordInfo.model_validate_json(l) for l in open(sys.argv[1])]
ok = [r for r in recs if r.error is None]
bad = [r for r in recs if r.error is not None]
ttft = [r.metrics["time_to_first_token"].value for r in ok if r.metadata.benchmark_phase == "profiling"]
print(f"AIPerf {version('aiperf')} MetricRecordInfo read {len(recs)} records: "
      f"{len(ok)} ok, {len(bad)} errors ({sorted({r.error.type for r in bad})}), "
      f"{sum(r.metadata.benchmark_phase == 'warmup' for r in recs)} warm-up; "
      f"TTFT p50 {statistics.median(ttft):.2f} ms over {len(ttft)} profiling records")
PY
