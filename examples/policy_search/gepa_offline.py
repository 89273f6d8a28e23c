#!/usr/bin/env python3
"""GEPA evolving a blis routing program, offline: its reflection model is
`blis-mockserver --script openevolve/canned.jsonl`, which answers every
reflection with the next canned completion (valid programs, a syntax
error, an endless loop, an out-of-range instance), so GEPA's whole loop
(evaluate a minibatch, reflect, propose, accept or reject, validate on the
Pareto set) runs without a model or a network. Candidates are scored by
gepa_adapter.py (blis.evaluate in-process); a broken one scores 0 with
its reason as the feedback, and the search goes on.

    cargo build --release && pip install ./python gepa
    python examples/policy_search/gepa_offline.py [--metric-calls 30] [--json]

For a real model, give gepa.optimize a reflection_lm that calls it (any
OpenAI-compatible server; GEPA also takes a LiteLLM model name such as
"openai/gpt-4.1" or "hosted_vllm/<model>").
"""
import argparse
import json
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "openevolve"))

from gepa_adapter import INITIAL_PROGRAM, BlisRoutingAdapter  # noqa: E402
from run_offline import MODEL, start_mock  # noqa: E402


def reflection_lm(api_base):
    """A reflection model: one chat completion of the server at `api_base`."""

    def ask(prompt):
        if not isinstance(prompt, str):  # a list of chat messages
            messages = prompt
        else:
            messages = [{"role": "user", "content": prompt}]
        body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 2048}).encode()
        req = urllib.request.Request(api_base + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)["choices"][0]["message"]["content"]

    return ask


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--metric-calls", type=int, default=30)
    ap.add_argument("--script", default=os.path.join(HERE, "openevolve", "canned.jsonl"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import gepa

    adapter = BlisRoutingAdapter(horizon_s=20)
    proc, api_base = start_mock(a.script)
    try:
        result = gepa.optimize(
            seed_candidate={"route": INITIAL_PROGRAM},
            trainset=[1, 2],
            valset=[3, 4],
            adapter=adapter,
            reflection_lm=reflection_lm(api_base),
            max_metric_calls=a.metric_calls,
            reflection_minibatch_size=2,
            display_progress_bar=False,
            raise_on_exception=True,
            seed=0,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    scores = list(result.val_aggregate_scores)
    best = result.best_idx
    report = {"metric_calls": a.metric_calls, "candidates": len(result.candidates),
              "initial_score": scores[0], "best_score": scores[best],
              "best_code": result.candidates[best]["route"], "scores": scores}
    if a.json:
        print(json.dumps(report))
    else:
        print(f"GEPA, {a.metric_calls} metric calls against blis-mockserver --script: "
              f"{len(result.candidates)} candidates accepted, validation score initial "
              f"{scores[0]:.6f}, best {scores[best]:.6f}")
        for i, s in enumerate(scores):
            print(f"  candidate {i}: {s:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
