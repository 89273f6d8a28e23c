//! Command-line options of `blis-replay` (clap), in the library so tests can
//! build them with `Opts::parse_from`.

use std::path::PathBuf;

use blis_traces::ImportSource;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::cluster::PolicyBundle;
use crate::cluster::admission::AdmissionPolicy;
use crate::cluster::priority::PriorityPolicy;
use crate::cluster::routing::{self, RoutingPolicy};
use crate::commands::{CommandError, Result};
use crate::error::ReplayError;

/// The longest `--sample-interval-ms`: 2^53 µs (285 years) in ms (beyond
/// it the interval in µs overflowed to a negative one, and the sampler
/// never ended).
pub const MAX_SAMPLE_INTERVAL_MS: u64 = (1 << 53) / 1000;

/// Predict how a vLLM-style server serves a workload, request by request.
#[derive(Parser, Debug, Clone)]
#[command(name = "blis-replay", version, about, long_about = None)]
pub struct Opts {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Replay a trace, a workload spec or an imported trace on one simulated
    /// instance (or a cluster: --num-instances, --routing, --admission,
    /// --policy-config) and write the predicted trace.
    #[command(after_help = "Examples:\n  \
        blis-replay run --trace out/real.yaml --out out/pred\n  \
        blis-replay run --import vllm-gt:../shared/vllm-ground-truth/train/20260217-155451-llama-2-7b-tp1-codegen \\\n      \
            --latency-model roofline --hardware H100 --out out/gt-7b\n  \
        blis-replay run --workload-spec examples/servegen-language.yaml --model meta-llama/Llama-3.1-8B-Instruct \\\n      \
            --max-num-seqs 128 --max-num-batched-tokens 2048 --out out/sg\n\n\
        Outputs: PREFIX.yaml/.csv (mode: replayed), PREFIX.itl.csv + PREFIX.steps.csv (per-token times in step form;\n\
        --itl-rows: one row per token),\n\
        PREFIX.metrics.csv (vLLM-named time series), PREFIX.summary.json.")]
    Run(RunArgs),
    /// Evaluate a cluster policy bundle on a workload over several seeds:
    /// one JSON object with the fitness, the metrics and a short text
    /// summary (the contract of an OpenEvolve evaluator or a GEPA adapter).
    #[command(after_help = "Example:\n  \
        blis-replay evaluate --policy-config examples/policy_search/prefix-affinity.yaml \\\n      \
            --workload-spec examples/policy_search/shared-prefixes.yaml --seeds 1,2,3 \\\n      \
            --fitness-weights throughput:0.3,p99_ttft:0.4,mean_e2e:0.3")]
    Evaluate(EvaluateArgs),
    /// Compare runs side by side (routing policies, cluster sizes, latency
    /// models): one table of latency percentiles, throughput, SLO
    /// attainment, prefix-cache hits, routing balance and cost from their
    /// summaries, the best of each row marked.
    #[command(after_help = "Example:\n  \
        blis-replay run --workload-spec examples/policy_search/shared-prefixes.yaml --num-instances 4 \\\n      \
            --routing round-robin --model meta-llama/Llama-3.1-8B-Instruct --out out/rr\n  \
        blis-replay run --workload-spec examples/policy_search/shared-prefixes.yaml --num-instances 4 \\\n      \
            --routing weighted --model meta-llama/Llama-3.1-8B-Instruct --out out/weighted\n  \
        blis-replay compare out/rr out/weighted")]
    Compare(CompareArgs),
    /// Writes the ITL companion of a replayed trace as BLIS does, one row
    /// per token (`request_id,chunk_index,timestamp_us`), from its step
    /// form: the rows `run --itl-rows` would have written, byte for byte.
    #[command(after_help = "Example:\n  \
        blis-replay expand-itl --trace out/pred.yaml --out out/pred.rows.itl.csv")]
    ExpandItl(ExpandItlArgs),
}

