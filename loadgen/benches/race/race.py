"""The load-generator race: blis-loadgen and its peers against one blis-mockserver.

Each tool sends the same planned load (streaming /v1/completions, fixed
prompt and output lengths, constant arrivals) to its own fresh
blis-mockserver on loopback; runs are interleaved (every tool once, then
every tool again, in a rotated order) and repeated. What is measured:

* from the mock's served log (`--served-log`: one line per completed
  request with the Unix µs of its arrival and of its first and last token
  written; the truth, independent of every tool's own report):
  - achieved rate: completed requests over the span of their arrivals;
  - schedule error: each arrival against a constant schedule at the
    planned rate anchored at the most punctual request
    (lag_i = a_i - T - i/R with T = min_i(a_i - i/R), so lag >= 0);
* from the operating system: client CPU seconds (user + system of the
  tool's process and every child it waited for) per planned request, and
  peak memory (the sum of the proportional set size of every process in
  the tool's session, sampled every 250 ms);
* measurement accuracy: each tool's own per-request TTFT and E2E against
  the mock's for the same request (joined by `x-request-id` where the tool
  sends one, else by send order), median and p99 absolute error.

    python3 race.py --bin target/release --env ENV --tokenizer TOK --out DIR [options]

Prints the tables (Markdown) and writes DIR/race.json with every run.
Only the Python standard library is used here; the peers run from ENV.
"""

import argparse
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
INPUT_TOKENS = 32


# ----------------------------------------------------------------- mock


class Mock:
    """A blis-mockserver on loopback with a served log of its own."""

    def __init__(self, bin_dir, time_scale, log_path):
        self.log_path = Path(log_path)
        env = dict(os.environ, TOKIO_WORKER_THREADS="1")
        self.stdout = open(self.log_path.with_suffix(".out"), "w")
        self.proc = subprocess.Popen(
            [
                f"{bin_dir}/blis-mockserver",
                "--port", "0",
                "--model", MODEL,
                "--time-scale", str(time_scale),
                # Every tool sends max_tokens: the output is that long.
                "--output-dist", "constant:1000000",
                "--served-log", str(self.log_path),
            ],
            stdout=self.stdout,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = None
        for _ in range(100):
            text = self.log_path.with_suffix(".out").read_text()
            for line in text.splitlines():
                if line.startswith("listening on "):
                    self.url = line.split("listening on ", 1)[1].strip()
            if self.url:
                break
            time.sleep(0.05)
        if not self.url:
            raise RuntimeError("blis-mockserver did not start")
        self.port = self.url.rsplit(":", 1)[1]

    def stop(self):
        """Stops the mock (SIGINT flushes the log) and returns the served entries."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stdout.close()
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


# ------------------------------------------------------- process metrics


def session_pss_kib(sid):
    """Sum of PSS (KiB) of the processes in session `sid` (RSS where smaps_rollup is unreadable)."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) != sid:  # field 6: session id
                continue
            kib = None
            try:
                with open(f"/proc/{d}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            kib = int(line.split()[1])
                            break
            except OSError:
                pass
            if kib is None:
                with open(f"/proc/{d}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            kib = int(line.split()[1])
            total += kib or 0
        except (OSError, ValueError, IndexError):
            continue
    return total


def run_measured(cmd, cwd, timeout_s, log_path, env=None):
    """Runs `cmd` in its own session; returns wall s, CPU s, peak PSS MiB, exit code, timed_out."""
    with open(log_path, "w") as log:
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )
        peak = 0
        timed_out = False
        status = None
        ru = None
        while True:
            pid, st, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                status, ru = st, usage
                break
            peak = max(peak, session_pss_kib(proc.pid))
            if time.monotonic() - start > timeout_s:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.25)
        wall = time.monotonic() - start
        # Children of the tool that outlived it (none expected).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "peak_mib": peak / 1024,
        "rc": proc.returncode,
        "timed_out": timed_out,
    }


# ----------------------------------------------------------------- tools
#
# Each tool: cmd(point, url, port, workdir) -> argv, and
# parse(workdir) -> list of {"id"?, "start_s", "ttft_s"?, "e2e_s", "ok"}
# (Unix seconds) or {"percentiles": {...}} when it has no per-request data.


