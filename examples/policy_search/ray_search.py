#!/usr/bin/env python3
"""Policy search on Ray: routing candidates x seeds evaluated as Ray tasks
that call the `blis` package in-process.

Each seed's workload is generated once and put in Ray's object store, so a
task costs one replay, not a process start and a workload generation. Each
finished (candidate, seed) is appended to a JSON-lines checkpoint as it
arrives; a task whose worker dies is retried by Ray (`max_retries`), and a
rerun with the same checkpoint evaluates only what is missing, so a lost
worker or an interrupted search loses no result. A candidate's fitness is
the mean over seeds of `blis-replay evaluate`'s fitness, so `--local` (the
same evaluations in one process, no Ray) gives the same ranking.

    pip install ./python ray
    python examples/policy_search/ray_search.py [--candidates 200] [--seeds 1,2] [--horizon-s 60]
        [--num-cpus N | --address ray://head:10001] [--checkpoint results.jsonl] [--top 5] [--local]

On a Kubernetes cluster with KubeRay: examples/kubernetes/ray/ray-policy-search.yaml.
"""
import argparse
import hashlib
import itertools
import json
import os
import sys
import time

import blis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "examples", "policy_search", "shared-prefixes.yaml")
FITNESS = "throughput:0.2,p99_ttft:0.5,mean_e2e:0.3"
SETTINGS = dict(model="meta-llama/Llama-3.1-8B-Instruct", hardware="H100",
                total_kv_blocks=6000, fitness_weights=FITNESS)


def candidates(n):
    """The first `n` routing bundles of a grid over the weighted scorers'
    weights and the instance count (deterministic order)."""
    grid = itertools.product([4, 6, 8], [0, 1, 2, 3, 5], [0, 1, 2, 3], [0, 1, 2, 3, 4])
    out = []
    for inst, pa, qd, kv in grid:
        if pa == qd == kv == 0:
            continue
        scorers = {k: v for k, v in (("prefix-affinity", pa), ("queue-depth", qd),
                                     ("kv-utilization", kv)) if v}
        out.append({"num_instances": inst,
                    "routing": {"policy": "weighted", "scorers": scorers}})
        if len(out) == n:
            break
    return out


def key(bundle):
    return json.dumps(bundle, sort_keys=True)


def evaluate(bundle, workload, chaos_dir=None):
    """One candidate on one seed's workload: (fitness, the reflection text)."""
    if chaos_dir is not None:
        # Test hook: the first attempt of every task whose candidate is the
        # grid's third kills its own worker process, as a lost node would.
        name = hashlib.sha256(key(bundle).encode()).hexdigest()[:16]
        marker = os.path.join(chaos_dir, f"{name}-{workload_seed(workload)}")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
    e = blis.evaluate(bundle, workload, **SETTINGS)
    return e["fitness"], e["summary"]


def workload_seed(w):
    return json.loads(w.header_json()).get("workload_seed")


def load_checkpoint(path):
    done = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line cut short by a crash: evaluated again
                done[(r["candidate"], r["seed"])] = r
    return done


def record(path, r):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def rank(results, cands, seeds):
    """Candidates with every seed evaluated, by mean fitness (best first;
    ties by grid order)."""
    order = {key(c): i for i, c in enumerate(cands)}
    by = {}
    for (c, s), r in results.items():
        by.setdefault(c, {})[s] = r["fitness"]
    ranked = [(sum(v[s] for s in seeds) / len(seeds), c) for c, v in by.items()
              if all(s in v for s in seeds)]
    ranked.sort(key=lambda x: (-x[0], order.get(x[1], 0)))
    return ranked


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--horizon-s", type=float, default=60.0)
    ap.add_argument("--address", default=None, help="a Ray cluster to join (default: start a local one)")
    ap.add_argument("--num-cpus", type=int, default=None, help="workers of the local cluster")
    ap.add_argument("--checkpoint", default=None, help="JSON-lines results; a rerun resumes from it")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--local", action="store_true", help="evaluate in this process, without Ray")
    ap.add_argument("--stop-after", type=int, default=None, help="stop after this many new results (tests)")
    ap.add_argument("--chaos-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the ranking as JSON")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    cands = candidates(a.candidates)
    results = load_checkpoint(a.checkpoint)
    todo = [(c, s) for c in cands for s in seeds if (key(c), s) not in results]
    started = time.perf_counter()
    workloads = {s: blis.generate(SPEC, seed=s, horizon_s=a.horizon_s) for s in seeds}
    new = 0
    init_s = 0.0
    if a.local:
        for c, s in todo:
            fitness, text = evaluate(c, workloads[s])
            r = {"candidate": key(c), "seed": s, "fitness": fitness, "summary": text}
            results[(key(c), s)] = r
            record(a.checkpoint, r)
            new += 1
            if a.stop_after is not None and new >= a.stop_after:
                break
    else:
        import ray

        t_init = time.perf_counter()
        if a.address:
            ray.init(address=a.address)
        else:
            ray.init(num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - t_init
        if __name__ != "__main__":
            # Imported (a test, a notebook): ship this module's functions by
            # value, since workers cannot import it by name.
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        task = ray.remote(max_retries=3)(evaluate)
        refs = {s: ray.put(w) for s, w in workloads.items()}
        chaos = a.chaos_dir
        pending = {}
        for c, s in todo:
            ref = task.remote(c, refs[s], chaos if chaos and c == cands[min(2, len(cands) - 1)] else None)
            pending[ref] = (c, s)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            c, s = pending.pop(ready[0])
            fitness, text = ray.get(ready[0])
            r = {"candidate": key(c), "seed": s, "fitness": fitness, "summary": text}
            results[(key(c), s)] = r
            record(a.checkpoint, r)
            new += 1
            if a.stop_after is not None and new >= a.stop_after:
                for ref in pending:
                    ray.cancel(ref, force=True)
                break
        ray.shutdown()
    elapsed = time.perf_counter() - started
    ranked = rank(results, cands, seeds)
    if a.json:
        print(json.dumps({"evaluated": new, "elapsed_s": elapsed, "ray_init_s": init_s,
                          "ranking": [{"fitness": f, "candidate": json.loads(c)} for f, c in ranked]}))
        return 0
    print(f"{new} evaluations in {elapsed:.1f} s, of which {init_s:.1f} s starting Ray "
          f"({len(cands)} candidates x {len(seeds)} seeds, {len(results)} results in all)")
    for f, c in ranked[:a.top]:
        print(f"  fitness {f:.6f}  {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