/// A server's batch and KV-cache limits under vLLM's flag names; each
/// unset one comes from the trace header, the coefficients row or the
/// defaults. Shared by `blis-replay run`, `blis-mockserver` and
/// `blis-calibrate fit`.
#[derive(Args, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineFlags {
    /// The serving engine to simulate: vllm, sglang and openai share vLLM's
    /// scheduler; llamacpp is llama.cpp's llama-server (parallel slots
    /// from max_num_seqs, each with its own context, prompts in n_batch
    /// chunks, no async scheduling; a step-table row of the server by
    /// default). Default: the trace header's, else vllm.
    #[arg(long, value_enum)]
    pub server_type: Option<ServerKind>,
    /// Running requests at most (vLLM --max-num-seqs).
    #[arg(allow_negative_numbers = true, long, alias = "max-num-running-reqs")]
    pub max_num_seqs: Option<u32>,
    /// Token budget per step (vLLM --max-num-batched-tokens).
    #[arg(
        allow_negative_numbers = true,
        long,
        alias = "max-num-scheduled-tokens"
    )]
    pub max_num_batched_tokens: Option<u32>,
    /// Tokens per KV block (vLLM --block-size).
    #[arg(allow_negative_numbers = true, long, alias = "block-size-in-tokens")]
    pub block_size: Option<u32>,
    /// GPU KV blocks (default: trace header, coefficients row, or estimated
    /// from GPU memory, utilisation and the model's weights).
    #[arg(allow_negative_numbers = true, long)]
    pub total_kv_blocks: Option<u32>,
    /// Prefill tokens per request per step at most (0: off).
    #[arg(allow_negative_numbers = true, long)]
    pub long_prefill_token_threshold: Option<u32>,
    /// Prompt + output tokens at most (default: the context length of the
    /// model's config, as vLLM; 0: unlimited).
    #[arg(allow_negative_numbers = true, long)]
    pub max_model_len: Option<u32>,
    /// vLLM's --async-scheduling: a request arriving during a step joins
    /// the step after the next one (default: the trace header's, else the
    /// default of the vLLM version it names (on from v0.14.0), else the
    /// coefficients row's, else off).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub async_scheduling: Option<bool>,
    /// vLLM's --enable-chunked-prefill: a prompt is computed a chunk per
    /// step within the token budget; false: whole prompts only (default:
    /// the trace header's, else on, as vLLM V1).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_chunked_prefill: Option<bool>,
}

/// The serving engines `--server-type` names.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// vLLM.
    Vllm,
    /// SGLang (simulated with vLLM's scheduler).
    Sglang,
    /// llama.cpp's llama-server.
    Llamacpp,
    /// Any other OpenAI-compatible server (simulated as vLLM).
    Openai,
}

impl ServerKind {
    /// The name written in trace headers.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Vllm => "vllm",
            ServerKind::Sglang => "sglang",
            ServerKind::Llamacpp => "llamacpp",
            ServerKind::Openai => "openai",
        }
    }
}

impl EngineFlags {
    /// Refuses the limits given here that no model, trace or server could
    /// make valid: a `max_num_seqs`, `max_num_batched_tokens` or
    /// `block_size` of 0, a `block_size` above
    /// [`crate::setup::MAX_BLOCK_SIZE`], a `total_kv_blocks` of 0. (The
    /// server's settings are checked whole when they are resolved; this is
    /// for a caller that takes the flags long before, e.g. a loop that
    /// observes a server first.)
    ///
    /// # Errors
    /// The setting, as resolving the server would name it.
    pub fn check(&self) -> Result<(), crate::setup::SettingsError> {
        use crate::setup::{MAX_BLOCK_SIZE, SettingsError};
        if [
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.block_size,
        ]
        .contains(&Some(0))
        {
            return Err(SettingsError::ZeroLimits);
        }
        if let Some(block_size) = self.block_size.filter(|&b| b > MAX_BLOCK_SIZE) {
            return Err(SettingsError::BlockSizeTooLarge {
                block_size,
                max: MAX_BLOCK_SIZE,
            });
        }
        if self.total_kv_blocks == Some(0) {
            return Err(SettingsError::NoKvBlocks("0 (--total-kv-blocks)".into()));
        }
        Ok(())
    }

    /// Sets the limits given here on `a`, keeping its others.
    pub fn apply(&self, a: &mut crate::setup::ServerArgs) {
        a.max_num_seqs = self.max_num_seqs.or(a.max_num_seqs);
        a.max_num_batched_tokens = self.max_num_batched_tokens.or(a.max_num_batched_tokens);
        a.block_size = self.block_size.or(a.block_size);
        a.total_kv_blocks = self.total_kv_blocks.or(a.total_kv_blocks);
        a.long_prefill_token_threshold = self
            .long_prefill_token_threshold
            .or(a.long_prefill_token_threshold);
        a.max_model_len = self.max_model_len.or(a.max_model_len);
        a.async_scheduling = self.async_scheduling.or(a.async_scheduling);
        a.chunked_prefill = self.enable_chunked_prefill.or(a.chunked_prefill);
        if let Some(k) = self.server_type {
            a.server_type = Some(k.name().to_string());
        }
    }
}

/// `expand-itl` options.
#[derive(Args, Debug, Clone)]
pub struct ExpandItlArgs {
    /// The replayed trace's header (`PREFIX.yaml`).
    #[arg(long, value_name = "H.yaml")]
    pub trace: PathBuf,
    /// Where to write the rows.
    #[arg(long, value_name = "FILE.csv")]
    pub out: PathBuf,
}

/// `evaluate` options.
#[derive(Args, Debug, Clone)]
pub struct EvaluateArgs {
    /// Workload seeds to evaluate on (the fitness is their mean).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// The workload, server and cluster settings, as for `run` (no --out).
    #[command(flatten)]
    pub run: RunArgs,
}

