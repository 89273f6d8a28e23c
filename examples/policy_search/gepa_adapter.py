"""A GEPA adapter for blis routing programs (https://github.com/gepa-ai/gepa).

GEPA evolves the text components of a system by reflection. Here the system
is one component, `route`: a Rhai routing program (`fn route(request,
instances)`, see docs/clusters.md, evolved-code routing). A data instance is
a workload seed; evaluating a candidate on a batch replays its program as
the `code` routing policy of a bundle on each seed's workload (generated
once) with `blis.evaluate`, in-process. The score is `blis-replay evaluate`'s
fitness; a program that does not compile, loops forever or answers nonsense
scores 0, and its one-line reason is the feedback GEPA's reflection reads,
as the reflection text of the run (its main issues) is for a valid one.

    import gepa
    from gepa_adapter import BlisRoutingAdapter, INITIAL_PROGRAM
    result = gepa.optimize(seed_candidate={"route": INITIAL_PROGRAM}, trainset=[1, 2],
                           valset=[3, 4], adapter=BlisRoutingAdapter(), reflection_lm=...,
                           max_metric_calls=200)
"""
import os

import blis

try:
    from gepa.core.adapter import EvaluationBatch
except ImportError:  # GEPA not installed: the same fields as a plain class
    from dataclasses import dataclass

    @dataclass
    class EvaluationBatch:  # type: ignore[no-redef]
        outputs: list
        scores: list
        trajectories: list = None
        objective_scores: list = None
        num_metric_calls: int = None


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "examples", "policy_search", "shared-prefixes.yaml")
INITIAL_PROGRAM = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "openevolve",
                                    "initial_program.rhai")).read()


class BlisRoutingAdapter:
    """GEPA's adapter protocol over `blis.evaluate`: candidates
    `{"route": source}`, data instances workload seeds."""

    def __init__(self, spec=SPEC, horizon_s=60.0, num_instances=8,
                 fitness_weights="throughput:0.2,p99_ttft:0.5,mean_e2e:0.3",
                 model="meta-llama/Llama-3.1-8B-Instruct", total_kv_blocks=6000):
        self.spec, self.horizon_s, self.num_instances = spec, horizon_s, num_instances
        self.settings = dict(model=model, total_kv_blocks=total_kv_blocks,
                             fitness_weights=fitness_weights)
        self._workloads = {}
        self.propose_new_texts = None  # GEPA's default proposer

    def workload(self, seed):
        if seed not in self._workloads:
            self._workloads[seed] = blis.generate(self.spec, seed=seed, horizon_s=self.horizon_s)
        return self._workloads[seed]

    def evaluate(self, batch, candidate, capture_traces=False):
        bundle = {"num_instances": self.num_instances, "snapshot_refresh_interval_us": 0,
                  "routing": {"policy": "code", "source": candidate["route"]}}
        outputs, scores, traces = [], [], []
        for seed in batch:
            try:
                e = blis.evaluate(bundle, [self.workload(seed)], **self.settings)
                out = {"seed": seed, "fitness": e.fitness, "feedback": e["summary"]}
            except blis.BlisError as err:
                out = {"seed": seed, "fitness": 0.0, "feedback": f"invalid program: {err}"}
            outputs.append(out)
            scores.append(out["fitness"])
            traces.append(out)
        return EvaluationBatch(outputs=outputs, scores=scores,
                               trajectories=traces if capture_traces else None)

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        rows = [{"Inputs": f"workload seed {t['seed']} of {os.path.basename(self.spec)}, "
                           f"{self.num_instances} instances",
                 "Generated Outputs": f"fitness {t['fitness']:.6f}",
                 "Feedback": t["feedback"]}
                for t in (eval_batch.trajectories or eval_batch.outputs)]
        return {c: rows for c in components_to_update}
