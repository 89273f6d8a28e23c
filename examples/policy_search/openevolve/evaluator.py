"""OpenEvolve's evaluator for blis routing programs: a candidate program
(Rhai, `fn route(request, instances)`) becomes the `code` routing policy of
a policy bundle and is scored by `blis.evaluate` in-process, on workloads
generated once per process. A program that does not compile, loops
forever, or answers nonsense scores 0 with the one-line reason as an
artifact (OpenEvolve feeds artifacts back to the LLM); a valid one returns
`blis-replay evaluate`'s fitness as `combined_score` and its reflection
text (the main issues of the run) as an artifact.

Settings through the environment: BLIS_EVAL_SPEC (the workload spec,
default examples/policy_search/shared-prefixes.yaml), BLIS_EVAL_SEEDS
(default 1), BLIS_EVAL_HORIZON_S (default 60), BLIS_EVAL_INSTANCES (8).
"""
import os

import blis

try:
    from openevolve.evaluation_result import EvaluationResult
except ImportError:  # (GEPA and plain callers take the dict)
    EvaluationResult = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = os.environ.get("BLIS_EVAL_SPEC",
                      os.path.join(ROOT, "examples", "policy_search", "shared-prefixes.yaml"))
SEEDS = [int(s) for s in os.environ.get("BLIS_EVAL_SEEDS", "1").split(",")]
HORIZON_S = float(os.environ.get("BLIS_EVAL_HORIZON_S", "60"))
INSTANCES = int(os.environ.get("BLIS_EVAL_INSTANCES", "8"))
SETTINGS = dict(model="meta-llama/Llama-3.1-8B-Instruct", total_kv_blocks=6000,
                fitness_weights="throughput:0.2,p99_ttft:0.5,mean_e2e:0.3")
_WORKLOADS = None


def workloads():
    global _WORKLOADS
    if _WORKLOADS is None:
        _WORKLOADS = [blis.generate(SPEC, seed=s, horizon_s=HORIZON_S) for s in SEEDS]
    return _WORKLOADS


def score(source):
    """(metrics, artifacts) of one program's source."""
    bundle = {"num_instances": INSTANCES, "snapshot_refresh_interval_us": 0,
              "routing": {"policy": "code", "source": source}}
    try:
        e = blis.evaluate(bundle, workloads(), **SETTINGS)
    except blis.BlisError as err:
        return {"combined_score": 0.0, "valid": 0.0}, {"error": str(err)}
    return ({"combined_score": e.fitness, "valid": 1.0},
            {"summary": e["summary"]})


def evaluate(program_path):
    with open(program_path) as f:
        source = f.read()
    metrics, artifacts = score(source)
    if EvaluationResult is None:
        return dict(metrics, **artifacts)
    return EvaluationResult(metrics=metrics, artifacts=artifacts)