/// `compare` options ([`crate::commands::compare`]).
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The runs: their summaries (`PREFIX.summary.json`) or output prefixes
    /// (`PREFIX`, as given to `run --out`).
    #[arg(num_args = 0.., value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Instead of runs: policy bundles to run on the one workload the flags
    /// below give (`--workload-spec`, `--trace` or `--import`, and the
    /// server flags of `run`), each in memory, then compared.
    #[arg(long, value_delimiter = ',', value_name = "A.yaml,B.yaml,...")]
    pub policies: Vec<PathBuf>,
    /// Column names, comma-separated (default: each run's prefix or each
    /// bundle's file name).
    #[arg(long, value_delimiter = ',', value_name = "A,B,...")]
    pub names: Vec<String>,
    /// The workload and server for `--policies`, as for `run` (no --out);
    /// `--json` prints the table as JSON.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Cluster settings: instances, admission, routing (flags override
/// `--policy-config`).
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// A policy bundle YAML (instances, admission, routing, signal
    /// freshness, scheduler).
    #[arg(long, value_name = "P.yaml")]
    pub policy_config: Option<PathBuf>,
    /// Instances in the cluster (default 1).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub num_instances: Option<u32>,
    /// Admission: always-admit, reject-all, token-bucket, rate-limit
    /// (tenant-quota in a --policy-config).
    #[arg(long, value_name = "POLICY", alias = "admission-policy")]
    pub admission: Option<String>,
    /// Token-bucket capacity, tokens.
    #[arg(allow_negative_numbers = true, long)]
    pub token_bucket_capacity: Option<f64>,
    /// Token-bucket refill rate, tokens/s.
    #[arg(allow_negative_numbers = true, long)]
    pub token_bucket_refill_rate: Option<f64>,
    /// Rate limit, requests/s.
    #[arg(allow_negative_numbers = true, long)]
    pub rate_limit_rps: Option<f64>,
    /// Rate-limit burst, requests.
    #[arg(allow_negative_numbers = true, long)]
    pub rate_limit_burst: Option<f64>,
    /// Routing: round-robin, least-loaded, weighted, always-busiest.
    #[arg(long, value_name = "POLICY", alias = "routing-policy")]
    pub routing: Option<String>,
    /// Scorers of `weighted` routing with weights (normalised), e.g.
    /// prefix-affinity:3,queue-depth:2,kv-utilization:2.
    #[arg(long, value_name = "NAME:W,...")]
    pub routing_scorers: Option<String>,
    /// What priority-fcfs orders by: slo-class (the SLO class's vLLM
    /// priority, the default), constant, slo-based (class score plus age,
    /// no starvation), inverted-slo (pathological).
    #[arg(long, value_name = "POLICY")]
    pub priority_policy: Option<String>,
    /// Refresh interval of queue depth, batch size and KV usage as the
    /// router sees them, µs (0: read at every decision).
    #[arg(allow_negative_numbers = true, long, value_name = "US")]
    pub snapshot_refresh_interval_us: Option<i64>,
    /// Hold admitted requests in a priority-ordered gateway queue and route
    /// them only while the cluster is not saturated.
    #[arg(long)]
    pub flow_control: bool,
    /// Flow control: queued requests per instance at saturation (default 4).
    #[arg(allow_negative_numbers = true, long)]
    pub flow_queue_depth_threshold: Option<f64>,
    /// Flow control: mean KV usage at saturation (default 0.9).
    #[arg(allow_negative_numbers = true, long)]
    pub flow_kv_threshold: Option<f64>,
    /// Time the admission decision takes, µs.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "US",
        alias = "admission-latency"
    )]
    pub admission_latency_us: Option<i64>,
    /// Time the routing decision takes, µs.
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "US",
        alias = "routing-latency"
    )]
    pub routing_latency_us: Option<i64>,
    /// `colocated` (default: every instance prefills and decodes) or `pd`:
    /// prefill/decode disaggregation, a prefill pool and a decode pool
    /// (--prefill-instances, --decode-instances) with the prompt's KV
    /// blocks moved between them.
    #[arg(long, value_name = "ARCH", value_parser = ["colocated", "pd"])]
    pub architecture: Option<String>,
    /// P/D: prefill instances (default 1).
    #[arg(allow_negative_numbers = true, long, value_name = "P")]
    pub prefill_instances: Option<u32>,
    /// P/D: decode instances (default 1).
    #[arg(allow_negative_numbers = true, long, value_name = "D")]
    pub decode_instances: Option<u32>,
    /// P/D: how a decode instance is chosen for a prefilled request
    /// (round-robin, least-loaded (default), weighted, always-busiest).
    #[arg(long, value_name = "POLICY")]
    pub decode_routing: Option<String>,
    /// P/D: fixed time of one KV transfer, µs (default 100).
    #[arg(allow_negative_numbers = true, long, value_name = "US")]
    pub pd_transfer_latency_us: Option<f64>,
    /// P/D: prefill-to-decode bandwidth, GB/s (default 50).
    #[arg(allow_negative_numbers = true, long, value_name = "GB/s")]
    pub pd_transfer_bandwidth: Option<f64>,
    /// CPU KV blocks per instance: a CPU tier under the GPU KV cache that
    /// keeps offloaded prefix-cache content (BLIS --kv-cpu-blocks; 0 or
    /// unset: GPU only).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub kv_cpu_blocks: Option<u32>,
    /// GPU KV usage (0..1) above which free cached GPU blocks are
    /// offloaded to the CPU tier (default 0.9; 0: always).
    #[arg(allow_negative_numbers = true, long, value_name = "F")]
    pub kv_offload_threshold: Option<f64>,
    /// When: `on-evict` (a block's content when the GPU reuses the block;
    /// the default) or `eager` (every free cached block at once, BLIS).
    #[arg(long, value_name = "POLICY")]
    pub kv_offload_policy: Option<crate::engine::kv_tier::OffloadPolicy>,
    /// Host↔device bandwidth of an instance for KV reloads, GB/s (default 32).
    #[arg(allow_negative_numbers = true, long, value_name = "GB/s")]
    pub kv_transfer_bandwidth: Option<f64>,
    /// Fixed time of one reload, µs (default 10).
    #[arg(
        allow_negative_numbers = true,
        long,
        value_name = "US",
        alias = "kv-transfer-base-latency"
    )]
    pub kv_transfer_base_latency_us: Option<f64>,
    /// Bytes of one KV block (default: layers × KV heads × head dim × 2 ×
    /// dtype bytes × block size, from the model's config).
    #[arg(allow_negative_numbers = true, long, value_name = "BYTES")]
    pub kv_block_bytes: Option<f64>,
    /// A block reloaded within this long of its offload counts as KV
    /// thrashing, µs (default 1000).
    #[arg(allow_negative_numbers = true, long, value_name = "US")]
    pub kv_thrashing_window_us: Option<i64>,
    /// Autoscaling: `threshold` (one replica up at --scale-up-threshold
    /// utilisation, one down at --scale-down-threshold) or
    /// `target-utilization` (HPA's proportional rule); --num-instances is
    /// the initial count.
    #[arg(long, value_name = "POLICY")]
    pub autoscaler: Option<ScalerArg>,
    /// Autoscaling: fewest replicas (default 1).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub autoscaler_min: Option<u32>,
    /// Autoscaling: most replicas holding a GPU (default 4).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub autoscaler_max: Option<u32>,
    /// Autoscaling: seconds between evaluations (default 15).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub autoscaler_interval_s: Option<f64>,
    /// Autoscaling: no scale-down within this long of a scale action, s;
    /// also the oscillation window (default 60).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub autoscaler_cooldown_s: Option<f64>,
    /// `threshold`: mean utilisation (larger of KV usage and running /
    /// max_num_seqs) that adds a replica (default 0.8).
    #[arg(allow_negative_numbers = true, long, value_name = "F")]
    pub scale_up_threshold: Option<f64>,
    /// `threshold`: mean requests queued per ready replica that also adds
    /// one (default 8).
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub scale_up_queue_depth: Option<f64>,
    /// `threshold`: mean utilisation at or below which one is removed
    /// (default 0.3).
    #[arg(allow_negative_numbers = true, long, value_name = "F")]
    pub scale_down_threshold: Option<f64>,
    /// `target-utilization`: the utilisation sized for (default 0.6).
    #[arg(allow_negative_numbers = true, long, value_name = "F")]
    pub target_utilization: Option<f64>,
    /// Autoscaling: from a scale-up to a node with the server started, s
    /// (default 30).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub provisioning_delay_s: Option<f64>,
    /// Autoscaling: loading the weights, s (default 0).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub model_load_s: Option<f64>,
    /// Autoscaling: warm-up before a new replica takes requests, s
    /// (default 60).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub warmup_s: Option<f64>,
    /// Autoscaling: what a replica removed does with its requests: `wait`
    /// (finish them; default), `immediate` (cut them off), `redirect`
    /// (route those still waiting elsewhere).
    #[arg(long, value_name = "POLICY")]
    pub drain_policy: Option<DrainArg>,
    /// `decisions`: write PREFIX.decisions.jsonl, one admission and
    /// routing decision per line with what the router saw, every
    /// candidate's score, the regret and the request's outcome.
    #[arg(long, default_value = "none", value_parser = ["none", "decisions"])]
    pub trace_level: String,
    /// Candidates kept per decision in the decision trace.
    #[arg(allow_negative_numbers = true, long, default_value_t = 3)]
    pub counterfactual_k: usize,
    /// One fitness from the metrics, e.g. throughput:0.5,p99_ttft:0.3,mean_e2e:0.2
    /// (`evaluate`'s default when none are given; `run` reports a fitness
    /// only with them).
    #[arg(long, value_name = "METRIC:W,...")]
    pub fitness_weights: Option<String>,
}

