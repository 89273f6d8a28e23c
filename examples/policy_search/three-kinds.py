#!/usr/bin/env python3
"""The three kinds of policy on examples/policy_search/shared-prefixes.yaml
(8 instances of Llama-3.1-8B on H100, 6,000 KV blocks each, 120 s, the
fitness throughput:0.2,p99_ttft:0.5,mean_e2e:0.3): the best weighted-scorer
template of grid.py's grid, the decision tree of decision-tree.yaml, the
program of evolved-code.yaml, the template with a one-leaf scheduling tree
(each wait queue shortest prompt first) and the program with that tree,
each chosen on seeds 1 and 2 and judged on those and on held-out seeds 3
and 4. Beside the fitness, the raw p99 TTFT and mean E2E of the held-out
seeds (their means): the fitness maps a latency of L ms to 1 / (1 + L),
which compresses a second of tail latency to a few ten-thousandths.

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
# Each wait queue shortest prompt first: a one-leaf scheduling tree.
SHORTEST_FIRST = {"policy": "decision-tree", "tree": {"key": {"input_tokens": 1}}}


def with_shortest_first(path):
    """The bundle at `path` with SHORTEST_FIRST added (a new top-level key)."""
    import tempfile

    with open(path) as f:
        text = f.read()
    out = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    with out:
        out.write(text.rstrip("\n") + "\nscheduling:\n  policy: decision-tree\n"
                  "  tree: {key: {input_tokens: 1}}\n")
    return out.name


def main():
    chosen_on = [blis.generate(SPEC, seed=s, horizon_s=120) for s in (1, 2)]
    held_out = [blis.generate(SPEC, seed=s, horizon_s=120) for s in (3, 4)]
    print("| policy | kinds | fitness, seeds 1-2 | fitness, seeds 3-4 (held out) "
          "| p99 TTFT, held out | mean E2E, held out |")
    print("|---|---|---:|---:|---:|---:|")
    evolved = os.path.join(HERE, "evolved-code.yaml")
    combined = with_shortest_first(evolved)
    for name, kind, bundle in [
        ("grid.py's best (prefix-affinity 3, queue-depth 2, kv-utilization 1)", "template", TEMPLATE),
        ("decision-tree.yaml", "decision tree", os.path.join(HERE, "decision-tree.yaml")),
        ("evolved-code.yaml", "evolved code", evolved),
        ("the template + scheduling, shortest prompt first", "template + decision tree",
         dict(TEMPLATE, scheduling=SHORTEST_FIRST)),
        ("evolved-code.yaml + scheduling, shortest prompt first", "evolved code + decision tree",
         combined),
    ]:
        a = blis.evaluate(bundle, chosen_on, **SETTINGS).fitness
        b = blis.evaluate(bundle, held_out, **SETTINGS)
        p99 = sum(s["ttft_ms"]["p99"] for s in b["seeds"]) / len(b["seeds"])
        e2e = sum(s["e2e_ms"]["mean"] for s in b["seeds"]) / len(b["seeds"])
        print(f"| {name} | {kind} | {a:.6f} | {b.fitness:.6f} | {p99:.0f} ms | {e2e:.0f} ms |")
    os.unlink(combined)


if __name__ == "__main__":
    main()
