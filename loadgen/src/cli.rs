//! Command-line options (clap), kept in the library so tests can build them
//! with `Opts::parse_from`.

use std::path::PathBuf;

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
    /// sending anything, and print a summary.
    #[command(after_help = "Examples:\n  \
        blis-loadgen generate --workload-spec examples/chat.yaml --out out/chat\n  \
        blis-loadgen generate --import mooncake:conversation_trace.jsonl --out out/mooncake\n  \
        blis-loadgen generate --workload-spec w.yaml --seed 7 --horizon-s 60 --out out/w")]
    Generate(GenerateArgs),
}

/// Where a workload comes from: exactly one of a spec or an import.
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
}

/// `generate` options.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Output prefix: writes PREFIX.yaml and PREFIX.csv.
    #[arg(long, value_name = "PREFIX")]
    pub out: PathBuf,
    /// Seed (overrides the spec's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop generating at this many seconds (overrides the spec's horizon).
    #[arg(long, value_name = "S")]
    pub horizon_s: Option<f64>,
    /// Stop after this many requests (overrides the spec's num_requests).
    #[arg(long, value_name = "N")]
    pub num_requests: Option<u64>,
}
