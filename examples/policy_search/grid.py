#!/usr/bin/env python3
"""A tiny policy search: a grid over the weights of prefix-affinity,
queue-depth and kv-utilization routing, each candidate scored by
`blis-replay evaluate` (one deterministic, single-threaded simulation per
seed), candidates run in parallel across the machine's cores. The same
contract serves an OpenEvolve evaluator or a GEPA adapter: write a policy
bundle, call evaluate, read `fitness`, `seeds[*]` and `summary` from its
JSON.

    cargo build --release
    python3 examples/policy_search/grid.py [--seeds 1,2] [--horizon-s 120] [--jobs N]
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target", "release", "blis-replay")
SPEC = os.path.join(ROOT, "examples", "policy_search", "shared-prefixes.yaml")
FITNESS = "throughput:0.2,p99_ttft:0.5,mean_e2e:0.3"


def evaluate(args):
    weights, seeds, horizon = args
    pa, qd, kv = weights
    scorers = {k: v for k, v in
               (("prefix-affinity", pa), ("queue-depth", qd), ("kv-utilization", kv)) if v > 0}
    bundle = "num_instances: 8\nrouting:\n  policy: weighted\n  scorers: {%s}\n" % ", ".join(
        f"{k}: {v}" for k, v in scorers.items())
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(bundle)
        path = f.name
    try:
        out = subprocess.run(
            [BIN, "evaluate", "--policy-config", path, "--workload-spec", SPEC,
             "--model", "meta-llama/Llama-3.1-8B-Instruct", "--total-kv-blocks", "6000",
             "--horizon-s", str(horizon), "--seeds", seeds, "--fitness-weights", FITNESS],
            check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return weights, json.loads(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--horizon-s", type=float, default=120)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"build it first: cargo build --release ({BIN} missing)")
    grid = [w for w in itertools.product([0, 1, 3], [0, 1, 2], [0, 1, 2]) if any(w)]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(evaluate, [(w, a.seeds, a.horizon_s) for w in grid]))
    results.sort(key=lambda r: -r[1]["fitness"])
    print("| prefix-affinity | queue-depth | kv-utilization | fitness | TTFT p99 ms | hit rate |")
    print("|---:|---:|---:|---:|---:|---:|")
    for (pa, qd, kv), e in results:
        s = e["seeds"]
        p99 = sum(x["ttft_ms"]["p99"] for x in s) / len(s)
        hit = sum(x["prefix_cache_hit_rate"] for x in s) / len(s)
        print(f"| {pa} | {qd} | {kv} | {e['fitness']:.4f} | {p99:.1f} | {100 * hit:.1f}% |")
    best = results[0][1]
    print("\nbest:", best["summary"])


if __name__ == "__main__":
    main()