/// The latency models.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyChoice {
    /// Trained α/β coefficients from a coefficients file.
    Blackbox,
    /// Analytical roofline from the model's config.json and the GPU.
    Roofline,
    /// Physics terms of the model's config.json and the GPU with global
    /// fitted coefficients.
    TrainedPhysics,
    /// BLIS's trained-physics formula with its published coefficients.
    BlisPhysics,
    /// One server's measured step time per number of decoding requests
    /// (fitted from its own trace; llama.cpp on a CPU).
    StepTable,
}

impl LatencyChoice {
    /// The coefficients-file kind.
    pub fn kind(self) -> crate::latency::coefficients::LatencyKind {
        use crate::latency::coefficients::LatencyKind as K;
        match self {
            LatencyChoice::Blackbox => K::Blackbox,
            LatencyChoice::Roofline => K::Roofline,
            LatencyChoice::TrainedPhysics => K::TrainedPhysics,
            LatencyChoice::BlisPhysics => K::BlisPhysics,
            LatencyChoice::StepTable => K::StepTable,
        }
    }
}

/// `run` options.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Input: a trace header (PREFIX.yaml).
    #[arg(long, value_name = "H.yaml", group = "input")]
    pub trace: Option<PathBuf>,
    /// Input: a workload spec.
    #[arg(long, value_name = "W.yaml", group = "input")]
    pub workload_spec: Option<PathBuf>,
    /// Input: a public trace, KIND:PATH (mooncake, azure, inference-perf, vllm-gt).
    #[arg(long, value_name = "KIND:PATH", group = "input")]
    pub import: Option<ImportSource>,
    /// Output prefix (required by `run`).
    #[arg(long, value_name = "PREFIX", value_parser = blis_traces::bundle::output_prefix)]
    pub out: Option<PathBuf>,
    /// Model id (default: the trace header's server model).
    #[arg(long)]
    pub model: Option<String>,
    /// Latency model (default: blackbox when the coefficients file has a row
    /// for the model, GPU and TP; else trained-physics when it has a global
    /// row for the GPU and the model's config.json is known; else roofline).
    #[arg(long, value_enum)]
    pub latency_model: Option<LatencyChoice>,
    /// Coefficients file (default: the bundled one).
    #[arg(long, value_name = "C.yaml")]
    pub coefficients: Option<PathBuf>,
    /// The model's Hugging Face config.json, or a folder holding it
    /// (default: the bundled config matching --model).
    #[arg(long, value_name = "DIR_OR_FILE", alias = "model-config-folder")]
    pub model_config: Option<PathBuf>,
    /// GPU name in the hardware file (default: the trace header's, else H100).
    #[arg(long)]
    pub hardware: Option<String>,
    /// A hardware_config.json (default: the bundled one).
    #[arg(long, value_name = "FILE")]
    pub hardware_config: Option<PathBuf>,
    /// Tensor-parallel degree.
    #[arg(allow_negative_numbers = true, long)]
    pub tp: Option<u32>,
    /// Batch and KV-cache limits (vLLM's flags).
    #[command(flatten)]
    pub engine: EngineFlags,
    /// The client's timeout per request, seconds: every request is
    /// cancelled this long after its send (default: the trace header's
    /// `load_generator.timeout_s`; requests' own deadlines apply too).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub client_timeout_s: Option<f64>,

    /// Fraction of GPU memory for weights and KV cache, for the KV estimate
    /// (default: the trace header's, else vLLM's 0.9).
    #[arg(allow_negative_numbers = true, long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f64>,
    /// Wait-queue order: fcfs, priority-fcfs, sjf, reverse-priority.
    #[arg(long, default_value = "fcfs")]
    pub scheduler: crate::engine::queue_order::SchedulerPolicy,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Seed for generated or imported workloads.
    #[arg(allow_negative_numbers = true, long)]
    pub seed: Option<u64>,
    /// Workload horizon, seconds: only the requests that arrive before it
    /// (a spec's are generated up to it; a trace's later ones are left
    /// out).
    #[arg(allow_negative_numbers = true, long, value_name = "S")]
    pub horizon_s: Option<f64>,
    /// Stop generating or reading after this many requests.
    #[arg(allow_negative_numbers = true, long, value_name = "N")]
    pub num_requests: Option<u64>,
    /// A workload spec's total rate, requests/s (replaces its
    /// `aggregate_rate`, or a ServeGen spec's `servegen_data.aggregate_rate`
    /// and `rate_scale`).
    #[arg(allow_negative_numbers = true, long, value_name = "R")]
    pub aggregate_rate: Option<f64>,
    /// Time-series sample interval, ms (0: no time series; at most 2^53 µs
    /// in ms). After 100,000 samples it grows tenfold, and again after each
    /// 100,000 more, with a warning: a run that simulates days keeps its
    /// series to about 100 MB a tenfold.
    #[arg(
        allow_negative_numbers = true,
        long,
        default_value_t = 100,
        value_parser = clap::value_parser!(u64).range(0..=MAX_SAMPLE_INTERVAL_MS)
    )]
    pub sample_interval_ms: u64,
    /// Do not write the per-token ITL companion.
    #[arg(long)]
    pub no_itl: bool,
    /// Write the ITL companion as BLIS does, one row per token
    /// (`request_id,chunk_index,timestamp_us`), instead of the step form
    /// (`PREFIX.itl.csv` with one row per run of a request's tokens and
    /// `PREFIX.steps.csv` with the step end times; about 2% of the size,
    /// expanded to the same rows by every reader of this toolkit).
    #[arg(long, conflicts_with = "no_itl")]
    pub itl_rows: bool,
    /// Step one batch at a time (results are identical; slower).
    #[arg(long)]
    pub no_fast_forward: bool,
    /// Print the summary as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// SLOs to judge every request by: the summary's `slo` gives the
    /// attainment and the goodput (requests per second within every bound),
    /// e.g. ttft_ms=500,tpot_ms=50 (ttft_ms, tpot_ms, e2e_ms; vLLM's
    /// `--goodput` form ttft:500,tpot:50,e2el:10000 too).
    #[arg(long, value_name = "KEY=MS,...")]
    pub slo: Option<blis_traces::slo::Slo>,
    /// Cluster settings.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