def ours_cmd(ctx, p, url, port, wd):
    cmd = [
        f"{ctx.bin}/blis-loadgen", "run", "--server-url", url, "--model", MODEL,
        "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(p["output"]),
        "--num-requests", str(p["n"]), "--scrape-interval-ms", "0", "--json",
        "--timeout-s", "60", "--out", f"{wd}/run",
    ]
    if p["kind"] == "open":
        cmd += ["--rate", str(p["rate"]), "--arrival", "constant"]
    else:
        cmd += ["--rate", "1", "--concurrency", str(p["concurrency"])]
    # Export, then read our requests as AIPerf's records (same reader).
    return ["sh", "-c", shlex.join(cmd) + " > " + shlex.quote(f"{wd}/summary.json") + "; "
            + shlex.join([f"{ctx.bin}/blis-loadgen", "export", f"{wd}/run", "--format", "aiperf",
                          "--out", f"{wd}/profile_export.jsonl"])]


def aiperf_records(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        m = r.get("metadata", {})
        met = r.get("metrics") or {}
        if m.get("benchmark_phase") not in (None, "profiling"):
            continue
        ttft = met.get("time_to_first_token", {}).get("value")
        lat = met.get("request_latency", {}).get("value")
        out.append({
            "id": m.get("x_request_id"),
            "start_s": m["request_start_ns"] / 1e9,
            "ttft_s": ttft / 1e3 if ttft is not None else None,
            "e2e_s": lat / 1e3 if lat is not None else None,
            "ok": r.get("error") is None,
        })
    return out


def ours_parse(wd):
    return aiperf_records(f"{wd}/profile_export.jsonl")


def aiperf_cmd(ctx, p, url, port, wd):
    cmd = [
        f"{ctx.env}/aiperf/bin/aiperf", "profile", "--model", MODEL, "--url", url,
        "--endpoint-type", "completions", "--streaming",
        "--synthetic-input-tokens-mean", str(INPUT_TOKENS), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(p["output"]), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--tokenizer", ctx.tokenizer, "--ui", "none",
        "--artifact-dir", f"{wd}/aip", "--export-level", "records", "--request-count", str(p["n"]),
        "--no-server-metrics", "--no-gpu-telemetry", "--random-seed", "1",
    ]
    if p["kind"] == "open":
        cmd += ["--request-rate", str(p["rate"]), "--arrival-pattern", "constant"]
    else:
        cmd += ["--concurrency", str(p["concurrency"])]
    return cmd


def aiperf_parse(wd):
    return aiperf_records(f"{wd}/aip/profile_export.jsonl")


def guidellm_cmd(ctx, p, url, port, wd):
    profile = (f"kind=constant,rate={p['rate']}" if p["kind"] == "open"
               else f"kind=concurrent,streams={p['concurrency']}")
    return [
        f"{ctx.env}/guidellm/bin/guidellm", "run",
        "--backend", f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions",
        "--profile", profile,
        "--constraint", f"kind=max_requests,count={p['n']}",
        "--data", f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={p['output']}",
        "--tokenizer", f"kind=huggingface_auto,model={ctx.tokenizer}",
        "--output", f"kind=json,path={wd}/out.json", "--disable-console-interactive",
    ]


def guidellm_parse(wd):
    d = json.load(open(f"{wd}/out.json"))
    out = []
    for b in d["benchmarks"]:
        for kind in ("successful", "errored", "incomplete"):
            for r in b["requests"].get(kind) or []:
                t = r["info"]["timings"]
                start = t.get("request_start")
                if start is None:
                    continue
                first = t.get("first_token_iteration")
                last = t.get("last_token_iteration") or t.get("request_end")
                out.append({
                    "id": None,
                    "start_s": start,
                    "ttft_s": first - start if first else None,
                    "e2e_s": last - start if last else None,
                    "ok": kind == "successful",
                })
    return out


def iperf_cmd(ctx, p, url, port, wd):
    def fixed(n):
        return {"min": n, "max": n, "mean": n, "std_dev": 0, "type": "fixed"}

    data = {"type": "random", "input_distribution": fixed(INPUT_TOKENS),
            "output_distribution": fixed(p["output"])}
    if p["kind"] == "open":
        # inference-perf's `constant` load draws exponential gaps scaled to
        # the stage's duration (load_timer.py ConstantLoadTimer): the same
        # rate, not the same schedule. A replayed trace with constant gaps is
        # its way to send a fixed schedule (AzurePublicDataset format).
        gap = 1.0 / p["rate"]
        t0 = 1_700_000_000.0
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        for i in range(p["n"]):
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + i * gap))
            frac = f"{(t0 + i * gap) % 1:.6f}"[1:]
            lines.append(f"{ts}{frac},{INPUT_TOKENS},{p['output']}")
        Path(f"{wd}/schedule.csv").write_text("\n".join(lines) + "\n")
        trace = {"file": f"{wd}/schedule.csv", "format": "AzurePublicDataset"}
        load = {"type": "trace_replay", "trace": trace,
                "stages": [{"rate": p["rate"], "duration": p["duration_s"]}]}
        data = {"type": "random", "trace": trace}
    else:
        load = {"type": "concurrent",
                "stages": [{"num_requests": p["n"], "concurrency_level": p["concurrency"]}]}
    load["num_workers"] = 2
    cfg = {
        "api": {"type": "completion", "streaming": True},
        "data": data,
        "load": load,
        "report": {"request_lifecycle": {
            "summary": True, "per_stage": False, "per_request": True,
            "per_request_fields": {"request": False, "response": False, "response_chunks": False}}},
        "storage": {"local_storage": {"path": f"{wd}/out"}},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": ctx.tokenizer},
    }
    # JSON is YAML.
    Path(f"{wd}/config.yaml").write_text(json.dumps(cfg))
    return [f"{ctx.env}/iperf/bin/inference-perf", "-c", f"{wd}/config.yaml"]


