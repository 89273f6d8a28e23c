//! What `blis-loadgen` is asked to do, as the library takes it: the
//! workload ([`WorkloadSource`], [`Synthetic`]), a plan to write
//! ([`PlanOptions`]) and a run to observe ([`RunOptions`]). The
//! command line ([`crate::cli`]) builds these; nothing below it knows the
//! command line.

use std::path::PathBuf;

pub use crate::http::{Api, ServerType};
use blis_traces::ImportSource;

/// Where a workload comes from: exactly one of a spec, an import, a trace,
/// or a synthetic rate.
#[derive(Debug, Clone, Default)]
pub struct WorkloadSource {
    /// Workload spec YAML (clients, arrivals, length distributions).
    pub workload_spec: Option<PathBuf>,
    /// Import a public trace: mooncake:FILE, azure:FILE,
    /// inference-perf:PROFILE, vllm-gt:RUN_DIR.
    pub import: Option<ImportSource>,
    /// The requests of a trace (its planned arrivals and lengths).
    pub trace: Option<PathBuf>,
    /// A synthetic workload at this many requests/s (with --num-requests
    /// or --duration-s, --input-tokens, --output-tokens, --arrival).
    pub rate: Option<f64>,
}

/// Lengths of a synthetic `--rate` workload.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// Input tokens: N, gaussian:MEAN,STD, exponential:MEAN or uniform:A,B.
    pub input_tokens: String,
    /// Output tokens: same forms as --input-tokens.
    pub output_tokens: String,
    /// Inter-arrival gaps of a --rate workload.
    pub arrival: Arrival,
    /// `--burstiness`: Gamma-distributed gaps of this shape instead
    /// (`vllm bench serve --burstiness`: 1 is Poisson, below 1 burstier,
    /// above 1 more even; the rate is kept).
    pub burstiness: Option<f64>,
    /// Whether any of these was given (they shape a `--rate` workload
    /// only: with another workload they are refused, not ignored).
    pub given: bool,
}

/// `generate` options.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// The workload.
    pub workload: WorkloadSource,
    /// Lengths of a --rate workload.
    pub synthetic: Synthetic,
    /// Output prefix: writes PREFIX.yaml and PREFIX.csv.
    pub out: PathBuf,
    /// Seed (overrides the spec's).
    pub seed: Option<u64>,
    /// Stop generating at this many seconds (overrides the spec's horizon).
    pub horizon_s: Option<f64>,
    /// Stop after this many requests (overrides the spec's num_requests).
    pub num_requests: Option<u64>,
    /// A workload spec's total rate, requests/s (replaces its
    /// `aggregate_rate`, or a ServeGen spec's `servegen_data.aggregate_rate`
    /// and `rate_scale`).
    pub aggregate_rate: Option<f64>,
    /// Keep what an imported real run measured (send, first and last chunk
    /// times, statuses, cached tokens): write it as a real trace
    /// (`mode: real`) that `blis-calibrate compare --real` and `fit` read,
    /// instead of its plan (`mode: generated`, outcomes dropped: the
    /// default, for sending it again).
    pub keep_measured: bool,
}

/// `run` options.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Base URL of the server, e.g. http://127.0.0.1:8000.
    pub server_url: String,
    /// Model name to send.
    pub model: String,
    /// The workload.
    pub workload: WorkloadSource,
    /// Lengths of a --rate workload.
    pub synthetic: Synthetic,
    /// Output prefix: PREFIX.yaml, .csv, .itl.csv, .metrics.csv.
    pub out: PathBuf,
    /// API to use.
    pub api: Api,
    /// Server family.
    pub server_type: ServerType,
    /// Ask for whole responses instead of streams (overrides the workload).
    pub no_stream: bool,
    /// Closed loop: N users, each sending its next request when its last
    /// response ends (arrival times are ignored).
    pub concurrency: Option<usize>,
    /// Requests in flight at most (open loop; later sends wait and their
    /// lag is recorded).
    pub max_in_flight: Option<usize>,
    /// Client timeout per request, seconds.
    pub timeout_s: f64,
    /// Seconds to wait for a server still starting (connection refused,
    /// or 503) before the run; 0: a refused connection fails at once.
    pub wait_for_server_s: f64,
    /// Leading requests marked as warm-up (excluded from statistics).
    pub warmup_requests: u64,
    /// Stop sending after this many seconds.
    pub duration_s: Option<f64>,
    /// Stop after this many requests.
    pub num_requests: Option<u64>,
    /// A workload spec's total rate, requests/s (replaces its
    /// `aggregate_rate`, or a ServeGen spec's `servegen_data.aggregate_rate`
    /// and `rate_scale`).
    pub aggregate_rate: Option<f64>,
    /// Seed of the workload and the prompt texts.
    pub seed: Option<u64>,
    /// API key sent as a Bearer token (never written anywhere).
    pub api_key: Option<String>,
    /// Prometheus endpoint (default: SERVER_URL/metrics).
    pub metrics_url: Option<String>,
    /// Scrape interval, ms (0: no scraping).
    pub scrape_interval_ms: u64,
    /// Client-bound when the p99 send lag exceeds this, ms. An open loop
    /// this far behind starts a request only when one ends.
    pub max_send_lag_ms: f64,
    /// Exit with code 3 when the run was client-bound.
    pub strict: bool,
    /// The run failed (verdict `failed`, exit code 5) when more than this
    /// share of the requests that got an answer failed, or all of them did.
    pub max_error_rate: f64,
    /// Open loop: stop sending when the client itself falls this far behind
    /// its schedule, seconds (it cannot keep up: the rest of the plan
    /// becomes not-sent rows and the verdict `client-bound`, instead of a
    /// run that takes several times its length); 0 never stops.
    pub max_behind_s: f64,
    /// On SIGINT/SIGTERM, wait this long for requests in flight, seconds.
    pub grace_s: f64,
    /// Goodput SLOs, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=10000 (or vLLM's
    /// `--goodput` form ttft:500,tpot:50,e2el:10000).
    pub slo: Option<String>,
    /// Print the summary as JSON.
    pub json: bool,
    /// Threads that send and receive (0: one per CPU core). When the server
    /// shares this machine, 1 leaves it more CPU.
    pub client_threads: usize,
    /// Send only part I of N of the plan (0 ≤ I < N): its units (a request,
    /// or a session's rounds) I, I + N, I + 2N, ... in send order, so that
    /// N processes, on N machines, send exactly the one-process schedule
    /// together. Join their traces with `blis-loadgen merge`.
    pub shard: Option<Shard>,
    /// Start the schedule at this Unix time, seconds (fractions allowed),
    /// instead of 0.2 s from now: shards started with the same value start
    /// together (to their clocks' agreement).
    pub start_at: Option<f64>,
}

