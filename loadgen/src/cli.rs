//! Command-line options (clap), kept in the library so tests can build them
//! with `Opts::parse_from`.

use std::path::PathBuf;

use crate::options::{self, Shard};
use blis_traces::ImportSource;
use clap::{Args, Parser, Subcommand};

/// Observe an OpenAI-compatible LLM server under a realistic workload.
#[derive(Parser, Debug, Clone)]
#[command(name = "blis-loadgen", version, about, long_about = None)]
pub struct Opts {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Write the planned trace of a workload (`mode: generated`) without
    /// sending anything, and print a summary. An imported real run (e.g.
    /// vllm-gt:RUN_DIR) keeps only its plan; with --keep-measured, what it
    /// measured too (`mode: real`).
    #[command(after_help = "Examples:\n  \
        blis-loadgen generate --workload-spec examples/chat.yaml --out out/chat\n  \
        blis-loadgen generate --import mooncake:conversation_trace.jsonl --out out/mooncake\n  \
        blis-loadgen generate --workload-spec w.yaml --seed 7 --horizon-s 60 --out out/w\n  \
        blis-loadgen generate --import vllm-gt:RUN_DIR --keep-measured --out out/run   (a real run as trace v2, with its times)")]
    Generate(Box<GenerateArgs>),
    /// Send a workload to an OpenAI-compatible server on its exact schedule,
    /// record every request and streamed chunk, scrape /metrics, and write a
    /// trace (`mode: real`).
    #[command(after_help = "Examples:\n  \
        blis-loadgen run --server-url http://127.0.0.1:8000 --model meta-llama/Llama-3.1-8B-Instruct \\\n      \
            --workload-spec examples/servegen-language.yaml --out out/real\n  \
        blis-loadgen run --server-url http://127.0.0.1:8000 --model m --rate 20 --num-requests 1000 \\\n      \
            --input-tokens gaussian:512,128 --output-tokens 128 --out out/synthetic\n  \
        blis-loadgen run --server-url http://127.0.0.1:8000 --model m --trace out/real.yaml --out out/again\n\n\
        Exit codes: 0 valid run; 1 error; 2 usage; 3 client-bound with --strict; 4 interrupted; 5 failed (more requests failed than --max-error-rate allows).")]
    Run(Box<RunArgs>),
    /// Say what a recorded trace holds against what its run planned: for a
    /// run that was killed (kill -9, power loss) or interrupted, the rows on
    /// disk, the planned requests without one (as id ranges), and whether
    /// its writer finished. A partly written last line is dropped with a
    /// warning.
    #[command(after_help = "Examples:\n  \
        blis-loadgen check out/real\n  \
        blis-loadgen check out/real.yaml --json\n\n\
        Exit codes: 0 complete; 1 error (unreadable); 6 incomplete (cut off, or planned requests missing).")]
    Check(CheckArgs),
    /// Join the traces of a sharded run (`run --shard I/N` on N processes or
    /// machines) into one: rows joined by request id and re-based to one
    /// clock (each part's measured clock offset), chunks with their rows,
    /// metric samples kept per part (label `shard`). Refuses parts of
    /// different plans, repeated or missing parts.
    #[command(after_help = "Examples:\n  \
        blis-loadgen merge out/part-0 out/part-1 out/part-2 out/part-3 --out out/run\n  \
        blis-loadgen merge out/part-*.yaml --out out/run")]
    Merge(MergeArgs),
    /// Write a recorded trace in a peer's format: `aiperf`, AIPerf's
    /// per-request `profile_export.jsonl`; `guidellm`, guidellm's
    /// `benchmarks.json` report; `inference-perf`, inference-perf's report
    /// folder (summary, stage and per-request lifecycle metrics).
    #[command(after_help = "Examples:\n  \
        blis-loadgen export out/real --format aiperf --out out/profile_export.jsonl\n  \
        blis-loadgen export out/real --format guidellm --out out/benchmarks.json\n  \
        blis-loadgen export out/real --format inference-perf --out out/inference-perf")]
    Export(ExportArgs),
}

/// `blis-loadgen export`.
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// The trace: its header YAML or its prefix.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// The format.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// The file to write (a folder for `inference-perf`).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
}

