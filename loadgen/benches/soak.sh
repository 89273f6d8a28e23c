#!/usr/bin/env bash
# Soak with faults (issue 17 item 1): N short streaming requests at RATE
# req/s against blis-mockserver injecting 5% HTTP 5xx (2.5% 500, 2.5% 503),
# 2% 429 with Retry-After, 1% streams dropped mid-response, 1% stalls past
# the client's timeout and 0.5% malformed SSE chunks. Checks that every
# planned request is a row with its status and error kind, that the counts
# by kind equal the mock's own injection counters exactly, that nothing
# panicked, and prints both processes' peak RSS.
#
#   loadgen/benches/soak.sh [N=100000] [RATE=1000]
#
# Release binaries in separate processes on this host; the mock runs 1000x
# faster than real time (its engine is never the bottleneck). Exit code 0
# when every check holds. Compare runs of different N for memory growth.
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-100000}"
RATE="${2:-1000}"
cargo build --release -q
bin=target/release
out=$(mktemp -d)
trap 'kill $mock 2>/dev/null || true; rm -rf "$out"' EXIT
"$bin/blis-mockserver" --port 0 --time-scale 1000 --seed 11 \
    --fault-500-rate 0.025 --fault-503-rate 0.025 --fault-429-rate 0.02 \
    --fault-drop-rate 0.01 --fault-stall-rate 0.01 --fault-stall-ms 3000 \
    --fault-malformed-rate 0.005 >"$out/mock.log" 2>&1 &
mock=$!
for _ in $(seq 50); do grep -q listening "$out/mock.log" && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$out/mock.log")
/usr/bin/time -f "%M %e %U %S" -o "$out/time" "$bin/blis-loadgen" run --server-url "$url" \
    --model meta-llama/Llama-3.1-8B-Instruct --rate "$RATE" --num-requests "$N" \
    --input-tokens 32 --output-tokens 8 --timeout-s 1 --max-error-rate 1 \
    --scrape-interval-ms 1000 --out "$out/soak" >"$out/stdout" 2>"$out/stderr" || {
    echo "blis-loadgen exited with $?"; tail -5 "$out/stderr"; exit 1; }
curl -s "$url/metrics" >"$out/metrics.txt"
mock_rss=$(awk '/VmHWM/ {print $2}' "/proc/$mock/status")
kill "$mock"
wait "$mock" 2>/dev/null || true
if grep -q panicked "$out/stderr" "$out/mock.log"; then echo "a panic"; exit 1; fi
read -r rss wall user sys <"$out/time"
python3 - "$out" "$N" "$RATE" "$rss" "$wall" "$user" "$sys" "$mock_rss" <<'PY'
import csv, re, sys
out, n, rate, rss, wall, user, sys_t, mock_rss = sys.argv[1:]
n = int(n)
rows = list(csv.DictReader(open(f"{out}/soak.csv")))
ids = sorted(int(r["request_id"]) for r in rows)
by_status, kinds = {}, {}
for r in rows:
    st = r["status"]
    by_status[st] = by_status.get(st, 0) + 1
    if st != "ok":
        msg = r["error_message"]
        k = msg.split(":", 1)[0] if ":" in msg and " " not in msg.split(":", 1)[0] else "other"
        kinds[k] = kinds.get(k, 0) + 1
injected = {}
for line in open(f"{out}/metrics.txt"):
    m = re.match(r'blis_mock_faults_total\{kind="([^"]+)"\} ([0-9.]+)', line)
    if m:
        injected[m.group(1)] = int(float(m.group(2)))
# The client's kind of each injected fault.
expect = {
    "http_500": injected.get("http_500", 0),
    "http_503": injected.get("http_503", 0),
    "http_429": injected.get("http_429", 0),
    "dropped": injected.get("drop", 0),
    "timeout": injected.get("stall", 0),
    "malformed": injected.get("malformed", 0),
}
ok = True
print(f"soak: {n} requests at {rate} req/s in {float(wall):.1f} s")
print(f"rows: {len(rows)} ({', '.join(f'{k} {v}' for k, v in sorted(by_status.items()))})")
if ids != list(range(n)):
    print("FAIL: the rows are not every planned request exactly once")
    ok = False
print("| error kind | rows | injected by the mock | equal |")
print("|---|---:|---:|---|")
for k in sorted(set(expect) | set(kinds)):
    got, want = kinds.get(k, 0), expect.get(k, 0)
    print(f"| {k} | {got} | {want} | {'yes' if got == want else 'NO'} |")
    ok &= got == want
print(f"blis-loadgen: peak RSS {int(rss) / 1024:.1f} MiB, CPU {float(user) + float(sys_t):.1f} s "
      f"({(float(user) + float(sys_t)) / n * 1e6:.0f} µs per request); "
      f"blis-mockserver: peak RSS {int(mock_rss) / 1024:.1f} MiB")
print("verdict:", "every fault accounted for" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
