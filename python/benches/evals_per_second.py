#!/usr/bin/env python3
"""Evaluations per second of one policy candidate on the 10K-request
`race-10k-x4.yaml` (4 instances, round-robin, the bench's engine
settings): through the package (the workload generated once, each
evaluation a replay in-process) against the command line (one
`blis-replay evaluate` process per evaluation, which generates the workload
each time), and the package from 2 threads (the GIL is released while a
replay runs).

    python python/benches/evals_per_second.py [N=20]   (after `cargo build --release` and `pip install ./python`)
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import blis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BLIS_REPLAY_BIN", os.path.join(ROOT, "target", "release", "blis-replay"))
SPEC = os.path.join(os.path.dirname(ROOT), "shared", "bench", "race-10k-x4.yaml")
SETTINGS = dict(model="qwen/qwen2.5-7b-instruct", hardware="H100", tp=1, total_kv_blocks=61048,
                max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=32768,
                block_size=16, async_scheduling=False, latency_model="roofline")
BUNDLE = {"num_instances": 4, "routing": {"policy": "round-robin"}}


def cli_flags(bundle_path):
    flags = ["--workload-spec", SPEC, "--policy-config", bundle_path, "--seeds", "1"]
    for k, v in SETTINGS.items():
        flags += ["--" + k.replace("_", "-"), str(v).lower() if isinstance(v, bool) else str(v)]
    return flags


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        json.dump(BUNDLE, f)
        bundle_path = f.name
    try:
        cli = lambda: json.loads(subprocess.run([BIN, "evaluate", *cli_flags(bundle_path)],
                                                capture_output=True, text=True, check=True).stdout)
        reference = cli()  # warm-up
        t0 = time.perf_counter()
        for _ in range(n):
            cli()
        t_cli = (time.perf_counter() - t0) / n

        t0 = time.perf_counter()
        w = blis.generate(SPEC, seed=1)
        t_gen = time.perf_counter() - t0
        e = blis.evaluate(BUNDLE, w, **SETTINGS)  # warm-up
        assert e["fitness"] == reference["fitness"], (e["fitness"], reference["fitness"])
        t0 = time.perf_counter()
        for _ in range(n):
            blis.evaluate(BUNDLE, w, **SETTINGS)
        t_pkg = (time.perf_counter() - t0) / n

        def work(k):
            for _ in range(k):
                blis.evaluate(BUNDLE, w, **SETTINGS)

        half = max(1, n // 2)
        threads = [threading.Thread(target=work, args=(half,)) for _ in range(2)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_two = (time.perf_counter() - t0) / (2 * half)
    finally:
        os.unlink(bundle_path)
    print(f"race-10k-x4.yaml, one candidate ({BUNDLE}), {n} evaluations each, same fitness {reference['fitness']:.6f}")
    print(f"  command line, a process per evaluation: {t_cli * 1e3:7.1f} ms/evaluation  {1 / t_cli:6.2f} evaluations/s")
    print(f"  package, workload generated once ({t_gen * 1e3:.1f} ms): {t_pkg * 1e3:7.1f} ms/evaluation  {1 / t_pkg:6.2f} evaluations/s  ({t_cli / t_pkg:.2f}x)")
    print(f"  package, 2 threads: {t_two * 1e3:7.1f} ms/evaluation  {1 / t_two:6.2f} evaluations/s  ({t_pkg / t_two:.2f}x one thread)")


if __name__ == "__main__":
    main()
