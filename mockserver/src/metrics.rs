//! `/metrics` in Prometheus text format with vLLM V1's metric names and
//! histogram buckets (`vllm/v1/metrics/loggers.py`), or SGLang's names.

use std::fmt::Write as _;
use std::sync::Mutex;

use blis_replay::engine::instance::{Finished, Snapshot};

/// Which server's metric names to expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsStyle {
    /// `vllm:` names.
    #[default]
    Vllm,
    /// `sglang:` names.
    Sglang,
}

/// vLLM's TTFT buckets, seconds.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token latency buckets, seconds.
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (E2E, queue time), seconds.
pub const REQUEST_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {c}.0");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}.0",
            self.count
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}.0", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
    }
}

#[derive(Debug)]
struct Inner {
    snapshot: Option<Snapshot>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    success_length: u64,
    success_stop: u64,
    aborted: u64,
    faults: Vec<(&'static str, u64)>,
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
    model: String,
    style: MetricsStyle,
    cache: Option<(u32, u32, bool)>,
}

/// Fault kinds counted in `blis_mock_faults_total{kind}`.
pub const FAULT_KINDS: [&str; 8] = [
    "http_500",
    "http_503",
    "http_429",
    "drop",
    "stall",
    "malformed",
    "missing_usage",
    "forced",
];

impl Metrics {
    /// Empty metrics for `model`.
    pub fn new(model: &str, style: MetricsStyle) -> Self {
        Self {
            inner: Mutex::new(Inner {
                snapshot: None,
                ttft: Histogram::new(&TTFT_BUCKETS),
                itl: Histogram::new(&ITL_BUCKETS),
                e2e: Histogram::new(&REQUEST_BUCKETS),
                queue: Histogram::new(&REQUEST_BUCKETS),
                success_length: 0,
                success_stop: 0,
                aborted: 0,
                faults: FAULT_KINDS.iter().map(|k| (*k, 0)).collect(),
            }),
            model: model.to_string(),
            style,
            cache: None,
        }
    }

    /// Also exposes vLLM's `vllm:cache_config_info` gauge (value 1, the
    /// settings as labels `block_size` and `num_gpu_blocks`), which clients
    /// read to learn the KV cache size.
    pub fn with_cache_config(
        mut self,
        block_size: u32,
        num_gpu_blocks: u32,
        prefix_caching: bool,
    ) -> Self {
        self.cache = Some((block_size, num_gpu_blocks, prefix_caching));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Requests running in the engine's latest state.
    pub fn running(&self) -> u64 {
        self.lock().snapshot.map_or(0, |s| u64::from(s.running))
    }

    /// The engine's latest state.
    pub fn set_snapshot(&self, s: Snapshot) {
        self.lock().snapshot = Some(s);
    }

    /// One inter-token gap, µs (simulated).
    pub fn observe_itl(&self, us: i64) {
        self.lock().itl.observe(us as f64 / 1e6);
    }

    /// A completed request (server-side times, simulated µs).
    pub fn finished(&self, f: &Finished, arrival: i64, enqueued: i64) {
        let mut i = self.lock();
        i.ttft.observe((f.first_token_us - arrival) as f64 / 1e6);
        i.e2e.observe((f.last_token_us - arrival) as f64 / 1e6);
        i.queue
            .observe((f.scheduled_us - enqueued).max(0) as f64 / 1e6);
    }

    /// A request answered successfully with `finish_reason`.
    pub fn success(&self, finish_reason: &str) {
        let mut i = self.lock();
        if finish_reason == "stop" {
            i.success_stop += 1;
        } else {
            i.success_length += 1;
        }
    }

    /// A request cancelled by its client.
    pub fn aborted(&self) {
        self.lock().aborted += 1;
    }

    /// An injected fault of `kind` (one of [`FAULT_KINDS`]).
    pub fn fault(&self, kind: &str) {
        let mut i = self.lock();
        if let Some(e) = i.faults.iter_mut().find(|(k, _)| *k == kind) {
            e.1 += 1;
        }
    }

    /// The count of injected faults of `kind`.
    pub fn faults(&self, kind: &str) -> u64 {
        self.lock()
            .faults
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |e| e.1)
    }