impl Synthetic {
    /// `--input-tokens` by default.
    pub const DEFAULT_INPUT_TOKENS: &'static str = "512";
    /// `--output-tokens` by default.
    pub const DEFAULT_OUTPUT_TOKENS: &'static str = "128";
}

impl Default for Synthetic {
    fn default() -> Self {
        Synthetic {
            input_tokens: Self::DEFAULT_INPUT_TOKENS.into(),
            output_tokens: Self::DEFAULT_OUTPUT_TOKENS.into(),
            arrival: Arrival::Poisson,
            burstiness: None,
            given: false,
        }
    }
}

/// Checks a `--wait-for-server-s` value (seconds, 0 to a day).
///
/// # Errors
/// The one-line message naming the flag.
pub fn check_wait_for_server(s: f64) -> Result<(), String> {
    if (0.0..=86_400.0).contains(&s) {
        Ok(())
    } else {
        Err(format!(
            "--wait-for-server-s must be a number of seconds in [0, 86400], got {}",
            blis_traces::shown::Num(s)
        ))
    }
}

impl RunOptions {
    /// `--timeout-s` by default.
    pub const DEFAULT_TIMEOUT_S: f64 = 300.0;
    /// `--scrape-interval-ms` by default.
    pub const DEFAULT_SCRAPE_INTERVAL_MS: u64 = 1000;
    /// `--max-send-lag-ms` by default.
    pub const DEFAULT_MAX_SEND_LAG_MS: f64 = 10.0;
    /// `--max-error-rate` by default.
    pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.5;
    /// `--max-behind-s` by default.
    pub const DEFAULT_MAX_BEHIND_S: f64 = 1.0;
    /// `--grace-s` by default.
    pub const DEFAULT_GRACE_S: f64 = 5.0;

    /// A run of `workload` against `model` at `server_url`, written at the
    /// prefix `out`, with every other setting at the command line's
    /// default.
    pub fn new(server_url: &str, model: &str, workload: WorkloadSource, out: PathBuf) -> Self {
        RunOptions {
            server_url: server_url.to_string(),
            model: model.to_string(),
            workload,
            synthetic: Synthetic::default(),
            out,
            api: Api::Completions,
            server_type: ServerType::Vllm,
            no_stream: false,
            concurrency: None,
            max_in_flight: None,
            timeout_s: Self::DEFAULT_TIMEOUT_S,
            wait_for_server_s: 0.0,
            warmup_requests: 0,
            duration_s: None,
            num_requests: None,
            aggregate_rate: None,
            seed: None,
            api_key: None,
            metrics_url: None,
            scrape_interval_ms: Self::DEFAULT_SCRAPE_INTERVAL_MS,
            max_send_lag_ms: Self::DEFAULT_MAX_SEND_LAG_MS,
            strict: false,
            max_error_rate: Self::DEFAULT_MAX_ERROR_RATE,
            max_behind_s: Self::DEFAULT_MAX_BEHIND_S,
            grace_s: Self::DEFAULT_GRACE_S,
            slo: None,
            json: false,
            client_threads: 0,
            shard: None,
            start_at: None,
        }
    }
}

/// Inter-arrival gaps of a synthetic `--rate` workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Constant,
}

impl Arrival {
    /// The workload spec's name for it.
    pub fn spec_name(self) -> &'static str {
        match self {
            Arrival::Poisson => "poisson",
            Arrival::Constant => "constant",
        }
    }
}

/// One part of a sharded run: this process sends the units (lone requests
/// and whole sessions, in send order) whose index is `index` modulo
/// `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// The part, from 0.
    pub index: u32,
    /// Parts in all, at least 1.
    pub count: u32,
}

impl Shard {
    /// Whether the unit at `k` (in send order) is this part's.
    pub fn has(&self, k: usize) -> bool {
        k % self.count as usize == self.index as usize
    }

    /// Parses `I/N` with 0 ≤ I < N ≤ 10,000.
    ///
    /// # Errors
    /// Anything else, with the form it wants.
    pub fn parse(s: &str) -> Result<Shard, String> {
        let bad = || format!("--shard wants I/N with 0 <= I < N <= 10000 (e.g. 0/4), got {s:?}");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || count > 10_000 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}
