"""Reads `blis-loadgen export --format aiperf` back with AIPerf's own
per-request model (`aiperf.common.models.MetricRecordInfo`)."""
import statistics, sys
from importlib.metadata import version
from aiperf.common.models import MetricRecordInfo
recs = [MetricRecordInfo.model_validate_json(l) for l in open(sys.argv[1])]
ok = [r for r in recs if r.error is None]
bad = [r for r in recs if r.error is not None]
ttft = [r.metrics["time_to_first_token"].value for r in ok if r.metadata.benchmark_phase == "profiling"]
print(f"AIPerf {version('aiperf')} MetricRecordInfo read {len(recs)} records: "
      f"{len(ok)} ok, {len(bad)} errors ({sorted({r.error.type for r in bad})}), "
      f"{sum(r.metadata.benchmark_phase == 'warmup' for r in recs)} warm-up; "
      f"TTFT p50 {statistics.median(ttft):.2f} ms over {len(ttft)} profiling records")