    /// The Prometheus text body.
    pub fn render(&self) -> String {
        let i = self.lock();
        let labels = format!("model_name=\"{}\"", self.model.replace('"', "'"));
        let mut o = String::new();
        let s = i.snapshot.unwrap_or_default();
        let c = s.counters;
        let gauge = |o: &mut String, name: &str, v: f64| {
            let _ = writeln!(o, "# TYPE {name} gauge\n{name}{{{labels}}} {v:?}");
        };
        let counter = |o: &mut String, name: &str, v: u64| {
            let _ = writeln!(o, "# TYPE {name} counter\n{name}{{{labels}}} {v}.0");
        };
        match self.style {
            MetricsStyle::Vllm => {
                if let Some((bs, blocks, pc)) = self.cache {
                    let pc = if pc { "True" } else { "False" };
                    let _ = writeln!(
                        o,
                        "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"{bs}\",cache_dtype=\"auto\",enable_prefix_caching=\"{pc}\",num_gpu_blocks=\"{blocks}\"}} 1.0"
                    );
                }
                gauge(&mut o, "vllm:num_requests_running", f64::from(s.running));
                gauge(&mut o, "vllm:num_requests_waiting", f64::from(s.waiting));
                gauge(&mut o, "vllm:kv_cache_usage_perc", s.kv_usage());
                counter(&mut o, "vllm:prefix_cache_queries_total", c.prefix_queries);
                counter(&mut o, "vllm:prefix_cache_hits_total", c.prefix_hits);
                counter(&mut o, "vllm:num_preemptions_total", c.preemptions);
                counter(&mut o, "vllm:prompt_tokens_total", c.prompt_tokens);
                counter(&mut o, "vllm:generation_tokens_total", c.generation_tokens);
                let _ = writeln!(o, "# TYPE vllm:request_success_total counter");
                let _ = writeln!(
                    o,
                    "vllm:request_success_total{{finished_reason=\"length\",{labels}}} {}.0",
                    i.success_length
                );
                let _ = writeln!(
                    o,
                    "vllm:request_success_total{{finished_reason=\"stop\",{labels}}} {}.0",
                    i.success_stop
                );
                let _ = writeln!(
                    o,
                    "vllm:request_success_total{{finished_reason=\"abort\",{labels}}} {}.0",
                    i.aborted
                );
                i.ttft
                    .render(&mut o, "vllm:time_to_first_token_seconds", &labels);
                i.itl
                    .render(&mut o, "vllm:inter_token_latency_seconds", &labels);
                i.e2e
                    .render(&mut o, "vllm:e2e_request_latency_seconds", &labels);
                i.queue
                    .render(&mut o, "vllm:request_queue_time_seconds", &labels);
            }
            MetricsStyle::Sglang => {
                gauge(&mut o, "sglang:num_running_reqs", f64::from(s.running));
                gauge(&mut o, "sglang:num_queue_reqs", f64::from(s.waiting));
                gauge(&mut o, "sglang:token_usage", s.kv_usage());
                gauge(&mut o, "sglang:cache_hit_rate", c.prefix_hit_rate());
                counter(&mut o, "sglang:prompt_tokens_total", c.prompt_tokens);
                counter(
                    &mut o,
                    "sglang:generation_tokens_total",
                    c.generation_tokens,
                );
                counter(
                    &mut o,
                    "sglang:num_requests_total",
                    i.success_length + i.success_stop,
                );
                i.ttft
                    .render(&mut o, "sglang:time_to_first_token_seconds", &labels);
                i.itl
                    .render(&mut o, "sglang:inter_token_latency_seconds", &labels);
                i.e2e
                    .render(&mut o, "sglang:e2e_request_latency_seconds", &labels);
                i.queue.render(&mut o, "sglang:queue_time_seconds", &labels);
            }
        }
        let _ = writeln!(o, "# TYPE blis_mock_faults_total counter");
        for (k, v) in &i.faults {
            let _ = writeln!(o, "blis_mock_faults_total{{kind=\"{k}\"}} {v}.0");
        }
        o
    }
}