/// Formats of `blis-loadgen export`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// AIPerf's `profile_export.jsonl` (per-request records).
    Aiperf,
    /// guidellm's `benchmarks.json` report.
    Guidellm,
    /// inference-perf's report folder.
    InferencePerf,
}

impl From<ExportFormat> for crate::export::ExportFormat {
    fn from(f: ExportFormat) -> Self {
        match f {
            ExportFormat::Aiperf => Self::Aiperf,
            ExportFormat::Guidellm => Self::Guidellm,
            ExportFormat::InferencePerf => Self::InferencePerf,
        }
    }
}

/// `blis-loadgen merge`.
#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// The parts: their header YAMLs or prefixes.
    #[arg(value_name = "PART", required = true, num_args = 1..)]
    pub parts: Vec<PathBuf>,
    /// Prefix of the merged trace.
    #[arg(long, value_name = "PREFIX", value_parser = blis_traces::bundle::output_prefix)]
    pub out: PathBuf,
}

/// `blis-loadgen check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The trace: its header YAML or its prefix.
    #[arg(value_name = "PREFIX")]
    pub trace: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Where a workload comes from: exactly one of a spec, an import, a trace,
/// or a synthetic rate.
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct WorkloadArgs {
    /// Workload spec YAML (clients, arrivals, length distributions).
    #[arg(long, value_name = "W.yaml")]
    pub workload_spec: Option<PathBuf>,
    /// Import a public trace: mooncake:FILE, azure:FILE,
    /// inference-perf:PROFILE, vllm-gt:RUN_DIR.
    #[arg(long, value_name = "KIND:PATH")]
    pub import: Option<ImportSource>,
    /// The requests of a trace (its planned arrivals and lengths).
    #[arg(long, value_name = "H.yaml")]
    pub trace: Option<PathBuf>,
    /// A synthetic workload at this many requests/s (with --num-requests
    /// or --duration-s, --input-tokens, --output-tokens, --arrival); `inf`:
    /// every request at the start (with --num-requests), as `vllm bench
    /// serve`'s default, bounded by --max-in-flight if given.
    #[arg(allow_negative_numbers = true, long, value_name = "R")]
    pub rate: Option<f64>,
}

/// Lengths of a synthetic `--rate` workload.
#[derive(Args, Debug, Clone)]
pub struct SyntheticArgs {
    /// Input tokens of a --rate workload: N, gaussian:MEAN,STD,
    /// exponential:MEAN or uniform:A,B [default: 512].
    #[arg(allow_negative_numbers = true, long)]
    pub input_tokens: Option<String>,
    /// Output tokens of a --rate workload: same forms as --input-tokens
    /// [default: 128].
    #[arg(allow_negative_numbers = true, long)]
    pub output_tokens: Option<String>,
    /// Inter-arrival gaps of a --rate workload [default: poisson].
    #[arg(long, value_enum)]
    pub arrival: Option<ArrivalArg>,
    /// Gamma-distributed gaps of a --rate workload with this shape, as
    /// `vllm bench serve --burstiness`: 1 is Poisson, below 1 burstier,
    /// above 1 more even (coefficient of variation 1/√F); the rate is kept.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "F",
        conflicts_with = "arrival"
    )]
    pub burstiness: Option<f64>,
}

/// Inter-arrival gaps of a synthetic `--rate` workload.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalArg {
    /// Exponential gaps (a Poisson process), as `vllm bench serve` by default.
    Poisson,
    /// Every gap 1/rate: a fixed schedule, as `oha -q` and guidellm's
    /// `constant` profile.
    Constant,
}