impl ClusterArgs {
    /// Sets the P/D flags on the bundle's `pd:` section.
    fn apply_pd(&self, b: &mut PolicyBundle) -> Result<()> {
        let a = self;
        let others = a.prefill_instances.is_some()
            || a.decode_instances.is_some()
            || a.decode_routing.is_some()
            || a.pd_transfer_latency_us.is_some()
            || a.pd_transfer_bandwidth.is_some();
        match a.architecture.as_deref() {
            Some("colocated") => {
                if others {
                    return Err(CommandError::Usage(
                        "the P/D settings need --architecture pd".into(),
                    ));
                }
                b.pd = None;
                return Ok(());
            }
            None if !others => return Ok(()),
            None if b.pd.is_none() => {
                return Err(CommandError::Usage(
                    "the P/D settings need --architecture pd".into(),
                ));
            }
            _ => {}
        }
        let mut p = b.pd.clone().unwrap_or_default();
        if let Some(n) = a.prefill_instances {
            p.prefill_instances = n;
        }
        if let Some(n) = a.decode_instances {
            p.decode_instances = n;
        }
        if let Some(name) = &a.decode_routing {
            p.decode_routing = routing_policy(name).map_err(|_| {
                CommandError::Usage(format!(
                    "--decode-routing: unknown policy {name:?} (round-robin, least-loaded, weighted, always-busiest){}",
                    scorer_hint(name)
                ))
            })?;
        }
        if let Some(x) = a.pd_transfer_latency_us {
            p.transfer_latency_us = x;
        }
        if let Some(x) = a.pd_transfer_bandwidth {
            p.transfer_bandwidth_gb_s = x;
        }
        b.num_instances = p.prefill_instances + p.decode_instances;
        b.pd = Some(p);
        Ok(())
    }

