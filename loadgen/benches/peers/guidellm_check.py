"""Reads `blis-loadgen export --format guidellm` back with guidellm's own
report model and recomputes its metrics from the exported requests with
guidellm's own statistics; prints the largest relative difference."""
import sys
from importlib.metadata import version
from guidellm.benchmark.schemas.report import GenerativeBenchmarksReport
from guidellm.schemas.base.statistics import StatusDistributionSummary as S

rep = GenerativeBenchmarksReport.load_file(sys.argv[1])
b = rep.benchmarks[0]
ok, inc, err = b.requests.successful, b.requests.incomplete, b.requests.errored
start, end = b.scheduler_metrics.measure_start_time, b.scheduler_metrics.measure_end_time
ft = lambda g: [r for r in g if r.first_token_iteration is not None]
theirs = {
    "request_latency": S.from_values_function(lambda r: r.request_latency or 0.0, ok, inc, err),
    "time_to_first_token_ms": S.from_values_function(lambda r: r.time_to_first_token_ms or 0.0, ft(ok), ft(inc), ft(err)),
    "inter_token_latency_ms": S.from_values_function(
        lambda r: (r.inter_token_latency_ms or 0.0, (r.output_tokens or 1.0) - 1.0), ok, inc, err),
    "time_per_output_token_ms": S.from_values_function(
        lambda r: (r.time_per_output_token_ms or 0.0, r.output_tokens or 0.0), ok, inc, err),
    "output_token_count": S.from_values_function(lambda r: r.output_tokens or 0.0, ok, inc, err),
    "requests_per_second": S.rate_distribution_from_timings_function(
        lambda r: r.request_end_time, ok, inc, err, start_time=start, end_time=end),
    "request_concurrency": S.concurrency_distribution_from_timings_function(
        lambda r: (r.request_start_time, r.request_end_time), ok, inc, err, start_time=start, end_time=end),
    "output_tokens_per_second": S.rate_distribution_from_timings_function(
        lambda r: r.output_tokens_timings, ok, inc, err, start_time=start, end_time=end),
    "tokens_per_second": S.rate_distribution_from_timings_function(
        lambda r: r.total_tokens_timings, ok, inc, err, start_time=start, end_time=end),
}
worst = (0.0, "")
for name, t in theirs.items():
    ours = getattr(b.metrics, name)
    for status in ("successful", "errored", "incomplete", "total"):
        o, g = getattr(ours, status), getattr(t, status)
        pairs = [("mean", o.mean, g.mean), ("median", o.median, g.median), ("max", o.max, g.max),
                 ("p99", o.percentiles.p99, g.percentiles.p99), ("count", o.count, g.count)]
        for stat, x, y in pairs:
            d = abs(x - y) / max(abs(y), 1e-12) if x != y else 0.0
            if d > worst[0]:
                worst = (d, f"{name}.{status}.{stat}: ours {x} guidellm {y}")
m = b.metrics
print(f"guidellm {version('guidellm')} GenerativeBenchmarksReport read {len(ok)} completed, "
      f"{len(err)} errored, {len(inc)} incomplete requests; "
      f"TTFT median {m.time_to_first_token_ms.successful.median:.2f} ms, "
      f"ITL mean {m.inter_token_latency_ms.successful.mean:.3f} ms, "
      f"{m.requests_per_second.successful.mean:.1f} req/s; "
      f"largest relative difference from guidellm's own statistics over {len(theirs)} metrics: "
      f"{worst[0]:.1e} {worst[1]}")
sys.exit(0 if worst[0] < 1e-9 else 1)