/// `generate` options.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Lengths of a --rate workload.
    #[command(flatten)]
    pub synthetic: SyntheticArgs,
    /// Output prefix: writes PREFIX.yaml and PREFIX.csv.
    #[arg(long, value_name = "PREFIX", value_parser = blis_traces::bundle::output_prefix)]
    pub out: PathBuf,
    /// Seed (overrides the spec's).
    #[arg(allow_negative_numbers = true, long)]
    pub seed: Option<u64>,
    /// Stop generating at this many seconds (overrides the spec's horizon).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub horizon_s: Option<f64>,
    /// Stop after this many requests (overrides the spec's num_requests).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub num_requests: Option<u64>,
    /// A workload spec's total rate, requests/s (replaces its
    /// `aggregate_rate`, or a ServeGen spec's `servegen_data.aggregate_rate`
    /// and `rate_scale`).
    #[arg(allow_negative_numbers = true, long, value_name = "R")]
    pub aggregate_rate: Option<f64>,
    /// Keep what an imported real run measured (send, first and last chunk
    /// times, statuses, cached tokens): write it as a real trace
    /// (`mode: real`) that `blis-calibrate compare --real` and `fit` read,
    /// instead of its plan (`mode: generated`, outcomes dropped: the
    /// default, for sending it again).
    #[arg(long)]
    pub keep_measured: bool,
}

/// `run` options.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8000.
    #[arg(long, env = "BLIS_SERVER_URL")]
    pub server_url: String,
    /// Model name to send.
    #[arg(long)]
    pub model: String,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Lengths of a --rate workload.
    #[command(flatten)]
    pub synthetic: SyntheticArgs,
    /// Output prefix: PREFIX.yaml, .csv, .itl.csv, .metrics.csv.
    #[arg(long, value_name = "PREFIX", value_parser = blis_traces::bundle::output_prefix)]
    pub out: PathBuf,
    /// API to use [default: chat when --server-url ends in
    /// /v1/chat/completions, else completions]
    #[arg(long, value_enum)]
    pub api: Option<ApiArg>,
    /// Server family.
    #[arg(long, value_enum, default_value = "vllm")]
    pub server_type: ServerTypeArg,
    /// Ask for whole responses instead of streams (overrides the workload).
    #[arg(long)]
    pub no_stream: bool,
    /// Closed loop: N users, each sending its next request when its last
    /// response ends (arrival times are ignored).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub concurrency: Option<usize>,
    /// Requests in flight at most (open loop; later sends wait and their
    /// lag is recorded).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub max_in_flight: Option<usize>,
    /// Client timeout per request, seconds.
    #[arg(allow_negative_numbers = true, long, default_value_t = options::RunOptions::DEFAULT_TIMEOUT_S)]
    pub timeout_s: f64,
    /// Wait up to this many seconds for a server that is still starting
    /// (connection refused, or HTTP 503 from /v1/models or /health) before
    /// the run, as `vllm bench serve --ready-check-timeout-sec` does (0: a
    /// refused connection is an error at once; a 503 is waited on for 60 s)
    #[arg(
        allow_negative_numbers = true,
        long,
        default_value_t = 0.0,
        value_name = "S"
    )]
    pub wait_for_server_s: f64,
    /// Leading requests marked as warm-up (excluded from statistics).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub warmup_requests: u64,
    /// Stop sending after this many seconds.
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub duration_s: Option<f64>,
    /// Stop after this many requests.
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub num_requests: Option<u64>,
    /// A workload spec's total rate, requests/s (replaces its
    /// `aggregate_rate`, or a ServeGen spec's `servegen_data.aggregate_rate`
    /// and `rate_scale`).
    #[arg(allow_negative_numbers = true, long, value_name = "R")]
    pub aggregate_rate: Option<f64>,
    /// Seed of the workload and the prompt texts.
    #[arg(allow_negative_numbers = true, long)]
    pub seed: Option<u64>,
    /// API key sent as a Bearer token (never written anywhere).
    #[arg(long, env = "BLIS_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Prometheus endpoint (default: SERVER_URL/metrics).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Scrape interval, ms (0: no scraping).
    #[arg(allow_negative_numbers = true, long, default_value_t = options::RunOptions::DEFAULT_SCRAPE_INTERVAL_MS)]
    pub scrape_interval_ms: u64,
    /// Client-bound when the p99 send lag exceeds this, ms. An open loop
    /// this far behind starts a request only when one ends.
    #[arg(allow_negative_numbers = true, long, default_value_t = options::RunOptions::DEFAULT_MAX_SEND_LAG_MS)]
    pub max_send_lag_ms: f64,
    /// Exit with code 3 when the run was client-bound.
    #[arg(long)]
    pub strict: bool,
    /// The run failed (verdict `failed`, exit code 5) when more than this
    /// share of the requests that got an answer failed, or all of them did.
    #[arg(
        allow_negative_numbers = true,
        long,
        default_value_t = options::RunOptions::DEFAULT_MAX_ERROR_RATE,
        value_name = "FRACTION"
    )]
    pub max_error_rate: f64,
    /// Open loop: stop sending when the client itself falls this far behind
    /// its schedule, seconds (it cannot keep up: the rest of the plan
    /// becomes not-sent rows and the verdict `client-bound`, instead of a
    /// run that takes several times its length); 0 never stops.
    #[arg(
        allow_negative_numbers = true,
        long,
        default_value_t = options::RunOptions::DEFAULT_MAX_BEHIND_S,
        value_name = "S"
    )]
    pub max_behind_s: f64,
    /// On SIGINT/SIGTERM, wait this long for requests in flight, seconds.
    #[arg(allow_negative_numbers = true, long, default_value_t = options::RunOptions::DEFAULT_GRACE_S)]
    pub grace_s: f64,
    /// Goodput SLOs, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=10000 (or vLLM's
    /// `--goodput` form ttft:500,tpot:50,e2el:10000).
    #[arg(long)]
    pub slo: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Threads that send and receive (0: one per CPU core). When the server
    /// shares this machine, 1 leaves it more CPU.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub client_threads: usize,
    /// Send only part I of N of the plan (0 ≤ I < N): its units (a request,
    /// or a session's rounds) I, I + N, I + 2N, ... in send order, so that
    /// N processes, on N machines, send exactly the one-process schedule
    /// together. Join their traces with `blis-loadgen merge`.
    #[arg(long, value_name = "I/N", value_parser = Shard::parse)]
    pub shard: Option<Shard>,
    /// Start the schedule at this Unix time, seconds (fractions allowed),
    /// instead of 0.2 s from now: shards started with the same value start
    /// together (to their clocks' agreement).
    #[arg(allow_negative_numbers = true, long, value_name = "UNIX_TIME")]
    pub start_at: Option<f64>,
}

