#!/usr/bin/env bash
# Every deterministic output the README's examples, the cluster determinism
# script and the ground-truth replays write, into one folder, so that a
# refactor can be checked byte for byte:
#   tests/golden-outputs.sh BIN_DIR OUT_DIR
#   tests/golden-outputs.sh /tmp/before-bin out/golden && mv out/golden out/before
#   tests/golden-outputs.sh target/release out/golden && diff -r out/before out/golden && echo identical
# (the same OUT_DIR both times: printed summaries and reports name their
# files). A simulator's ITL companion is in step form; `blis-replay
# expand-itl` gives its rows.
# BIN_DIR holds blis-loadgen, blis-replay and blis-calibrate. Needs
# ../shared beside the checkout. About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$(cd "$1" && pwd)"
OUT="$2"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
GT=../shared/vllm-ground-truth/train
L="$BIN/blis-loadgen"
R="$BIN/blis-replay"
C="$BIN/blis-calibrate"
step() { echo "golden: $1" >&2; }

# Workload specs: generated and replayed (workflows/simulate.sh's flags).
for spec in examples/*.yaml; do
    case "$spec" in examples/coefficients.yaml) continue ;; esac
    name=$(basename "$spec" .yaml)
    step "spec $name"
    "$L" generate --workload-spec "$spec" --out "$OUT/gen-$name" --num-requests 2000 >"$OUT/gen-$name.stdout"
    "$R" run --workload-spec "$spec" --model meta-llama/Llama-3.1-8B-Instruct \
        --max-num-seqs 128 --num-requests 2000 --out "$OUT/sim-$name" >"$OUT/sim-$name.stdout"
done

# Imports of public traces.
step imports
"$L" generate --import mooncake:../shared/traces-samples/mooncake/conversation_trace.sample.jsonl --out "$OUT/imp-mooncake" >/dev/null
"$L" generate --import azure:../shared/traces-samples/azure2023/AzureLLMInferenceTrace_code.sample.csv --out "$OUT/imp-azure" >/dev/null
"$L" generate --import vllm-gt:$GT/20260217-155451-llama-2-7b-tp1-codegen --out "$OUT/imp-gt" >/dev/null
"$L" generate --import vllm-gt:$GT/20260217-155451-llama-2-7b-tp1-codegen --keep-measured --out "$OUT/imp-gt-real" >/dev/null
"$R" run --trace ../shared/traces-samples/blis/blis-run-1k.yaml --model meta-llama/Llama-3.1-8B-Instruct --out "$OUT/sim-blis-1k" >"$OUT/sim-blis-1k.stdout"

# The ground-truth replays, with the default latency model, and each other
# model on one run.
for run in "$GT"/*/; do
    name=$(basename "$run")
    step "ground truth $name"
    "$R" run --import "vllm-gt:$run" --out "$OUT/gt-$name" >"$OUT/gt-$name.stdout"
done
one="$GT/20260218-120914-mixtral-8x7b-v0-1-tp2-codegen"
for m in roofline blackbox blis-physics trained-physics; do
    step "latency model $m"
    "$R" run --import "vllm-gt:$one" --latency-model $m --out "$OUT/lm-$m" 2>&1 | grep -v 'of wall time' >"$OUT/lm-$m.stdout" || true
done
"$R" run --import "vllm-gt:$one" --no-fast-forward --out "$OUT/lm-no-ff" >/dev/null
"$R" run --import "vllm-gt:$one" --async-scheduling false --scheduler sjf --out "$OUT/lm-sjf" >/dev/null

# The cluster determinism script's run, and the README's policy comparison.
step cluster
"$R" run --workload-spec examples/policy_search/shared-prefixes.yaml \
    --model meta-llama/Llama-3.1-8B-Instruct --horizon-s 60 --total-kv-blocks 6000 \
    --num-instances 8 --routing-scorers prefix-affinity:3,queue-depth:2,kv-utilization:2,no-hit-lru:1 \
    --snapshot-refresh-interval-us 50000 --admission token-bucket \
    --token-bucket-capacity 300000 --token-bucket-refill-rate 150000 \
    --fitness-weights throughput:0.3,p99_ttft:0.4,mean_e2e:0.3 --out "$OUT/cluster-det" >"$OUT/cluster-det.stdout"
for r in round-robin least-loaded weighted; do
    "$R" run --workload-spec examples/policy_search/shared-prefixes.yaml \
        --model meta-llama/Llama-3.1-8B-Instruct --num-instances 8 --total-kv-blocks 6000 \
        --routing $r --out "$OUT/policy-$r" >"$OUT/policy-$r.stdout"
done
"$R" run --workload-spec examples/policy_search/shared-prefixes.yaml \
    --model meta-llama/Llama-3.1-8B-Instruct --horizon-s 30 --num-instances 4 --total-kv-blocks 3000 \
    --policy-config examples/policy_search/prefix-affinity.yaml --flow-control --priority-policy slo-based \
    --scheduler priority-fcfs --trace-level decisions --out "$OUT/cluster-flow" >"$OUT/cluster-flow.stdout"
"$R" run --workload-spec examples/two-client.yaml --model meta-llama/Llama-3.1-8B-Instruct \
    --num-requests 3000 --num-instances 3 --routing least-loaded --admission rate-limit \
    --rate-limit-rps 20 --rate-limit-burst 5 --total-kv-blocks 400 --out "$OUT/cluster-preempt" >"$OUT/cluster-preempt.stdout"
"$R" evaluate --policy-config examples/policy_search/round-robin.yaml \
    --workload-spec examples/policy_search/shared-prefixes.yaml --horizon-s 20 --seeds 1,2 \
    --model meta-llama/Llama-3.1-8B-Instruct --num-instances 4 >"$OUT/evaluate.json"
"$R" run --workload-spec examples/policy_search/shared-prefixes.yaml \
    --model meta-llama/Llama-3.1-8B-Instruct --horizon-s 2500 --num-instances 16 --routing weighted \
    --no-itl --sample-interval-ms 0 --out "$OUT/cluster-100k" >"$OUT/cluster-100k.stdout"

# Calibration: a comparison with its HTML, and a small fit.
step calibrate
"$C" compare --real "vllm-gt:$one" --sim "$OUT/lm-trained-physics.yaml" --out "$OUT/cmp" --html >"$OUT/cmp.stdout"
"$C" compare --real "$OUT/imp-gt-real.yaml" --sim "$OUT/gt-20260217-155451-llama-2-7b-tp1-codegen.yaml" \
    --out "$OUT/cmp-7b" >"$OUT/cmp-7b.stdout"
"$C" fit --trace "vllm-gt:$GT/20260217-155451-llama-2-7b-tp1-codegen" --budget-evals 30 \
    --out "$OUT/fit.yaml" >"$OUT/fit.stdout" 2>/dev/null
step done