    /// Sets the autoscaling flags on the bundle's `autoscale:` section.
    fn apply_autoscale(&self, b: &mut PolicyBundle) -> Result<()> {
        let a = self;
        let others = a.autoscaler_min.is_some()
            || a.autoscaler_max.is_some()
            || a.autoscaler_interval_s.is_some()
            || a.autoscaler_cooldown_s.is_some()
            || a.scale_up_threshold.is_some()
            || a.scale_up_queue_depth.is_some()
            || a.scale_down_threshold.is_some()
            || a.target_utilization.is_some()
            || a.provisioning_delay_s.is_some()
            || a.model_load_s.is_some()
            || a.warmup_s.is_some()
            || a.drain_policy.is_some();
        if a.autoscaler.is_none() && !others {
            return Ok(());
        }
        if a.autoscaler.is_none() && b.autoscale.is_none() {
            return Err(CommandError::Usage(
                "the autoscaling settings need --autoscaler threshold|target-utilization".into(),
            ));
        }
        let mut c = b.autoscale.clone().unwrap_or_default();
        if let Some(p) = a.autoscaler {
            c.policy = p.into();
        }
        macro_rules! set {
            ($($flag:ident => $field:ident),*) => {
                $(if let Some(x) = a.$flag { c.$field = x.into(); })*
            };
        }
        set!(
            autoscaler_min => min_replicas,
            autoscaler_max => max_replicas,
            autoscaler_interval_s => interval_s,
            autoscaler_cooldown_s => cooldown_s,
            scale_up_threshold => scale_up_threshold,
            scale_up_queue_depth => scale_up_queue_depth,
            scale_down_threshold => scale_down_threshold,
            target_utilization => target_utilization,
            provisioning_delay_s => provisioning_delay_s,
            model_load_s => model_load_s,
            warmup_s => warmup_s,
            drain_policy => drain
        );
        if a.autoscaler_max.is_none() && c.max_replicas < c.min_replicas {
            c.max_replicas = c.min_replicas;
        }
        b.autoscale = Some(c);
        Ok(())
    }