/// `--api` ([`options::Api`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiArg {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl From<ApiArg> for options::Api {
    fn from(a: ApiArg) -> Self {
        match a {
            ApiArg::Completions => Self::Completions,
            ApiArg::Chat => Self::Chat,
        }
    }
}

/// `--server-type` ([`options::ServerType`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTypeArg {
    /// vLLM: `max_tokens` with `ignore_eos` and `min_tokens`.
    Vllm,
    /// SGLang: `max_tokens` with `ignore_eos`.
    Sglang,
    /// llama.cpp's server: `max_tokens` with `ignore_eos`.
    Llamacpp,
    /// Any OpenAI-compatible server: `max_tokens` only.
    Openai,
}

impl From<ServerTypeArg> for options::ServerType {
    fn from(a: ServerTypeArg) -> Self {
        match a {
            ServerTypeArg::Vllm => Self::Vllm,
            ServerTypeArg::Sglang => Self::Sglang,
            ServerTypeArg::Llamacpp => Self::Llamacpp,
            ServerTypeArg::Openai => Self::Openai,
        }
    }
}

impl From<ArrivalArg> for options::Arrival {
    fn from(a: ArrivalArg) -> Self {
        match a {
            ArrivalArg::Poisson => Self::Poisson,
            ArrivalArg::Constant => Self::Constant,
        }
    }
}

impl From<WorkloadArgs> for options::WorkloadSource {
    fn from(a: WorkloadArgs) -> Self {
        options::WorkloadSource {
            workload_spec: a.workload_spec,
            import: a.import,
            trace: a.trace,
            rate: a.rate,
        }
    }
}

impl From<SyntheticArgs> for options::Synthetic {
    fn from(a: SyntheticArgs) -> Self {
        options::Synthetic {
            given: a.input_tokens.is_some()
                || a.output_tokens.is_some()
                || a.arrival.is_some()
                || a.burstiness.is_some(),
            input_tokens: a
                .input_tokens
                .unwrap_or_else(|| options::Synthetic::DEFAULT_INPUT_TOKENS.into()),
            output_tokens: a
                .output_tokens
                .unwrap_or_else(|| options::Synthetic::DEFAULT_OUTPUT_TOKENS.into()),
            arrival: a.arrival.unwrap_or(ArrivalArg::Poisson).into(),
            burstiness: a.burstiness,
        }
    }
}

