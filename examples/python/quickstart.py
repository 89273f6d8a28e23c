# %% [markdown]
# # BLIS from Python: a walk-through
#
# Notebook-style (`# %%` cells: run it in VS Code or Jupyter with jupytext,
# or as a script: `python examples/python/quickstart.py` from the repository
# root after `pip install ./python`). Times are µs in traces, ms in summaries.

# %%
import io
import os
import threading
import time

import pyarrow.csv as pacsv

import blis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = dict(model="meta-llama/Llama-3.1-8B-Instruct", hardware="H100")

# %% [markdown]
# ## 1. A workload, generated once
# The design's chat mix: two shared system prompts, Poisson and bursty
# clients. The same generator and seed as `blis-replay run --workload-spec`.

# %%
w = blis.generate(os.path.join(ROOT, "examples", "chat-512.yaml"), num_requests=3000)
print(w)
planned = pacsv.read_csv(io.BytesIO(w.records_csv()))   # the planned requests as a table
print(planned.select(["request_id", "client_id", "input_tokens", "output_tokens",
                      "arrival_time_us"]).slice(0, 5).to_pandas())

# %% [markdown]
# ## 2. Replay it on a few cluster sizes
# Settings are `blis-replay run`'s flags with `_` for `-`.

# %%
for n in (2, 4, 8):
    r = blis.replay(w, **MODEL, num_instances=n, routing="weighted",
                    routing_scorers="prefix-affinity:3,queue-depth:2")
    s = r.summary
    print(f"{n} instances: TTFT p99 {s['ttft_ms']['p99']:.1f} ms, E2E mean "
          f"{s['e2e_ms']['mean']:.0f} ms, prefix hit rate {s['prefix_cache']['hit_rate']:.2f}")

# %% [markdown]
# ## 3. Per-request results as a DataFrame

# %%
df = r.to_pandas()
df["ttft_ms"] = (df.first_chunk_time_us - df.send_time_us) / 1000
df["e2e_ms"] = (df.last_chunk_time_us - df.send_time_us) / 1000
print(df.groupby("client_id")[["ttft_ms", "e2e_ms"]].quantile(0.99))

# %% [markdown]
# ## 4. Policies: evaluate bundles, as a search would

# %%
bundles = {
    "round-robin": {"num_instances": 4, "routing": {"policy": "round-robin"}},
    "prefix+queue": {"num_instances": 4, "routing": {
        "policy": "weighted", "scorers": {"prefix-affinity": 3, "queue-depth": 2}}},
}
for name, b in bundles.items():
    e = blis.evaluate(b, w, **MODEL)
    print(f"{name:14s} fitness {e.fitness:.4f}  {e['summary']}")

# %% [markdown]
# ## 5. A real vLLM run, replayed and compared
# (Needs `../shared/vllm-ground-truth` beside the repository.)

# %%
gt = os.path.join(os.path.dirname(ROOT), "shared", "vllm-ground-truth", "train",
                  "20260217-155451-llama-2-7b-tp1-codegen")
if os.path.isdir(gt):
    real = blis.import_trace(f"vllm-gt:{gt}")   # measured: TTFT, E2E of 9,000 requests
    pred = blis.replay(real)                    # its requests, its model, GPU and flags
    c = blis.compare(real, pred)
    print(c.markdown.split("\n\n")[0])
    print({m: c["metrics"][m]["mape"] for m in ("ttft", "e2e") if m in c.get("metrics", {})})
    # Write the prediction and read it back, as a file-based pipeline would.
    path = pred.write(os.path.join(ROOT, "out", "python", "gt-pred"))
    print("wrote", path, "-", len(blis.read_trace(path)), "requests")

# %% [markdown]
# ## 6. Threads replay in parallel (the GIL is released)

# %%
settings = [dict(MODEL, num_instances=n) for n in (2, 3, 4, 5)]
t0 = time.perf_counter()
for s in settings:
    blis.replay(w, **s)
loop = time.perf_counter() - t0
t0 = time.perf_counter()
threads = [threading.Thread(target=blis.replay, args=(w,), kwargs=s) for s in settings]
for t in threads:
    t.start()
for t in threads:
    t.join()
par = time.perf_counter() - t0
print(f"4 replays: {loop:.2f} s in a loop, {par:.2f} s in 4 threads on {os.cpu_count()} cores")
