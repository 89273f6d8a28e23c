#!/usr/bin/env python3
"""A tiny policy search: a grid over the weights of prefix-affinity,
queue-depth and kv-utilization routing (`--search routing`, the default),
over a CPU KV tier's size and offload threshold on a cluster short of
GPU KV blocks (`--search kv-tier`), or over an autoscaler's template,
floor and cooldown on a bursty load, weighing p99 TTFT against the
replica-seconds it bills (`--search autoscale`), each candidate scored by
`blis.evaluate` (the Python package, in-process: `blis-replay evaluate`'s
scoring, one deterministic, single-threaded simulation per seed), each
seed's workload generated once and shared by every candidate, candidates
evaluated in parallel threads (the package releases the GIL). The same
contract serves an OpenEvolve evaluator or a GEPA adapter: a policy bundle
in, `fitness`, `seeds[*]` and `summary` out. Across machines:
examples/policy_search/ray_search.py.

    pip install ./python
    python3 examples/policy_search/grid.py [--search routing|kv-tier|autoscale] [--seeds 1,2] [--horizon-s 120] [--jobs N]
"""
import argparse
import itertools
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import blis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "examples", "policy_search", "shared-prefixes.yaml")
FITNESS = "throughput:0.2,p99_ttft:0.5,mean_e2e:0.3"


def routing_bundle(weights):
    pa, qd, kv = weights
    scorers = {k: v for k, v in
               (("prefix-affinity", pa), ("queue-depth", qd), ("kv-utilization", kv)) if v > 0}
    return "num_instances: 8\nrouting:\n  policy: weighted\n  scorers: {%s}\n" % ", ".join(
        f"{k}: {v}" for k, v in scorers.items())


def kv_tier_bundle(point):
    cpu_blocks, threshold = point
    return ("num_instances: 8\nrouting:\n  policy: weighted\n"
            "  scorers: {prefix-affinity: 3, queue-depth: 2, kv-utilization: 2}\n"
            f"kv: {{cpu_blocks: {cpu_blocks}, offload_threshold: {threshold}}}\n")


def autoscale_bundle(point):
    policy, floor, cooldown = point
    return ("num_instances: %d\nrouting: {policy: least-loaded}\n"
            "autoscale: {policy: %s, min_replicas: %d, max_replicas: 6, cooldown_s: %d,"
            " provisioning_delay_s: 30, warmup_s: 30}\n" % (floor, policy, floor, cooldown))


# What each search varies, the GPU KV blocks per instance it runs with,
# how a candidate becomes a bundle, its workload, fitness and horizon
# (None: --horizon-s).
SEARCHES = {
    "routing": (lambda: [w for w in itertools.product([0, 1, 3], [0, 1, 2], [0, 1, 2]) if any(w)],
                "6000", routing_bundle, SPEC, FITNESS, None),
    "kv-tier": (lambda: list(itertools.product([0, 2000, 20000], [0.0, 0.5, 0.9])),
                "2000", kv_tier_bundle, SPEC, FITNESS, None),
    # The whole 20 minutes of the burst workload: its burst is minutes 5-10.
    "autoscale": (lambda: list(itertools.product(["threshold", "target-utilization"], [1, 2],
                                                 [30, 120])),
                  "0", autoscale_bundle, os.path.join(ROOT, "examples", "burst.yaml"),
                  "p99_ttft:0.5,replica_seconds:0.5", 1200),
}


WORKLOADS = {}


def workloads(spec, seeds, horizon):
    """Each seed's workload, generated once for the whole grid."""
    key = (spec, seeds, horizon)
    if key not in WORKLOADS:
        WORKLOADS[key] = [blis.generate(spec, seed=int(s), horizon_s=horizon)
                          for s in seeds.split(",")]
    return WORKLOADS[key]


def evaluate(args):
    search, point, seeds, horizon = args
    _, gpu_blocks, make, spec, fitness, fixed_horizon = SEARCHES[search]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(make(point))
        path = f.name
    blocks = {"total_kv_blocks": int(gpu_blocks)} if gpu_blocks != "0" else {}
    try:
        e = blis.evaluate(path, workloads(spec, seeds, fixed_horizon or horizon),
                          model="meta-llama/Llama-3.1-8B-Instruct",
                          fitness_weights=fitness, **blocks)
    finally:
        os.unlink(path)
    return point, e


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--horizon-s", type=float, default=120)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--search", choices=sorted(SEARCHES), default="routing")
    a = p.parse_args()
    grid = SEARCHES[a.search][0]()
    search = SEARCHES[a.search]
    workloads(search[3], a.seeds, search[5] or a.horizon_s)
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(evaluate, [(a.search, w, a.seeds, a.horizon_s) for w in grid]))
    results.sort(key=lambda r: -r[1]["fitness"])
    mean = lambda e, f: sum(f(x) for x in e["seeds"]) / len(e["seeds"])
    if a.search == "routing":
        print("| prefix-affinity | queue-depth | kv-utilization | fitness | TTFT p99 ms | hit rate |")
        print("|---:|---:|---:|---:|---:|---:|")
        for (pa, qd, kv), e in results:
            p99 = mean(e, lambda x: x["ttft_ms"]["p99"])
            hit = mean(e, lambda x: x["prefix_cache_hit_rate"])
            print(f"| {pa} | {qd} | {kv} | {e['fitness']:.4f} | {p99:.1f} | {100 * hit:.1f}% |")
    elif a.search == "autoscale":
        print("| policy | min replicas | cooldown s | fitness | TTFT p99 s | replica-seconds | scale-ups |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for (policy, floor, cooldown), e in results:
            p99 = mean(e, lambda x: x["ttft_ms"]["p99"]) / 1e3
            cost = mean(e, lambda x: x["autoscale"]["replica_seconds"])
            ups = mean(e, lambda x: x["autoscale"]["scale_ups"])
            print(f"| {policy} | {floor} | {cooldown} | {e['fitness']:.4f} | {p99:.1f} | {cost:.0f} | {ups:.1f} |")
    else:
        print("| CPU blocks | offload threshold | fitness | TTFT p99 ms | preemptions | reloads |")
        print("|---:|---:|---:|---:|---:|---:|")
        for (cpu, th), e in results:
            p99 = mean(e, lambda x: x["ttft_ms"]["p99"])
            pre = mean(e, lambda x: x["preemptions"])
            rel = mean(e, lambda x: x.get("cpu_tier", {}).get("reloads", 0))
            print(f"| {cpu} | {th} | {e['fitness']:.4f} | {p99:.1f} | {pre:.0f} | {rel:.0f} |")
    best = results[0][1]
    print("\nbest:", best["summary"])


if __name__ == "__main__":
    main()