    /// Sets the CPU-tier flags on the bundle's `kv:` section.
    fn apply_kv_tier(&self, b: &mut PolicyBundle) -> Result<()> {
        let a = self;
        let others = a.kv_offload_threshold.is_some()
            || a.kv_offload_policy.is_some()
            || a.kv_transfer_bandwidth.is_some()
            || a.kv_transfer_base_latency_us.is_some()
            || a.kv_block_bytes.is_some()
            || a.kv_thrashing_window_us.is_some();
        if a.kv_cpu_blocks.is_none() && !others {
            return Ok(());
        }
        let mut k = b.kv.clone().unwrap_or_default();
        if let Some(n) = a.kv_cpu_blocks {
            k.cpu_blocks = n;
        }
        if let Some(x) = a.kv_offload_threshold {
            k.offload_threshold = x;
        }
        if let Some(x) = a.kv_offload_policy {
            k.offload_policy = x;
        }
        if let Some(x) = a.kv_transfer_bandwidth {
            k.transfer_bandwidth_gb_s = x;
        }
        if let Some(x) = a.kv_transfer_base_latency_us {
            k.transfer_base_latency_us = x;
        }
        if let Some(x) = a.kv_block_bytes {
            k.block_bytes = Some(x);
        }
        if let Some(x) = a.kv_thrashing_window_us {
            k.thrashing_window_us = x;
        }
        if a.kv_cpu_blocks.is_none() && b.kv.is_none() {
            // (An explicit --kv-cpu-blocks 0 turns the tier off, e.g. as one
            // point of a sweep.)
            return Err(CommandError::Usage(
                "the --kv-* tier settings need a CPU tier: give --kv-cpu-blocks N".into(),
            ));
        }
        b.kv = Some(k);
        Ok(())
    }

    /// The bundle of `--policy-config` (or the default), with the flags of
    /// these flags applied over it.
    ///
    /// # Errors
    /// An unreadable or invalid bundle, an unknown policy name, or a
    /// policy missing its parameters (named by flag).
    pub fn bundle(&self) -> Result<PolicyBundle> {
        let a = self;
        let mut b = match &a.policy_config {
            Some(p) => PolicyBundle::from_file(p)?,
            None => PolicyBundle::default(),
        };
        let bad = CommandError::Usage;
        if let Some(n) = a.num_instances {
            b.num_instances = n;
        }
        if let Some(name) = &a.admission {
            b.admission = self.admission_policy(name)?;
        }
        if let Some(name) = &a.routing {
            b.routing = routing_policy(name)?;
        }
        if let Some(sc) = &a.routing_scorers {
            let scorers =
                routing::parse_scorers(sc).map_err(|e| bad(format!("--routing-scorers: {e}")))?;
            match &mut b.routing {
                RoutingPolicy::Weighted { scorers: s } => *s = scorers.into_iter().collect(),
                _ if a.routing.is_none() => {
                    b.routing = RoutingPolicy::Weighted {
                        scorers: scorers.into_iter().collect(),
                    };
                }
                other => {
                    return Err(bad(format!(
                        "--routing-scorers applies to weighted routing, not {}",
                        other.name()
                    )));
                }
            }
        }
        if let Some(p) = &a.priority_policy {
            b.priority =
                PriorityPolicy::from_name(p).map_err(|e| bad(format!("--priority-policy: {e}")))?;
        }
        if let Some(r) = a.snapshot_refresh_interval_us {
            b.snapshot_refresh_interval_us = r;
        }
        if a.flow_control || a.flow_queue_depth_threshold.is_some() || a.flow_kv_threshold.is_some()
        {
            let mut f = b.flow_control.unwrap_or_default();
            if let Some(q) = a.flow_queue_depth_threshold {
                f.queue_depth_threshold = q;
            }
            if let Some(k) = a.flow_kv_threshold {
                f.kv_utilization_threshold = k;
            }
            b.flow_control = Some(f);
        }
        if let Some(l) = a.admission_latency_us {
            b.admission_latency_us = l;
        }
        if let Some(l) = a.routing_latency_us {
            b.routing_latency_us = l;
        }
        self.apply_kv_tier(&mut b)?;
        self.apply_pd(&mut b)?;
        self.apply_autoscale(&mut b)?;
        b.validate().map_err(ReplayError::from)?;
        Ok(b)
    }

