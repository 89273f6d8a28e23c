#!/usr/bin/env python3
"""OpenEvolve evolving a blis routing program, offline: its LLM is
`blis-mockserver --script canned.jsonl`, which answers every request with
the next canned completion (valid programs, a syntax error, an endless
loop, an out-of-range instance), so the whole search path runs without a
model or a network. Each candidate is scored by evaluator.py (blis.evaluate
in-process); a broken one scores 0 with its reason, and the search goes on.

    cargo build --release && pip install ./python openevolve
    python examples/policy_search/openevolve/run_offline.py [--iterations 5] [--json]

For a real model, run OpenEvolve with config.yaml's llm.api_base and model
name pointing at it (any OpenAI-compatible server: vLLM, SGLang, a hosted
API):

    openevolve-run examples/policy_search/openevolve/initial_program.rhai \\
        examples/policy_search/openevolve/evaluator.py --config my-config.yaml --iterations 100
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the mock's served name
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MOCK = os.environ.get("BLIS_MOCKSERVER_BIN",
                      os.path.join(ROOT, "target", "release", "blis-mockserver"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mock(script):
    port = free_port()
    proc = subprocess.Popen(
        [MOCK, "--port", str(port), "--model", MODEL, "--script", script,
         "--time-scale", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"blis-mockserver exited: {proc.stderr.read().strip()}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1):
                return proc, base + "/v1"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("blis-mockserver did not start")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--script", default=os.path.join(HERE, "canned.jsonl"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    os.environ.setdefault("BLIS_EVAL_HORIZON_S", "20")
    sys.path.insert(0, HERE)
    import evaluator  # noqa: E402  (after the environment is set)
    from openevolve import run_evolution
    from openevolve.config import load_config

    proc, api_base = start_mock(a.script)
    try:
        # config.yaml with the mock as its LLM.
        with open(os.path.join(HERE, "config.yaml")) as f:
            text = f.read().replace("http://127.0.0.1:8000/v1", api_base)
        cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        with cfg:
            cfg.write(text)
        config = load_config(cfg.name)
        os.unlink(cfg.name)
        config.max_iterations = a.iterations
        with tempfile.TemporaryDirectory() as out:
            result = run_evolution(
                initial_program=os.path.join(HERE, "initial_program.rhai"),
                # The file, as openevolve-run takes it: a callable would be
                # pickled into the system's temporary folder and left there.
                evaluator=os.path.join(HERE, "evaluator.py"),
                config=config,
                iterations=a.iterations,
                output_dir=out,
                cleanup=False,
            )
        initial = evaluator.score(open(os.path.join(HERE, "initial_program.rhai")).read())[0]
        # Every canned completion, scored as the search scored it.
        canned = []
        with open(a.script) as f:
            for line in f:
                text = json.loads(line)["content"]
                body = text.split("```rhai", 1)[1].split("```", 1)[0]
                metrics, artifacts = evaluator.score(body)
                canned.append({"combined_score": metrics["combined_score"],
                               "error": artifacts.get("error")})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    report = {"iterations": a.iterations, "initial_score": initial["combined_score"],
              "best_score": result.best_score, "best_code": result.best_code,
              "canned": canned}
    if a.json:
        print(json.dumps(report))
    else:
        print(f"OpenEvolve, {a.iterations} iterations against blis-mockserver --script: "
              f"initial {initial['combined_score']:.6f}, best {result.best_score:.6f}")
        for i, c in enumerate(canned):
            what = c["error"] or "valid"
            print(f"  canned completion {i}: score {c['combined_score']:.6f}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
