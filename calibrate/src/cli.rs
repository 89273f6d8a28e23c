//! Command-line options (clap), kept in the library so tests can build them
//! with `Opts::parse_from`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Say how far to trust the simulator: compare traces, fit coefficients.
#[derive(Parser, Debug, Clone)]
#[command(name = "blis-calibrate", version, about, long_about = None)]
pub struct Opts {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Compare two traces of the same requests (real vs predicted, or real
    /// vs real for the noise floor).
    #[command(after_help = "Examples:\n  \
        blis-calibrate compare --real out/real.yaml --sim out/sim.yaml --out out/report --html\n  \
        blis-calibrate compare --real a.yaml --sim b.yaml --out r --warmup 50 --slo ttft_ms=500,tpot_ms=50\n\n\
        Writes REPORT.json (schema v1, times in ms), REPORT.md (also printed) and, with --html, REPORT.html.")]
    Compare(CompareArgs),
    /// Fit latency coefficients to real traces by replaying them.
    #[command(after_help = "Examples:\n  \
        blis-calibrate fit --trace out/real.yaml --model meta-llama/Llama-3.1-8B-Instruct --out coeffs.yaml\n  \
        blis-calibrate fit --trace a.yaml --trace b.yaml --latency-model roofline --out coeffs.yaml --budget-evals 300\n  \
        blis-calibrate fit --runs ../shared/vllm-ground-truth/train --latency-model trained-physics --out coeffs.yaml")]
    Fit(FitArgs),
    /// How accurate is the simulator on real runs it was not fitted on:
    /// each run of a folder predicted by a fit on the other runs
    /// (leave-one-run-out) or on another folder's runs.
    #[command(after_help = "Examples:\n  \
        blis-calibrate benchmark ../shared/vllm-ground-truth/train --out docs/accuracy\n  \
        blis-calibrate benchmark ../shared/vllm-ground-truth/train --folds model --out docs/accuracy-models\n  \
        blis-calibrate benchmark runs/test --fit-on runs/train --out out/accuracy\n  \
        blis-calibrate benchmark ../shared/vllm-ground-truth/train --latency-model blis-physics --out out/blis\n\n\
        Writes PREFIX.md (the table) and PREFIX.json ({\"latency_model\", \"summary\", \"runs\": [...]}, times in ms).")]
    Benchmark(BenchmarkArgs),
}

/// `benchmark` options.
#[derive(Args, Debug, Clone)]
pub struct BenchmarkArgs {
    /// Folder of runs (one sub-folder per run, as vllm-ground-truth/train).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Output prefix: PREFIX.md and PREFIX.json.
    #[arg(long, value_name = "PREFIX", value_parser = blis_traces::bundle::output_prefix)]
    pub out: PathBuf,
    /// Fit once on this folder's runs (blackbox: on its runs of the same
    /// model) instead of leave-one-run-out within DIR.
    #[arg(long, value_name = "DIR2")]
    pub fit_on: Option<PathBuf>,
    /// The latency model: trained-physics (joint fits), blackbox (fits per
    /// model), blis-physics or roofline (nothing fitted).
    #[arg(long, value_enum, default_value = "trained-physics")]
    pub latency_model: blis_replay::commands::cli::LatencyChoice,
    /// Replays allowed to each fit (trained-physics: replays of every run
    /// fitted on; default 40; blackbox: of each run, default 300).
    #[arg(allow_negative_numbers = true, long)]
    pub budget_evals: Option<u64>,
    /// How the trained-physics fits run.
    #[command(flatten)]
    pub joint: JointFitFlags,
    /// vLLM's --async-scheduling for every replay (default: on for
    /// trained-physics, as it is fitted; else the trace header's, else off).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub async_scheduling: Option<bool>,
    /// What a trained-physics fit leaves out: `run` (each run predicted by
    /// a fit on every other run, of every model) or `model` (each run
    /// predicted by a fit on the runs of every *other* model: how a model
    /// never fitted is predicted).
    #[arg(long, value_enum, default_value = "run")]
    pub folds: FoldsArg,
}

/// `--folds` ([`Folds`](crate::benchmark::Folds)).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldsArg {
    /// Leave one run out.
    Run,
    /// Leave one model out.
    Model,
}

impl From<FoldsArg> for crate::benchmark::Folds {
    fn from(a: FoldsArg) -> Self {
        match a {
            FoldsArg::Run => Self::Run,
            FoldsArg::Model => Self::Model,
        }
    }
}

/// How a trained-physics joint fit runs (`fit` and `benchmark`).
#[derive(Args, Debug, Clone)]
pub struct JointFitFlags {
    /// Runs replayed in parallel by a trained-physics fit (0: one per
    /// core; the result is the same).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub threads: usize,
    /// Weight of an overloaded run (real mean TTFT above 10 s) in a
    /// trained-physics fit's loss, relative to 1 for the others.
    #[arg(allow_negative_numbers = true, long, default_value_t = crate::joint::OVERLOADED_WEIGHT)]
    pub overloaded_weight: f64,
}