    /// The admission policy `--admission name` with its flags.
    ///
    /// # Errors
    /// An unknown name, or a policy missing its flags (named).
    fn admission_policy(&self, name: &str) -> Result<AdmissionPolicy> {
        Ok(match name {
            "always-admit" => AdmissionPolicy::AlwaysAdmit,
            "reject-all" => AdmissionPolicy::RejectAll,
            "token-bucket" => AdmissionPolicy::TokenBucket {
                capacity: self.token_bucket_capacity.ok_or_else(|| {
                    CommandError::Usage(
                        "--admission token-bucket needs --token-bucket-capacity".into(),
                    )
                })?,
                refill_rate: self.token_bucket_refill_rate.ok_or_else(|| {
                    CommandError::Usage(
                        "--admission token-bucket needs --token-bucket-refill-rate".into(),
                    )
                })?,
            },
            "rate-limit" => AdmissionPolicy::RateLimit {
                rate: self.rate_limit_rps.ok_or_else(|| {
                    CommandError::Usage("--admission rate-limit needs --rate-limit-rps".into())
                })?,
                burst: self.rate_limit_burst.unwrap_or(1.0),
            },
            "tenant-quota" => {
                return Err(CommandError::Usage(
                    "--admission tenant-quota: give its quotas in a --policy-config".into(),
                ));
            }
            other => {
                return Err(CommandError::Usage(format!(
                    "--admission: unknown policy {other:?} (always-admit, reject-all, token-bucket, rate-limit, tenant-quota)"
                )));
            }
        })
    }
}

/// The routing policy `--routing name` (weighted: the default scorers).
///
/// # Errors
/// An unknown name.
fn routing_policy(name: &str) -> Result<RoutingPolicy> {
    Ok(match name {
        "round-robin" => RoutingPolicy::RoundRobin,
        "least-loaded" => RoutingPolicy::LeastLoaded,
        "always-busiest" => RoutingPolicy::AlwaysBusiest,
        "weighted" => RoutingPolicy::Weighted {
            scorers: routing::default_scorers().into_iter().collect(),
        },
        "code" => {
            return Err(CommandError::Usage(
                "--routing code: give the program in a --policy-config (routing: {policy: code, source: ...}; see the Clusters chapter)".into(),
            ));
        }
        "decision-tree" => {
            return Err(CommandError::Usage(
                "--routing decision-tree: give the tree in a --policy-config (routing: {policy: decision-tree, tree: ...}; see the Clusters chapter)".into(),
            ));
        }
        other => {
            return Err(CommandError::Usage(format!(
                "--routing: unknown policy {other:?} (round-robin, least-loaded, weighted, always-busiest, decision-tree, code){}",
                scorer_hint(other)
            )));
        }
    })
}

/// When `name` is a scorer rather than a policy: how to route by it.
fn scorer_hint(name: &str) -> String {
    match routing::Scorer::parse(name) {
        Ok(_) => format!(
            "; {name:?} is a scorer of the weighted policy: --routing weighted --routing-scorers {name}:3,queue-depth:2 (scorers: prefix-affinity, precise-prefix-cache, no-hit-lru, queue-depth, kv-utilization, load-balance)"
        ),
        Err(_) => String::new(),
    }
}

/// `--autoscaler` ([`ScalerKind`](crate::cluster::autoscale::ScalerKind)).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalerArg {
    /// One replica up or down at a utilisation threshold.
    Threshold,
    /// HPA's proportional rule.
    TargetUtilization,
}

impl From<ScalerArg> for crate::cluster::autoscale::ScalerKind {
    fn from(a: ScalerArg) -> Self {
        match a {
            ScalerArg::Threshold => Self::Threshold,
            ScalerArg::TargetUtilization => Self::TargetUtilization,
        }
    }
}

/// `--drain-policy` ([`DrainPolicy`](crate::cluster::autoscale::DrainPolicy)).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainArg {
    /// Finish the requests it has.
    Wait,
    /// Cut them off at once.
    Immediate,
    /// Route those still waiting elsewhere.
    Redirect,
}

impl From<DrainArg> for crate::cluster::autoscale::DrainPolicy {
    fn from(a: DrainArg) -> Self {
        match a {
            DrainArg::Wait => Self::Wait,
            DrainArg::Immediate => Self::Immediate,
            DrainArg::Redirect => Self::Redirect,
        }
    }
}