def iperf_parse(wd):
    # inference-perf's times are CLOCK_MONOTONIC seconds (time.perf_counter):
    # moved to Unix time with the offset measured when the run started.
    offset = json.loads(Path(f"{wd}/clock.json").read_text())["unix_minus_monotonic"]
    out = []
    for r in json.load(open(f"{wd}/out/per_request_lifecycle_metrics.json")):
        chunks = ((r.get("info") or {}).get("response_metrics") or {}).get("chunk_times") or []
        err = r.get("error")
        out.append({
            "id": None,
            "start_s": r["start_time"] + offset,
            "ttft_s": chunks[0] - r["start_time"] if chunks else None,
            "e2e_s": r["end_time"] - r["start_time"],
            "ok": not err,
        })
    return out


def oha_cmd(ctx, p, url, port, wd):
    body = json.dumps({
        "model": MODEL, "prompt": "the request token latency prefill decode " * 4,
        "max_tokens": p["output"], "ignore_eos": True, "stream": True,
    })
    cmd = [f"{ctx.env}/oha/bin/oha", "--no-tui", "--output-format", "json",
           "-o", f"{wd}/summary.json", "-n", str(p["n"]), "-m", "POST",
           "-H", "content-type: application/json", "-d", body,
           "--db-url", f"{wd}/requests.db"]
    if p["kind"] == "open":
        # Open loop: a connection pool large enough never to hold a send back.
        cmd += ["-q", str(p["rate"]), "-c", str(max(64, min(2000, p["rate"] // 10)))]
    else:
        cmd += ["-c", str(p["concurrency"])]
    return cmd + [f"{url}/v1/completions"]


def oha_parse(wd):
    import sqlite3
    db = sqlite3.connect(f"{wd}/requests.db")
    cols = [c[1] for c in db.execute("PRAGMA table_info(oha)")]
    rows = db.execute("SELECT * FROM oha").fetchall()
    out = []
    for row in rows:
        r = dict(zip(cols, row))
        start, end = r.get("start"), r.get("end")
        # oha records seconds since its own start; its start time is in the summary.
        out.append({"id": None, "start_raw": start, "ttft_s": None,
                    "e2e_s": (end - start) if end is not None else None,
                    "ok": r.get("status") in (200, "200")})
    # Anchor: oha's times are relative; place them by the mock (send order,
    # first request at the first arrival) only for the join, not for the
    # schedule figures (those come from the mock alone).
    return {"relative": out}


def vllm_cmd(ctx, p, url, port, wd):
    cmd = [
        f"{ctx.env}/vllm/bin/vllm", "bench", "serve", "--backend", "openai",
        "--base-url", url, "--endpoint", "/v1/completions", "--model", MODEL,
        "--tokenizer", ctx.tokenizer, "--dataset-name", "random",
        "--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(p["output"]),
        "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(p["n"]),
        "--save-result", "--save-detailed", "--result-dir", wd, "--result-filename", "result.json",
        "--disable-tqdm", "--num-warmups", "0", "--seed", "1",
    ]
    if p["kind"] == "open":
        # vllm bench has no constant arrivals: Gamma gaps with a shape this
        # large have a CV of 0.001.
        cmd += ["--request-rate", str(p["rate"]), "--burstiness", "1000000"]
    else:
        cmd += ["--request-rate", "inf", "--max-concurrency", str(p["concurrency"])]
    return cmd


def vllm_parse(wd):
    d = json.load(open(f"{wd}/result.json"))
    ttfts, e2es = d.get("ttfts") or [], d.get("e2els") or []
    if not e2es:
        # Older layouts: E2E from TTFT plus the inter-token latencies.
        e2es = [t + sum(i) for t, i in zip(ttfts, d.get("itls") or [])]
    starts = d.get("start_times")
    errs = d.get("errors") or [""] * len(ttfts)
    if starts:
        return [{"id": None, "start_s": s, "ttft_s": t, "e2e_s": e, "ok": not er}
                for s, t, e, er in zip(starts, ttfts, e2es, errs)]
    return {"unordered": [{"ttft_s": t, "e2e_s": e, "ok": not er}
                          for t, e, er in zip(ttfts, e2es, errs)]}


TOOLS = {
    "blis-loadgen": (ours_cmd, ours_parse),
    "aiperf": (aiperf_cmd, aiperf_parse),
    "guidellm": (guidellm_cmd, guidellm_parse),
    "inference-perf": (iperf_cmd, iperf_parse),
    "oha": (oha_cmd, oha_parse),
    "vllm-bench": (vllm_cmd, vllm_parse),
}


# -------------------------------------------------------------- analysis


def pct(xs, q):
    """numpy-linear percentile of a non-empty list."""
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def schedule(served, rate):
    """Achieved rate and schedule error (ms) of the arrivals in the served log."""
    a = sorted(s["received_unix_us"] for s in served)
    if len(a) < 2:
        return {"arrived": len(a)}
    out = {"arrived": len(a), "achieved_rate": (len(a) - 1) / ((a[-1] - a[0]) / 1e6)}
    if rate:
        gap = 1e6 / rate
        t0 = min(x - i * gap for i, x in enumerate(a))
        lag = [(x - t0 - i * gap) / 1e3 for i, x in enumerate(a)]
        out.update(lag_p50_ms=pct(lag, 50), lag_p99_ms=pct(lag, 99), lag_max_ms=max(lag))
    return out


def join(records, served):
    """Pairs (tool record, served entry): by x-request-id, else in send order."""
    by_id = {s["x_request_id"]: s for s in served if s.get("x_request_id")}
    ok = [r for r in records if r["ok"] and r.get("e2e_s") is not None]
    if ok and all(r.get("id") in by_id for r in ok):
        return [(r, by_id[r["id"]]) for r in ok], "x-request-id"
    key = next((k for k in ("start_s", "start_raw") if ok and k in ok[0]), None)
    tool = sorted(ok, key=lambda r: r[key]) if key else ok
    truth = sorted(served, key=lambda s: s["received_unix_us"])
    if len(tool) != len(truth):
        return [], f"not joined: {len(tool)} completed by the tool, {len(truth)} served"
    return list(zip(tool, truth)), "send order"


def accuracy(parsed, served):
    """Median and p99 |tool - truth| of TTFT and E2E, ms."""
    truth_ttft = [(s["first_token_unix_us"] - s["received_unix_us"]) / 1e3 for s in served]
    truth_e2e = [(s["last_token_unix_us"] - s["received_unix_us"]) / 1e3 for s in served]
    res = {"truth_ttft_p50_ms": pct(truth_ttft, 50), "truth_e2e_p50_ms": pct(truth_e2e, 50)}
    if isinstance(parsed, dict):
        recs = parsed.get("relative") or parsed.get("unordered") or []
        ttft = [r["ttft_s"] * 1e3 for r in recs if r["ok"] and r.get("ttft_s") is not None]
        e2e = [r["e2e_s"] * 1e3 for r in recs if r["ok"] and r.get("e2e_s") is not None]
        if parsed.get("relative"):
            pairs, how = join(parsed["relative"], served)
        else:
            pairs, how = [], "percentiles only (no per-request send times)"
        if not pairs:
            res["join"] = how
            for name, mine, truth in (("ttft", ttft, truth_ttft), ("e2e", e2e, truth_e2e)):
                if mine and truth:
                    res[f"{name}_p50_diff_ms"] = abs(pct(mine, 50) - pct(truth, 50))
                    res[f"{name}_p99_diff_ms"] = abs(pct(mine, 99) - pct(truth, 99))
            return res
    else:
        pairs, how = join(parsed, served)
    res["join"] = how
    res["pairs"] = len(pairs)
    for name, key, first, last in (("ttft", "ttft_s", "received_unix_us", "first_token_unix_us"),
                                    ("e2e", "e2e_s", "received_unix_us", "last_token_unix_us")):
        err = [abs(r[key] * 1e3 - (s[last] - s[first]) / 1e3)
               for r, s in pairs if r.get(key) is not None]
        if err:
            res[f"{name}_err_p50_ms"] = pct(err, 50)
            res[f"{name}_err_p99_ms"] = pct(err, 99)
    return res


# ------------------------------------------------------------------ main


def run_point(ctx, tool, p, rep):
    wd = ctx.out / f"{p['name']}-{tool}-{rep}"
    wd.mkdir(parents=True, exist_ok=True)
    mock = Mock(ctx.bin, p["time_scale"], wd / "served.jsonl")
    cmd_fn, parse_fn = TOOLS[tool]
    Path(f"{wd}/clock.json").write_text(json.dumps(
        {"unix_minus_monotonic": time.time() - time.monotonic()}))
    try:
        cmd = cmd_fn(ctx, p, mock.url, mock.port, str(wd))
        timeout = p["duration_s"] * 10 + 120
        m = run_measured(cmd, str(wd), timeout, wd / "tool.log")
    finally:
        served = mock.stop()
    res = {"tool": tool, "point": p["name"], "rep": rep, "time_scale": p["time_scale"], **m,
           "planned": p["n"], "served": len(served)}
    res["cpu_ms_per_request"] = m["cpu_s"] / p["n"] * 1e3
    res.update(schedule(served, p.get("rate")))
    try:
        parsed = parse_fn(str(wd))
        if isinstance(parsed, list):
            res["tool_ok"] = sum(r["ok"] for r in parsed)
        res.update(accuracy(parsed, served))
    except Exception as e:  # a tool that wrote nothing readable
        res["parse_error"] = f"{type(e).__name__}: {e}"
    if tool == "blis-loadgen":
        try:
            s = json.loads(Path(f"{wd}/summary.json").read_text())
            res["own_lag_p99_ms"] = s["schedule"]["send_lag_p99_ms"]
        except (OSError, ValueError, KeyError):
            pass
    rate = p.get("rate")
    res["held"] = bool(
        not m["timed_out"] and len(served) >= 0.99 * p["n"]
        and (not rate or abs(res.get("achieved_rate", 0) - rate) <= 0.05 * rate))
    res["on_schedule"] = bool(res["held"] and rate and res.get("lag_p99_ms", 1e9) <= 1.0)
    return res


def med(rows, key):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def fmt(v, digits=1):
    if v is None:
        return "–"
    m, lo, hi = v
    if lo == hi:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def self_test():
    """The analysis on made-up logs whose answers are known (run by `cargo test`)."""
    # 100 req/s planned; arrivals 10 ms apart, request 5 sent 3 ms late,
    # the first one 1 ms late (so the schedule is anchored at the others).
    a = [1_000_000 + i * 10_000 for i in range(50)]
    a[5] += 3_000
    a[0] += 1_000
    served = [{"x_request_id": f"r{i}", "received_unix_us": x, "first_token_unix_us": x + 20_000,
               "last_token_unix_us": x + 50_000} for i, x in enumerate(a)]
    sc = schedule(served, 100)
    assert sc["arrived"] == 50 and abs(sc["lag_max_ms"] - 3.0) < 1e-9, sc
    assert sc["lag_p50_ms"] == 0.0, sc
    assert abs(sc["achieved_rate"] - 49 / 0.489) < 1e-6, sc  # first arrival 1 ms late
    # A tool that measured every TTFT 0.5 ms long and E2E 0.25 ms long,
    # joined by id, then the same without ids (by send order), shuffled.
    recs = [{"id": s["x_request_id"], "start_s": s["received_unix_us"] / 1e6 - 1e-4,
             "ttft_s": 0.0205, "e2e_s": 0.05025, "ok": True} for s in served]
    for how, rs in (("x-request-id", recs),
                    ("send order", [dict(r, id=None) for r in reversed(recs)])):
        acc = accuracy(rs, served)
        assert acc["join"] == how and acc["pairs"] == 50, acc
        assert abs(acc["ttft_err_p50_ms"] - 0.5) < 1e-6 and abs(acc["e2e_err_p99_ms"] - 0.25) < 1e-6, acc
    # One lost request: no join by order, percentiles instead.
    acc = accuracy({"unordered": recs[1:]}, served)
    assert "ttft_p50_diff_ms" in acc and "pairs" not in acc, acc
    acc = accuracy([dict(r, id=None) for r in recs[1:]], served)
    assert acc["join"].startswith("not joined") and "ttft_err_p50_ms" not in acc, acc
    print("race.py self-test: ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tools", default="blis-loadgen,aiperf,guidellm,inference-perf,oha,vllm-bench")
    ap.add_argument("--rates", default="100,1000,5000,10000")
    ap.add_argument("--concurrency", default="64,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration-s", type=int, default=5)
    ap.add_argument("--accuracy", default="light:10:16,light:10:256,heavy:300:16:10,heavy:1000:16:10",
                    help="NAME:RATE:OUTPUT_TOKENS[:TIME_SCALE] points (default real time); "
                    "the heavy one runs the mock 10x faster so that no tool's load queues "
                    "in the simulated server: the load is on the client")
    ap.add_argument("--sections", default="open,closed,accuracy")
    ap.add_argument("--from", dest="from_", nargs="+", metavar="RACE_JSON",
                    help="print the tables of earlier runs (their race.json) instead of running")
    args = ap.parse_args()
    ctx = argparse.Namespace(bin=os.path.abspath(args.bin), env=os.path.abspath(args.env),
                             tokenizer=os.path.abspath(args.tokenizer), out=Path(args.out).resolve())
    ctx.out.mkdir(parents=True, exist_ok=True)
    tools = [t for t in args.tools.split(",") if t]
    sections = args.sections.split(",")
    d = args.duration_s
    results = []

    def log(r):
        results.append(r)
        (ctx.out / "race.json").write_text(json.dumps(results, indent=1))
        keys = ("achieved_rate", "lag_p99_ms", "cpu_ms_per_request", "peak_mib", "wall_s",
                "ttft_err_p50_ms", "e2e_err_p50_ms", "ttft_p50_diff_ms")
        print(f"{r['point']:>14} {r['tool']:>15} #{r['rep']} held={r['held']!s:5} "
              + " ".join(f"{k}={r[k]:.3g}" for k in keys if isinstance(r.get(k), (int, float)))
              + (f" timed_out" if r["timed_out"] else "") + (f" rc={r['rc']}" if r["rc"] else "")
              + (f" {r['parse_error']}" if r.get("parse_error") else ""),
              file=sys.stderr, flush=True)

    def sweep(points, gate):
        """Every point, tools interleaved in a rotated order per repetition;
        with `gate`, a tool that held none of a point's runs skips the later ones."""
        active = list(tools)
        for p in points:
            for rep in range(args.reps):
                order = active[rep % len(active):] + active[:rep % len(active)] if active else []
                for tool in order:
                    log(run_point(ctx, tool, p, rep))
            if gate:
                held = {t for t in active for r in results
                        if r["tool"] == t and r["point"] == p["name"] and r["held"]}
                for t in active:
                    if t not in held:
                        skipped.setdefault(t, p["name"])
                active = [t for t in active if t in held]

    skipped = {}
    if args.from_:
        for f in args.from_:
            results.extend(json.loads(Path(f).read_text()))
        sections = []
    if "open" in sections:
        pts = [{"name": f"open-{r}", "kind": "open", "rate": r, "n": r * d, "duration_s": d,
                "output": 4, "time_scale": 1000} for r in map(int, args.rates.split(","))]
        sweep(pts, gate=True)
    if "closed" in sections:
        n = 5000
        pts = [{"name": f"closed-{c}", "kind": "closed", "concurrency": c, "n": n,
                "duration_s": 20, "output": 4, "time_scale": 1000}
               for c in map(int, args.concurrency.split(","))]
        skipped = {}
        sweep(pts, gate=False)
    if "accuracy" in sections:
        pts = []
        for spec in args.accuracy.split(","):
            name, rate, out, *scale = spec.split(":")
            rate, out = int(rate), int(out)
            dur = 10 if rate <= 20 else 5
            pts.append({"name": f"acc-{name}-{rate}-{out}", "kind": "open", "rate": rate,
                        "n": rate * dur, "duration_s": dur, "output": out,
                        "time_scale": float(scale[0]) if scale else 1})
        sweep(pts, gate=False)

    # ---- tables
    def rows(tool, point):
        return [r for r in results if r["tool"] == tool and r["point"] == point]

    print("## Open loop: constant arrivals, 32-token prompts, 4-token streamed outputs, mock at 1000x\n")
    print("| tool | planned req/s | runs held | achieved req/s | schedule error p50 ms | p99 ms | "
          "CPU ms/request | peak MiB | wall s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for tool in tools:
        tried = []
        for r in map(int, args.rates.split(",")):
            rs = rows(tool, f"open-{r}")
            if not rs:
                if tried:
                    print(f"| {tool} | {r} | not run: held none of the runs at {tried[-1]} "
                          "| | | | | | |")
                continue
            tried.append(r)
            print(f"| {tool} | {r} | {sum(x['held'] for x in rs)}/{len(rs)} | "
                  f"{fmt(med(rs, 'achieved_rate'), 0)} | {fmt(med(rs, 'lag_p50_ms'), 2)} | "
                  f"{fmt(med(rs, 'lag_p99_ms'), 2)} | {fmt(med(rs, 'cpu_ms_per_request'), 3)} | "
                  f"{fmt(med(rs, 'peak_mib'), 0)} | {fmt(med(rs, 'wall_s'), 1)} |")
    print("\n## Highest planned rate on schedule (every run held and p99 schedule error <= 1 ms)\n")
    print("| tool | highest on-schedule req/s | highest held req/s |")
    print("|---|---:|---:|")
    for tool in tools:
        on, held = 0, 0
        for r in map(int, args.rates.split(",")):
            rs = rows(tool, f"open-{r}")
            if rs and all(x["on_schedule"] for x in rs):
                on = max(on, r)
            if rs and all(x["held"] for x in rs):
                held = max(held, r)
        print(f"| {tool} | {on or 'none'} | {held or 'none'} |")
    if any(r["point"].startswith("closed-") for r in results):
        print("\n## Closed loop: 5,000 requests, 4-token outputs, mock at 1000x\n")
        print("| tool | concurrency | achieved req/s | CPU ms/request | peak MiB | wall s | completed |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for tool in tools:
            for c in map(int, args.concurrency.split(",")):
                rs = rows(tool, f"closed-{c}")
                print(f"| {tool} | {c} | {fmt(med(rs, 'achieved_rate'), 0)} | "
                      f"{fmt(med(rs, 'cpu_ms_per_request'), 3)} | {fmt(med(rs, 'peak_mib'), 0)} | "
                      f"{fmt(med(rs, 'wall_s'), 1)} | {fmt(med(rs, 'served'), 0)} |")
    if any(r["point"].startswith("acc-") for r in results):
        print("\n## Measurement accuracy against the mock's served log\n")
        print("| point | tool | joined by | TTFT abs error p50 ms | p99 ms | E2E abs error p50 ms | "
              "p99 ms | true TTFT p50 ms |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for spec in args.accuracy.split(","):
            name, rate, out, *scale = spec.split(":")
            point = f"acc-{name}-{rate}-{out}"
            mock = f", mock at {scale[0]}x" if scale and float(scale[0]) != 1 else ""
            for tool in tools:
                rs = rows(tool, point)
                if not rs:
                    continue
                how = sorted({r.get("join", r.get("parse_error", "?")) for r in rs})
                if any("ttft_err_p50_ms" in r or "e2e_err_p50_ms" in r for r in rs):
                    cols = [fmt(med(rs, k), 2) for k in
                            ("ttft_err_p50_ms", "ttft_err_p99_ms", "e2e_err_p50_ms", "e2e_err_p99_ms")]
                else:
                    cols = [fmt(med(rs, k), 2) + "†" if med(rs, k) else "–" for k in
                            ("ttft_p50_diff_ms", "ttft_p99_diff_ms", "e2e_p50_diff_ms", "e2e_p99_diff_ms")]
                print(f"| {rate} req/s, {out} tokens{mock} | {tool} | {'; '.join(how)} | "
                      + " | ".join(cols) + f" | {fmt(med(rs, 'truth_ttft_p50_ms'), 1)} |")
        print("\n† no per-request join: the difference of the tool's percentile and the truth's.")


if __name__ == "__main__":
    main()