impl From<GenerateArgs> for options::PlanOptions {
    fn from(a: GenerateArgs) -> Self {
        options::PlanOptions {
            workload: a.workload.into(),
            synthetic: a.synthetic.into(),
            out: a.out,
            seed: a.seed,
            horizon_s: a.horizon_s,
            num_requests: a.num_requests,
            aggregate_rate: a.aggregate_rate,
            keep_measured: a.keep_measured,
        }
    }
}

/// `--api` when not given: chat for a `--server-url` that names the chat
/// endpoint itself, else completions.
fn default_api(server_url: &str) -> ApiArg {
    if server_url
        .trim_end_matches('/')
        .ends_with("/v1/chat/completions")
    {
        ApiArg::Chat
    } else {
        ApiArg::Completions
    }
}

impl From<RunArgs> for options::RunOptions {
    fn from(a: RunArgs) -> Self {
        let api = a.api.unwrap_or_else(|| default_api(&a.server_url));
        options::RunOptions {
            server_url: a.server_url,
            model: a.model,
            workload: a.workload.into(),
            synthetic: a.synthetic.into(),
            out: a.out,
            api: api.into(),
            server_type: a.server_type.into(),
            no_stream: a.no_stream,
            concurrency: a.concurrency,
            max_in_flight: a.max_in_flight,
            timeout_s: a.timeout_s,
            wait_for_server_s: a.wait_for_server_s,
            warmup_requests: a.warmup_requests,
            duration_s: a.duration_s,
            num_requests: a.num_requests,
            aggregate_rate: a.aggregate_rate,
            seed: a.seed,
            api_key: a.api_key,
            metrics_url: a.metrics_url,
            scrape_interval_ms: a.scrape_interval_ms,
            max_send_lag_ms: a.max_send_lag_ms,
            strict: a.strict,
            max_error_rate: a.max_error_rate,
            max_behind_s: a.max_behind_s,
            grace_s: a.grace_s,
            slo: a.slo,
            json: a.json,
            client_threads: a.client_threads,
            shard: a.shard,
            start_at: a.start_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--server-url` naming the chat endpoint itself asks for the chat
    /// API unless `--api` says otherwise; any other URL, completions.
    #[test]
    fn a_chat_endpoint_url_chooses_the_chat_api() {
        let api = |url: &str, extra: &[&str]| {
            let mut v = vec!["blis-loadgen", "run", "--server-url", url];
            v.extend(["--model", "m", "--rate", "1", "--out", "o"]);
            v.extend(extra);
            match Opts::parse_from(v).command {
                Command::Run(a) => options::RunOptions::from(*a).api,
                _ => unreachable!("a run"),
            }
        };
        assert_eq!(
            api("http://h:1/v1/chat/completions", &[]),
            options::Api::Chat
        );
        assert_eq!(
            api("http://h:1/v1/chat/completions/", &[]),
            options::Api::Chat
        );
        assert_eq!(
            api("http://h:1/v1/chat/completions", &["--api", "completions"]),
            options::Api::Completions
        );
        assert_eq!(api("http://h:1/v1", &[]), options::Api::Completions);
        assert_eq!(api("http://h:1", &["--api", "chat"]), options::Api::Chat);
    }

    #[test]
    fn the_library_defaults_are_the_command_lines() {
        let opts = Opts::parse_from([
            "blis-loadgen",
            "run",
            "--server-url",
            "http://h:1",
            "--model",
            "m",
            "--workload-spec",
            "w.yaml",
            "--out",
            "o",
        ]);
        let Command::Run(args) = opts.command else {
            panic!("a run")
        };
        let parsed: options::RunOptions = (*args).into();
        let built = options::RunOptions::new(
            "http://h:1",
            "m",
            options::WorkloadSource {
                workload_spec: Some("w.yaml".into()),
                ..Default::default()
            },
            "o".into(),
        );
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
    }
}
