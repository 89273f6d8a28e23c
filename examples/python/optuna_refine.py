#!/usr/bin/env python3
"""Refining latency coefficients with Optuna, the replay called in-process,
against `blis-calibrate fit` on the same real trace.

The real run: a vLLM ground-truth run (default: Llama-2-7B on one H100,
codegen, 9,000 requests). Both methods fit the blackbox step model
(step = β0 + β1 · prefill tokens + β2 · decode tokens, µs; α0 µs of
queueing per request) on the requests that arrived in the first 70% of the
run, and both are judged on the last 30% (held out): per-request MAPE of
TTFT and E2E, the whole run replayed each time (what the held-out requests
meet depends on what came before). Optuna's TPE sampler proposes
coefficients; each trial writes a one-row coefficients file and replays the
run with `blis.replay`.

    pip install ./python optuna
    cargo build --release
    python examples/python/optuna_refine.py [RUN_DIR] [--trials 80] [--seed 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import optuna

import blis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(os.path.dirname(ROOT), "shared", "vllm-ground-truth", "train",
                   "20260217-155451-llama-2-7b-tp1-codegen")
CALIBRATE = os.path.join(ROOT, "target", "release", "blis-calibrate")
HOLDOUT = 0.3


def errors(real_df, pred, cutoff_us):
    """(fit part, held-out part): mean of TTFT and E2E per-request MAPE, %,
    over requests ok on both sides."""
    p = pred.to_pandas()[["request_id", "status", "send_time_us", "first_chunk_time_us",
                          "last_chunk_time_us"]]
    m = real_df.merge(p, on="request_id", suffixes=("_r", "_p"))
    m = m[(m.status_r == "ok") & (m.status_p == "ok")]
    out = []
    for part in (m[m.arrival_time_us < cutoff_us], m[m.arrival_time_us >= cutoff_us]):
        e = 0.0
        for end in ("first_chunk_time_us", "last_chunk_time_us"):
            real = part[end + "_r"] - part.send_time_us_r
            sim = part[end + "_p"] - part.send_time_us_p
            e += ((sim - real).abs() / real).mean() * 100 / 2
        out.append(e)
    return tuple(out)


def coefficients_file(header, alpha0, beta):
    s = header["server"]
    row = {"model": s["model"], "gpu": header.get("hardware", {}).get("gpu", "H100"),
           "tensor_parallel": s.get("tensor_parallel", 1), "latency_model": "blackbox",
           "alpha": [alpha0, 0, 0], "beta": list(beta)}
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    with f:
        json.dump({"version": 1, "rows": [row]}, f)
    return f.name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default=RUN)
    ap.add_argument("--trials", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    real = blis.import_trace(f"vllm-gt:{a.run}")
    cols = ["request_id", "status", "arrival_time_us", "send_time_us", "first_chunk_time_us",
            "last_chunk_time_us"]
    real_df = real.to_pandas()[cols]
    cutoff = real_df.arrival_time_us.quantile(1 - HOLDOUT)
    header = real.header

    def replay_with(alpha0, beta):
        path = coefficients_file(header, alpha0, beta)
        try:
            return blis.replay(real, coefficients=path, latency_model="blackbox")
        finally:
            os.unlink(path)

    # Optuna, the replay in-process.
    def objective(trial):
        beta = (trial.suggest_float("beta0", 500, 30000, log=True),
                trial.suggest_float("beta1", 0.1, 200, log=True),
                trial.suggest_float("beta2", 1, 1000, log=True))
        alpha0 = trial.suggest_float("alpha0", 0, 20000)
        fit, _ = errors(real_df, replay_with(alpha0, beta), cutoff)
        return fit

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=a.seed))
    study.optimize(objective, n_trials=a.trials)
    t_optuna = time.perf_counter() - t0
    b = study.best_params
    o_fit, o_held = errors(real_df, replay_with(b["alpha0"], (b["beta0"], b["beta1"], b["beta2"])),
                           cutoff)

    # blis-calibrate fit on the same run (its own optimiser and holdout).
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "coefficients.yaml")
        t0 = time.perf_counter()
        subprocess.run([CALIBRATE, "fit", "--trace", f"vllm-gt:{a.run}", "--latency-model",
                        "blackbox", "--holdout-fraction", str(HOLDOUT), "--out", out],
                       check=True, capture_output=True, text=True)
        t_fit = time.perf_counter() - t0
        pred = blis.replay(real, coefficients=out, latency_model="blackbox")
    c_fit, c_held = errors(real_df, pred, cutoff)

    print(f"{header['server']['model']}, {len(real)} requests; fitted on the first "
          f"{100 - HOLDOUT * 100:.0f}%, judged on the last {HOLDOUT * 100:.0f}% "
          "(mean of TTFT and E2E per-request MAPE)")
    print(f"  optuna TPE, {a.trials} trials in-process: {t_optuna:6.1f} s, fit part "
          f"{o_fit:5.2f}%, held out {o_held:5.2f}%  "
          f"(beta {b['beta0']:.0f}, {b['beta1']:.2f}, {b['beta2']:.2f}; alpha0 {b['alpha0']:.0f})")
    print(f"  blis-calibrate fit (blackbox):    {t_fit:6.1f} s, fit part {c_fit:5.2f}%, "
          f"held out {c_held:5.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
