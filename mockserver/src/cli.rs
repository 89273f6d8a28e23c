//! Command-line options of `blis-mockserver`.

use std::net::IpAddr;
use std::path::PathBuf;

use blis_replay::commands::cli::LatencyChoice;
use clap::Parser;

use crate::metrics::MetricsStyle;
use crate::server::OutputDist;

/// An OpenAI-compatible server with vLLM-style `/metrics` whose timing is
/// the blis-replay engine run in real time.
#[derive(Parser, Debug, Clone)]
#[command(name = "blis-mockserver", version, about, long_about = None, after_help = "Examples:\n  \
    blis-mockserver --port 8000 --model meta-llama/Llama-3.1-8B-Instruct\n  \
    blis-mockserver --port 0 --latency-model roofline --model qwen2.5-7b-instruct --time-scale 10\n  \
    blis-mockserver --fault-500-rate 0.05 --fault-drop-rate 0.01\n\n\
    The first line on stdout is `listening on http://HOST:PORT`.")]
pub struct Opts {
    /// Address to bind (the default, loopback, is unreachable from other
    /// machines; 0.0.0.0 serves every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port (0: the OS picks one).
    #[arg(allow_negative_numbers = true, long, default_value_t = 8000)]
    pub port: u16,
    /// Served model name (also selects coefficients and the model config).
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long, env = "BLIS_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// /health answers 503 for this long after start.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub startup_delay_ms: u64,
    /// Simulated seconds per wall second (2: twice as fast as real time),
    /// 0.000001 to 1000000.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Metric names: vllm or sglang.
    #[arg(long, value_enum, default_value = "vllm")]
    pub metrics_style: MetricsStyleArg,
    /// Response length when the request does not force max_tokens:
    /// constant:N, exponential:MEAN or uniform:A,B (capped by max_tokens).
    #[arg(long, default_value = "exponential:256")]
    pub output_dist: OutputDist,
    /// Seed of output lengths and fault draws.
    #[arg(allow_negative_numbers = true, long, default_value_t = 42)]
    pub seed: u64,

    /// Latency model: blackbox or roofline (default: blackbox when the
    /// coefficients file has a row for the model, else roofline).
    #[arg(long, value_enum)]
    pub latency_model: Option<LatencyChoice>,
    /// Coefficients file (default: bundled).
    #[arg(long)]
    pub coefficients: Option<PathBuf>,
    /// Model config.json or folder.
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// GPU name.
    #[arg(long)]
    pub hardware: Option<String>,
    /// Tensor parallelism.
    #[arg(allow_negative_numbers = true, long)]
    pub tp: Option<u32>,
    /// Batch and KV-cache limits (vLLM's flags).
    #[command(flatten)]
    pub engine: blis_replay::commands::cli::EngineFlags,
    /// Scheduler: fcfs, priority-fcfs, sjf.
    #[arg(long, default_value = "fcfs")]
    pub scheduler: blis_replay::SchedulerPolicy,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,

    /// Probability of HTTP 500.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_500_rate: f64,
    /// Probability of HTTP 503.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_503_rate: f64,
    /// Probability of HTTP 429 (with Retry-After).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_429_rate: f64,
    /// Retry-After of injected 429s, seconds.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1)]
    pub retry_after_s: u32,
    /// Probability of a connection dropped mid-stream.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_drop_rate: f64,
    /// Probability of a stall mid-stream.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_stall_rate: f64,
    /// Stall length, ms.
    #[arg(allow_negative_numbers = true, long, default_value_t = 2000)]
    pub fault_stall_ms: u64,
    /// Probability of a malformed JSON chunk.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_malformed_rate: f64,
    /// Probability of a response without usage.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0.0)]
    pub fault_missing_usage_rate: f64,
    /// Requests waiting (accepted, not yet running) at most; beyond it a
    /// request gets HTTP 503 with Retry-After (SGLang's
    /// --max-queued-requests; vLLM queues without bound). 0: no bound.
    #[arg(long, default_value_t = 10_000)]
    pub max_queued_requests: u64,
    /// Keep every completed request's served timings in memory
    /// ([`crate::server::ServedLog`]), for tests that check a client's
    /// measurements against what the server did.
    #[arg(long, hide = true)]
    pub record_served: bool,
    /// Write every completed request's timings as a JSON line to FILE (the
    /// truth a client's measurements are compared with): `x_request_id`,
    /// `received_unix_us` (its handler started), `first_token_unix_us` and
    /// `last_token_unix_us` (their chunks handed to the connection),
    /// `output_tokens`, `chunks`. Buffered; written out when the server
    /// stops (SIGINT/SIGTERM).
    #[arg(long, value_name = "FILE")]
    pub served_log: Option<std::path::PathBuf>,
    /// Scripted mode: answer non-streamed requests with the canned
    /// completions of FILE, in turn (JSON lines, each a string or
    /// `{"content": ...}`), with the engine's timing: an offline stand-in
    /// for the LLM of an evolutionary search (OpenEvolve, GEPA).
    #[arg(long, value_name = "FILE")]
    pub script: Option<std::path::PathBuf>,
}

impl Opts {
    /// The server these flags describe.
    pub fn config(&self) -> crate::MockConfig {
        let mut engine = blis_replay::setup::ServerArgs {
            model: Some(self.model.clone()),
            latency: self.latency_model.map(LatencyChoice::kind),
            coefficients: self.coefficients.clone(),
            model_config: self.model_config.clone(),
            hardware: self.hardware.clone(),
            tp: self.tp,
            scheduler: self.scheduler,
            prefix_caching: !self.no_prefix_caching,
            fast_forward: false,
            ..blis_replay::setup::ServerArgs::default()
        };
        self.engine.apply(&mut engine);
        crate::MockConfig {
            addr: std::net::SocketAddr::new(self.host, self.port),
            model: self.model.clone(),
            api_key: self.api_key.clone(),
            startup_delay: std::time::Duration::from_millis(self.startup_delay_ms),
            time_scale: self.time_scale,
            metrics_style: self.metrics_style.into(),
            output_dist: self.output_dist,
            seed: self.seed,
            engine,
            faults: crate::faults::FaultConfig {
                http_500: self.fault_500_rate,
                http_503: self.fault_503_rate,
                http_429: self.fault_429_rate,
                retry_after_s: self.retry_after_s,
                drop: self.fault_drop_rate,
                stall: self.fault_stall_rate,
                stall_ms: self.fault_stall_ms,
                malformed: self.fault_malformed_rate,
                missing_usage: self.fault_missing_usage_rate,
            },
            record_served: self.record_served,
            served_log: self.served_log.clone(),
            max_queued_requests: self.max_queued_requests,
            script: self.script.clone(),
        }
    }
}

/// `--metrics-style` ([`MetricsStyle`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsStyleArg {
    /// `vllm:` names.
    Vllm,
    /// `sglang:` names.
    Sglang,
}

impl From<MetricsStyleArg> for MetricsStyle {
    fn from(a: MetricsStyleArg) -> Self {
        match a {
            MetricsStyleArg::Vllm => Self::Vllm,
            MetricsStyleArg::Sglang => Self::Sglang,
        }
    }
}
