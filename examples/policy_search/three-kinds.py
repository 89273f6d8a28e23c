#!/usr/bin/env python3
"""The three kinds of policy on examples/policy_search/shared-prefixes.yaml
(8 instances of Llama-3.1-8B on H100, 6,000 KV blocks each, 120 s, the
fitness throughput:0.2,p99_ttft:0.5,mean_e2e:0.3): the best weighted-scorer
template of grid.py's grid, the decision tree of decision-tree.yaml and the
program of evolved-code.yaml (and the template with a one-leaf scheduling
tree), each chosen on seeds 1 and 2 and judged on
those and on held-out seeds 3 and 4.

    pip install ./python
    python examples/policy_search/three-kinds.py
"""
import os

import blis

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.join(HERE, "shared-prefixes.yaml")
SETTINGS = dict(model="meta-llama/Llama-3.1-8B-Instruct", total_kv_blocks=6000,
                fitness_weights="throughput:0.2,p99_ttft:0.5,mean_e2e:0.3")
TEMPLATE = {"num_instances": 8, "snapshot_refresh_interval_us": 0,
            "routing": {"policy": "weighted",
                        "scorers": {"prefix-affinity": 3, "queue-depth": 2, "kv-utilization": 1}}}
# The same routing with a one-leaf scheduling tree: each wait queue
# shortest prompt first.
SHORTEST_FIRST = dict(TEMPLATE, scheduling={"policy": "decision-tree",
                                            "tree": {"key": {"input_tokens": 1}}})


def main():
    chosen_on = [blis.generate(SPEC, seed=s, horizon_s=120) for s in (1, 2)]
    held_out = [blis.generate(SPEC, seed=s, horizon_s=120) for s in (3, 4)]
    print("| policy | kind | fitness, seeds 1-2 | fitness, seeds 3-4 (held out) |")
    print("|---|---|---:|---:|")
    for name, kind, bundle in [
        ("grid.py's best (prefix-affinity 3, queue-depth 2, kv-utilization 1)", "template", TEMPLATE),
        ("decision-tree.yaml", "decision tree", os.path.join(HERE, "decision-tree.yaml")),
        ("evolved-code.yaml", "evolved code", os.path.join(HERE, "evolved-code.yaml")),
        ("grid.py's best + scheduling tree, shortest prompt first", "template + decision tree",
         SHORTEST_FIRST),
    ]:
        a = blis.evaluate(bundle, chosen_on, **SETTINGS).fitness
        b = blis.evaluate(bundle, held_out, **SETTINGS).fitness
        print(f"| {name} | {kind} | {a:.6f} | {b:.6f} |")


if __name__ == "__main__":
    main()
