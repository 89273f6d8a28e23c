#!/usr/bin/env bash
# Reads `blis-loadgen export` back with each peer's own code, each installed
# at a pinned version into a throwaway virtual environment:
#   aiperf          AIPerf 0.13.0's per-request model (MetricRecordInfo)
#   guidellm        guidellm 0.8.1's report model (GenerativeBenchmarksReport),
#                   its `guidellm export` console tables, and its own statistics
#                   recomputed from the exported requests
#   inference-perf  inference-perf 0.7.0's report validators and its own
#                   summarize_requests recomputed from the per-request records
# on one run against the mock with 10% HTTP 500s and a warm-up.
#   loadgen/benches/peer-export-check.sh [aiperf|guidellm|inference-perf ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(aiperf guidellm inference-perf)
cargo build --release -q  # the whole workspace: the same artifacts as every other build
bin=target/release
here=loadgen/benches/peers
out=$(mktemp -d)
trap 'kill $mock 2>/dev/null || true; rm -rf "$out"' EXIT
"$bin/blis-mockserver" --port 0 --time-scale 10 --fault-500-rate 0.1 --seed 4 >"$out/mock.log" 2>&1 &
mock=$!
for _ in $(seq 50); do grep -q listening "$out/mock.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$out/mock.log")
"$bin/blis-loadgen" run --server-url "$url" --model meta-llama/Llama-3.1-8B-Instruct --rate 40 \
    --num-requests 300 --input-tokens 64 --output-tokens 16 --warmup-requests 20 \
    --out "$out/run" >/dev/null 2>&1
venv() {  # venv NAME PIP-ARGS...: a fresh environment with the peer installed
    python3 -m venv "$out/$1"
    "$out/$1/bin/pip" install -q --disable-pip-version-check "${@:2}"
}
for peer in "${peers[@]}"; do
    case $peer in
    aiperf)
        venv aiperf aiperf==0.13.0
        "$bin/blis-loadgen" export "$out/run" --format aiperf --out "$out/profile_export.jsonl"
        "$out/aiperf/bin/python" "$here/aiperf_check.py" "$out/profile_export.jsonl" ;;
    guidellm)
        venv guidellm guidellm==0.8.1
        "$bin/blis-loadgen" export "$out/run" --format guidellm --out "$out/benchmarks.json"
        (cd "$out" && "$out/guidellm/bin/guidellm" export "$out/benchmarks.json" --output kind=console \
            | sed -n '/Request Latency Statistics/,/^$/p')
        "$out/guidellm/bin/python" "$here/guidellm_check.py" "$out/benchmarks.json" ;;
    inference-perf)
        # inference-perf 0.7.0 declares Python >= 3.12 but runs its report
        # code on 3.11; its dependencies are resolved for this Python.
        venv inference-perf --ignore-requires-python --no-deps inference-perf==0.7.0
        "$out/inference-perf/bin/pip" install -q --disable-pip-version-check pydantic pyyaml numpy \
            aiohttp aiofiles rich tqdm jinja2 prometheus-client transformers==5.13.0 tiktoken datasets pillow av \
            boto3 google-cloud-storage uvloop
        "$bin/blis-loadgen" export "$out/run" --format inference-perf --out "$out/inference-perf-report"
        "$out/inference-perf/bin/python" "$here/inference_perf_check.py" "$out/inference-perf-report" ;;
    *) echo "unknown peer $peer (aiperf, guidellm, inference-perf)" >&2; exit 2 ;;
    esac
done
