#!/usr/bin/env bash
# The coverage-guided fuzzing campaign (issue 17 item 5): every target
# for RUNS inputs (default 1,000,000) with libFuzzer (release build with
# overflow checks and debug assertions on: an overflow is a crash), from the
# committed seeds (fuzz/corpus/TARGET); each input limited to 10 s and the
# process to 2 GiB (a hang or an unbounded allocation is a failure).
#   fuzz/campaign.sh [RUNS] [TARGET...]       (needs nightly and cargo-fuzz)
# Prints one line per target; exits non-zero if any target failed. New
# corpus entries go to a scratch folder; crashes to fuzz/artifacts/.
set -uo pipefail
cd "$(dirname "$0")"
RUNS="${1:-1000000}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sse prometheus trace_csv trace_header companions workload_spec mooncake azure inference_perf vllm_gt servegen)
cargo +nightly fuzz build -O -a >/dev/null 2>&1 || { echo "build failed (nightly and cargo-fuzz needed)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    start=$(date +%s.%N)
    cargo +nightly fuzz run -O -a "$t" "$work/$t" "corpus/$t" -- -runs="$RUNS" -max_len=65536 \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$work/$t.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
    peak=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/$t.log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$work/$t.log" | tail -1)
    if [ $rc -eq 0 ]; then verdict=ok; else verdict="FAILED (rc $rc)"; failed=1; tail -20 "$work/$t.log"; fi
    printf '%-15s %10s inputs in %6.0f s, %s, peak RSS %s MB, corpus %s files: %s\n' \
        "$t" "${runs:-?}" "$(echo "$end - $start" | bc -l)" "${cov:-cov ?}" "${peak:-?}" \
        "$(ls "$work/$t" | wc -l)" "$verdict"
done
exit $failed