impl JointFitFlags {
    /// The joint fit's options with `budget` replays.
    ///
    /// # Errors
    /// A weight that is not a number ≥ 0.
    pub fn options(&self, budget: u64) -> Result<crate::joint::JointOptions, crate::fit::FitError> {
        let o = crate::joint::JointOptions {
            budget,
            threads: if self.threads > 0 {
                self.threads
            } else {
                std::thread::available_parallelism().map_or(1, usize::from)
            },
            overloaded_weight: self.overloaded_weight,
        };
        o.validate()?;
        Ok(o)
    }
}

/// `compare` options.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The real trace (header YAML, or KIND:PATH of a public trace such as
    /// vllm-gt:RUN_DIR).
    #[arg(long, value_name = "A.yaml")]
    pub real: PathBuf,
    /// The simulated (or second real) trace.
    #[arg(long, value_name = "B.yaml")]
    pub sim: PathBuf,
    /// Output prefix: REPORT.json, REPORT.md, REPORT.html.
    #[arg(long, value_name = "REPORT", value_parser = blis_traces::bundle::output_prefix)]
    pub out: PathBuf,
    /// Leading requests to leave out (default: the real header's).
    #[arg(allow_negative_numbers = true, long)]
    pub warmup: Option<u64>,
    /// Round trip added to simulated TTFT and E2E, ms (default: the real
    /// header's measured RTT).
    #[arg(allow_negative_numbers = true, long)]
    pub rtt_ms: Option<f64>,
    /// SLOs for goodput and attainment: ttft_ms=..,tpot_ms=..,e2e_ms=..
    #[arg(long)]
    pub slo: Option<String>,
    /// Also write a self-contained HTML report with plots.
    #[arg(long)]
    pub html: bool,
    /// What the real side is, stated at the top of the report (e.g. "the
    /// bundled mock server, whose timing is this simulator's: a plumbing
    /// check, not accuracy").
    #[arg(long, value_name = "TEXT")]
    pub real_label: Option<String>,
    /// Bootstrap resamples.
    #[arg(allow_negative_numbers = true, long, default_value_t = crate::compare::CompareOptions::DEFAULT_RESAMPLES)]
    pub resamples: usize,
    /// Bootstrap seed.
    #[arg(allow_negative_numbers = true, long, default_value_t = crate::compare::CompareOptions::DEFAULT_SEED)]
    pub seed: u64,
    /// Threads for the bootstrap (0: one per core; the result is the same).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub threads: usize,
}

/// `fit` options.
#[derive(Args, Debug, Clone)]
pub struct FitArgs {
    /// Real traces to fit on (jointly): header YAMLs, or KIND:PATH of public
    /// traces such as vllm-gt:RUN_DIR (`--trace A --trace B` or
    /// `--traces A B`).
    #[arg(
        long = "trace",
        alias = "traces",
        value_name = "REAL.yaml",
        num_args = 1..,
        required_unless_present = "runs"
    )]
    pub traces: Vec<PathBuf>,
    /// A folder of runs to fit on as well: each sub-folder a vLLM
    /// ground-truth run, each *.yaml a trace header.
    #[arg(long, value_name = "DIR")]
    pub runs: Option<PathBuf>,
    /// Model id (default: the first trace header's).
    #[arg(long)]
    pub model: Option<String>,
    /// Latency model to fit (default: trained-physics with --runs, else
    /// blackbox). trained-physics coefficients are global: one row for
    /// every model (`model: "*"`), fitted on every run at once.
    #[arg(long, value_enum)]
    pub latency_model: Option<blis_replay::commands::cli::LatencyChoice>,
    /// Output coefficients file (the format blis-replay and blis-mockserver
    /// read).
    #[arg(long, value_name = "COEFFS.yaml")]
    pub out: PathBuf,
    /// Fraction of each trace (by arrival time, the end) held out
    /// (default: 0.3; trained-physics: 0, every request of every run).
    #[arg(allow_negative_numbers = true, long)]
    pub holdout_fraction: Option<f64>,
    /// Replays allowed to the optimiser (trained-physics: replays of every
    /// run at once; default 40; the others: default 400, of which what the
    /// first search leaves goes to searches from kicked points).
    #[arg(allow_negative_numbers = true, long)]
    pub budget_evals: Option<u64>,
    /// How a trained-physics fit runs.
    #[command(flatten)]
    pub joint: JointFitFlags,
    /// GPU name for the coefficients row (default: the trace header's, else
    /// H100).
    #[arg(long)]
    pub hardware: Option<String>,
    /// Starting coefficients (default: the bundled row, else a generic
    /// start).
    #[arg(long)]
    pub coefficients: Option<PathBuf>,
    /// The model's HF config.json (a folder or the file) for the physics
    /// terms of trained-physics and roofline (default: the bundled config
    /// matching the model id).
    #[arg(long, value_name = "DIR_OR_FILE", alias = "model-config-folder")]
    pub model_config: Option<PathBuf>,
    /// A hardware_config.json with the GPU (or CPU) named by --hardware
    /// (default: the bundled one).
    #[arg(long, value_name = "FILE")]
    pub hardware_config: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The server's limits where the trace header lacks them (vLLM's
    /// flag names; llama.cpp: slots as max_num_seqs, its batch size as the
    /// token budget).
    #[command(flatten)]
    pub engine: blis_replay::commands::cli::EngineFlags,
}
