"""Reads `blis-loadgen export --format inference-perf` back with
inference-perf's own report validators, and recomputes the run summary
from the exported per-request records with inference-perf's own
`summarize_requests`; prints the largest relative difference."""
import json, sys
from pathlib import Path
from importlib.metadata import version
from inference_perf.utils import ReportFile
from inference_perf.reportgen.validation import run_validators, default_validators
from inference_perf.reportgen.base import summarize_requests
from inference_perf.apis.base import RequestLifecycleMetric, ErrorResponseInfo, InferenceInfo, StreamedResponseMetrics
from inference_perf.payloads import RequestMetrics

d = Path(sys.argv[1])
files = {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}
result = run_validators(default_validators(), [ReportFile(n, c) for n, c in files.items()])
errors, warnings = result.all_errors(), result.all_warnings()
for f in errors + warnings:
    print(f"  {f.severity.value}: [{f.check}] {f.report or 'global'}: {f.message}")

metrics = []
for e in files["per_request_lifecycle_metrics"]:
    info = e["info"]
    rm = info["response_metrics"]
    metrics.append(RequestLifecycleMetric(
        scheduled_time=e["start_time"], start_time=e["start_time"], end_time=e["end_time"],
        request_data="",
        info=InferenceInfo(request_metrics=RequestMetrics.model_validate(info["request_metrics"]),
                           response_metrics=StreamedResponseMetrics(output_tokens=rm["output_tokens"], server_usage=rm["server_usage"],
                               chunk_times=rm["chunk_times"], output_token_times=rm["output_token_times"])),
        error=ErrorResponseInfo(**e["error"]) if e["error"] else None))
pct = [0.1, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9]
theirs = summarize_requests(metrics, pct).model_dump()
ours = files["summary_lifecycle_metrics"]
worst = (0.0, "")
def walk(a, b, path):
    global worst
    if isinstance(b, dict):
        for k, v in b.items():
            if k in ("schedule_delay", "by_label", "request_size_bytes", "image", "video", "audio"):
                continue  # scheduled times and error labels are ours, request bodies not kept
            walk(a.get(k) if isinstance(a, dict) else None, v, f"{path}.{k}")
    elif isinstance(b, (int, float)) and not isinstance(b, bool):
        if not isinstance(a, (int, float)):
            worst = (float("inf"), f"{path}: ours {a!r} inference-perf {b!r}")
            return
        r = abs(a - b) / max(abs(b), 1e-12) if a != b else 0.0
        if r > worst[0]:
            worst = (r, f"{path}: ours {a} inference-perf {b}")
walk(ours, theirs, "summary")
s = ours["successes"]
print(f"inference-perf {version('inference-perf')} validators: {len(errors)} errors, {len(warnings)} warnings over "
      f"{sorted(result.reports)}; {ours['load_summary']['count']} requests, {s['count']} ok, "
      f"{ours['failures']['count']} failed; TTFT median {s['latency']['time_to_first_token']['median']*1e3:.2f} ms, "
      f"ITL p99 {s['latency']['inter_token_latency']['p99']*1e3:.2f} ms; largest relative difference from "
      f"inference-perf's own summarize_requests: {worst[0]:.1e} {worst[1]}")
sys.exit(0 if not errors and worst[0] < 1e-9 else 1)
